-- A named policy decided in SQL, as POST /check decides it: what
-- pglimit.check (interface.sql) calls. The policies come compiled from
-- pglimit_policies and the key secret as HMAC pads from pglimit_key_secret,
-- both written by the service (`limiter/compiled.rs`). Every refusal of
-- /check is an error here: SQLSTATE 22023 (invalid_parameter_value), the
-- message /check's problem document gives, the field at fault in COLUMN.
-- These functions run with their caller's rights: called directly by a
-- role that may not read the secret, they fail.

-- Citus mode decides on the workers, each shard's buckets in a statement
-- of its own (citus/): a check made here, in a caller's transaction on the
-- coordinator, would neither lock in key order across shards nor take its
-- leases, so it is refused rather than decided differently.
CREATE FUNCTION pglimit_sql_refused_on_citus() RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
            INTO distributed USING to_regclass('pglimit_buckets');
    END IF;
    IF distributed THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = 'pglimit''s SQL functions are not offered in Citus mode (PGLIMIT_CITUS)',
            HINT = 'Citus mode decides each shard''s buckets on its worker, outside any caller''s transaction; check through POST /check';
    END IF;
END
$$;

-- The secret's pads, or an error saying how to write them.
CREATE FUNCTION pglimit_sql_pads(OUT inner_pad bytea, OUT outer_pad bytea) LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT s.inner_pad, s.outer_pad INTO inner_pad, outer_pad FROM pglimit_key_secret s WHERE s.id = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'pglimit has no key secret in this database',
            HINT = 'start pglimit serve with PGLIMIT_SQL=on against it, or run pglimit policies push FILE as its owner';
    END IF;
END
$$;

-- A refusal of a check's input, as /check's problem documents word it.
CREATE FUNCTION pglimit_sql_invalid(field text, message text, hint text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = field, MESSAGE = message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = field, MESSAGE = message, HINT = hint;
END
$$;

-- Policy `p_policy` as compiled, or a refusal naming it.
CREATE FUNCTION pglimit_sql_policy(p_policy text) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE def jsonb;
BEGIN
    SELECT p.definition INTO def FROM pglimit_policies p WHERE p.name = p_policy;
    IF def IS NULL THEN
        PERFORM pglimit_sql_invalid('policy', format('no policy named %s is configured', to_json(p_policy)),
            format('policies in this database: %s',
                   coalesce((SELECT string_agg(p.name, ', ' ORDER BY p.name) FROM pglimit_policies p), 'none')));
    END IF;
    RETURN def;
END
$$;

-- A cost in /check's range (check_cost_range in src/limiter/request.rs).
CREATE FUNCTION pglimit_sql_cost_range(cost bigint) RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cost IS NULL OR cost < 0 OR cost > 1000000000 THEN
        PERFORM pglimit_sql_invalid('cost', 'cost must be between 0 and 1000000000');
    END IF;
END
$$;

-- A cost bucket `bucket` of limit `lim` could ever admit (check_cost_fits).
CREATE FUNCTION pglimit_sql_cost_fits(cost bigint, lim bigint, bucket text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cost > lim THEN
        PERFORM pglimit_sql_invalid('cost', format(
            'cost %s exceeds the limit %s of bucket %s, so it could never be allowed', cost, lim, to_json(bucket)));
    END IF;
END
$$;

-- A cost /check accepts for every bucket of `def`.
CREATE FUNCTION pglimit_sql_cost(def jsonb, cost bigint) RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE b jsonb;
BEGIN
    PERFORM pglimit_sql_cost_range(cost);
    FOR b IN SELECT jsonb_array_elements(def -> 'buckets') LOOP
        PERFORM pglimit_sql_cost_fits(cost, (b ->> 'limit')::bigint, b ->> 'name');
    END LOOP;
END
$$;

-- Refuses `given` unless it is a JSON object naming only identifiers
-- `def` declares (the first unknown one in name order named).
CREATE FUNCTION pglimit_sql_known(p_policy text, def jsonb, given jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE n text;
BEGIN
    IF given IS NULL OR jsonb_typeof(given) <> 'object' THEN
        PERFORM pglimit_sql_invalid('identifiers', 'identifiers must be a JSON object of identifier names to strings');
    END IF;
    SELECT k INTO n FROM jsonb_object_keys(given) AS k WHERE NOT (def -> 'identifiers') ? k ORDER BY k LIMIT 1;
    IF n IS NOT NULL THEN
        PERFORM pglimit_sql_invalid('identifiers.' || n, format('%s is not an identifier of policy %s (expected: %s)',
            to_json(n), to_json(p_policy),
            (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(def -> 'identifiers') AS k)));
    END IF;
END
$$;

-- The normalised value of every identifier `def` declares, from `given`
-- (a JSON object of strings): an unknown one refused first, then a
-- missing or malformed one, each in name order, as /check refuses them.
CREATE FUNCTION pglimit_sql_values(p_policy text, def jsonb, given jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE vals jsonb := '{}'; n text; kind text; raw jsonb;
BEGIN
    PERFORM pglimit_sql_known(p_policy, def, given);
    FOR n, kind IN SELECT e.key, e.value #>> '{}' FROM jsonb_each(def -> 'identifiers') AS e ORDER BY e.key LOOP
        raw := given -> n;
        IF raw IS NULL THEN
            PERFORM pglimit_sql_invalid('identifiers.' || n,
                format('identifier %s is required by policy %s', to_json(n), to_json(p_policy)));
        ELSIF jsonb_typeof(raw) <> 'string' THEN
            PERFORM pglimit_sql_invalid('identifiers.' || n, format('identifier %s must be a string', to_json(n)));
        END IF;
        vals := vals || jsonb_build_object(n, pglimit_normalise(kind, n, raw #>> '{}'));
    END LOOP;
    RETURN vals;
END
$$;

-- Whether every pattern of `pats` (identifier → pattern as stored:
-- "hmac:<hex>" for an exact value, "*@domain", or a CIDR) matches `vals`.
CREATE FUNCTION pglimit_sql_matches(p_policy text, pats jsonb, vals jsonb, inner_pad bytea, outer_pad bytea)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE w record;
BEGIN
    FOR w IN SELECT e.key AS name, e.value AS pat FROM jsonb_each_text(pats) AS e LOOP
        IF NOT coalesce(CASE
            WHEN w.pat LIKE 'hmac:%' THEN decode(substr(w.pat, 6), 'hex')
                = pglimit_override_value_key(inner_pad, outer_pad, p_policy, w.name, vals ->> w.name)
            WHEN w.pat LIKE '*@%' THEN pglimit_email_at(vals ->> w.name, substr(w.pat, 3))
            ELSE pglimit_ip_in(vals ->> w.name, w.pat) END, false) THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- The override that applies, as src/limiter/checks/plan.rs chooses: of the
-- API's in force, the newest deny or else the newest; of the file's, the
-- first deny or else the first; the file's deny beats an API override
-- that is not one, and otherwise the API's wins.
CREATE FUNCTION pglimit_sql_override(
    p_policy text, def jsonb, vals jsonb, inner_pad bytea, outer_pad bytea, at timestamptz,
    OUT matched jsonb, OUT action text, OUT limits jsonb
) LANGUAGE plpgsql STABLE AS $$
DECLARE api record; f_idx bigint; f_action text; f_limits jsonb;
BEGIN
    SELECT o.id, o.action, o.limits INTO api FROM pglimit_overrides o
    WHERE o.policy = p_policy AND (o.until IS NULL OR o.until > at)
      AND pglimit_sql_matches(p_policy, o.match, vals, inner_pad, outer_pad)
    ORDER BY o.action <> 'deny', o.created_at DESC, o.id DESC LIMIT 1;
    IF jsonb_array_length(def -> 'overrides') > 0 THEN
        SELECT e.o - 1, e.v ->> 'action', e.v -> 'limits' INTO f_idx, f_action, f_limits
        FROM jsonb_array_elements(def -> 'overrides') WITH ORDINALITY AS e(v, o)
        WHERE pglimit_sql_matches(p_policy, e.v -> 'when', vals, inner_pad, outer_pad)
        ORDER BY e.v ->> 'action' <> 'deny', e.o LIMIT 1;
    END IF;
    IF api.id IS NOT NULL AND NOT (f_action IS NOT DISTINCT FROM 'deny' AND api.action <> 'deny') THEN
        matched := jsonb_build_object('id', api.id, 'action', api.action);
        action := api.action;
        limits := api.limits;
    ELSIF f_action IS NOT NULL THEN
        matched := jsonb_build_object('index', f_idx, 'action', f_action);
        action := f_action;
        limits := f_limits;
    END IF;
END
$$;

-- The buckets a check of `p_policy` takes, each keyed as the service keys
-- it (src/limiter/key.rs) and at the limit a matching override gives it
-- (capped at its algorithm's largest, as Policy::limit_for does).
CREATE FUNCTION pglimit_sql_buckets(
    p_policy text, def jsonb, vals jsonb, inner_pad bytea, outer_pad bytea, over_limits jsonb
) RETURNS TABLE (
    name text, algorithm text, key bytea, lim bigint, window_ms bigint, algo smallint, block_ms bigint,
    zone text, lease_life_ms bigint, shown jsonb
) LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN QUERY
    SELECT b.v ->> 'name', b.v ->> 'algorithm',
           pglimit_policy_key(inner_pad, outer_pad, p_policy, b.v ->> 'name', b.v ->> 'algorithm',
                              ARRAY(SELECT vals ->> f.name
                                    FROM jsonb_array_elements_text(b.v -> 'on') WITH ORDINALITY AS f(name, i)
                                    ORDER BY f.i)),
           CASE WHEN over_limits ? (b.v ->> 'name')
                THEN least((over_limits ->> (b.v ->> 'name'))::bigint, (b.v ->> 'max_limit')::bigint)
                ELSE (b.v ->> 'limit')::bigint END,
           (b.v ->> 'window_ms')::bigint, (b.v ->> 'code')::smallint, (b.v ->> 'block_for_ms')::bigint,
           b.v ->> 'zone', (def ->> 'max_lease_life_ms')::bigint,
           (SELECT jsonb_object_agg(f.name, vals ->> f.name) FROM jsonb_array_elements_text(b.v -> 'on') AS f(name)
            WHERE coalesce(def -> 'shown', '[]') ? f.name)
    FROM jsonb_array_elements(def -> 'buckets') WITH ORDINALITY AS b(v, i) ORDER BY b.i;
END
$$;

-- A check of policy `p_policy` over `p_identifiers`, taking `p_cost` from
-- every bucket or from none, at `p_now` (the transaction's now() when NULL;
-- the tests replay traces at chosen times).
CREATE FUNCTION pglimit_sql_check(p_policy text, p_identifiers jsonb, p_cost bigint, p_now timestamptz DEFAULT NULL)
RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE
    def jsonb; pads record; vals jsonb; o record; bs record; v_now timestamptz := coalesce(p_now, now());
BEGIN
    PERFORM pglimit_sql_refused_on_citus();
    def := pglimit_sql_policy(p_policy);
    vals := pglimit_sql_values(p_policy, def, p_identifiers);
    PERFORM pglimit_sql_cost(def, p_cost);
    pads := pglimit_sql_pads();
    o := pglimit_sql_override(p_policy, def, vals, pads.inner_pad, pads.outer_pad, v_now);
    SELECT array_agg(b.name) AS names, array_agg(b.algorithm) AS algorithms, array_agg(b.key) AS keys,
           array_agg(b.lim) AS limits, array_agg(b.window_ms) AS windows, array_agg(b.algo) AS algos,
           array_agg(b.block_ms) AS blocks, array_agg(b.zone) AS zones, array_agg(b.lease_life_ms) AS lives,
           array_agg(b.shown) AS shown
    INTO bs FROM pglimit_sql_buckets(p_policy, def, vals, pads.inner_pad, pads.outer_pad, o.limits) AS b;
    RETURN QUERY SELECT * FROM pglimit_sql_decide(
        p_policy, bs.names, bs.algorithms, bs.keys, bs.limits, bs.windows, bs.algos, bs.blocks, bs.zones,
        bs.lives, bs.shown, p_cost, o.action, o.matched, coalesce((def ->> 'shadow')::boolean, false), v_now);
END
$$;
