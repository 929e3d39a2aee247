-- Acting on limits, from SQL as from the service: resets, an operator's
-- blocks, releases, each written once and announced to every instance.

-- Bumps the actions generation and notifies pglimit_actions, in the
-- caller's transaction (so on commit, and only then), that `keys` changed:
-- every instance forgets the denials it remembers of them. listener.rs
-- reads the payload: '<generation> <hex key>,...', or '<generation> *'
-- past 100 keys (MAX_KEYS_NAMED). Returns the generation.
CREATE FUNCTION pglimit_announce(keys bytea[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE g bigint;
BEGIN
    UPDATE pglimit_actions a SET generation = a.generation + 1 RETURNING a.generation INTO g;
    PERFORM pg_notify('pglimit_actions', g || ' ' || CASE WHEN cardinality(keys) > 100 THEN '*'
        ELSE coalesce((SELECT string_agg(encode(k, 'hex'), ',' ORDER BY o) FROM unnest(keys) WITH ORDINALITY AS u(k, o)), '') END);
    RETURN g;
END
$$;

-- Puts the buckets of `keys` back to full, for POST /reset and
-- pglimit.reset alike: no row is a full bucket for every algorithm.
-- Lockouts go too (a reset is a fresh start); an operator's block stays.
-- The leases holding slots in them end first: a lease whose slot another
-- may now take must not be renewed or released. Then announced.
CREATE FUNCTION pglimit_reset_keys(keys bytea[]) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pglimit_end_leases(keys);
    DELETE FROM pglimit_buckets WHERE key = ANY (keys);
    DELETE FROM pglimit_blocks WHERE key = ANY (keys) AND kind = 'lockout';
    RETURN pglimit_announce(keys);
END
$$;

-- An operator's block on `keys` (each of bucket `buckets[i]` of policy
-- `policies[i]`) for `ms` milliseconds, replacing whatever block a key
-- had; returns when each ends. Its caller announces it.
CREATE FUNCTION pglimit_block_keys(keys bytea[], ms bigint, policies text[], buckets text[], reason text)
RETURNS SETOF timestamptz LANGUAGE sql AS $$
    INSERT INTO pglimit_blocks AS k (key, until, kind, policy, bucket, reason)
    SELECT t.key, now() + ms * interval '1 millisecond', 'admin', t.policy, t.bucket, reason
    FROM unnest(keys, policies, buckets) AS t(key, policy, bucket)
    ORDER BY t.key
    ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, kind = 'admin', policy = EXCLUDED.policy,
        bucket = EXCLUDED.bucket, reason = EXCLUDED.reason, created_at = now()
    RETURNING until
$$;

-- Resets the buckets `p_buckets` (every one when NULL) of a check of
-- `p_policy` over `p_identifiers`, refused as the check would be; answers
-- a peek taken after, as POST /reset does.
CREATE FUNCTION pglimit_sql_reset(p_policy text, p_identifiers jsonb, p_buckets text[])
RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE def jsonb; vals jsonb; pads record; unknown text;
BEGIN
    PERFORM pglimit_sql_refused_on_citus();
    def := pglimit_sql_policy(p_policy);
    vals := pglimit_sql_values(p_policy, def, p_identifiers);
    SELECT x INTO unknown FROM unnest(p_buckets) AS x
    WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(def -> 'buckets') AS b WHERE b ->> 'name' = x) LIMIT 1;
    IF unknown IS NOT NULL THEN
        PERFORM pglimit_sql_invalid('buckets', format('%s is not a bucket of policy %s', to_json(unknown), to_json(p_policy)));
    END IF;
    pads := pglimit_sql_pads();
    PERFORM pglimit_reset_keys(ARRAY(
        SELECT b.key FROM pglimit_sql_buckets(p_policy, def, vals, pads.inner_pad, pads.outer_pad, NULL) AS b
        WHERE p_buckets IS NULL OR b.name = ANY (p_buckets) ORDER BY b.key));
    RETURN QUERY SELECT * FROM pglimit_sql_check(p_policy, p_identifiers, 0);
END
$$;

-- Resets an ad hoc key's bucket, refused as its check would be; answers
-- a peek taken after, as POST /reset does.
CREATE FUNCTION pglimit_sql_adhoc_reset(
    p_key text, p_limit bigint, p_window text, p_algorithm text, p_timezone text
) RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE pads record;
BEGIN
    PERFORM pglimit_sql_adhoc_check(p_key, p_limit, p_window, p_algorithm, 0, p_timezone);
    pads := pglimit_sql_pads();
    PERFORM pglimit_reset_keys(ARRAY[pglimit_adhoc_key(pads.inner_pad, pads.outer_pad, p_key, p_algorithm)]);
    RETURN QUERY SELECT * FROM pglimit_sql_adhoc_check(p_key, p_limit, p_window, p_algorithm, 0, p_timezone);
END
$$;

-- The normalised values of the identifiers given, which may be only some
-- of the policy's (a block names what it blocks); an unknown one refused.
CREATE FUNCTION pglimit_sql_some_values(p_policy text, def jsonb, given jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pglimit_sql_known(p_policy, def, given);
    RETURN pglimit_sql_values(p_policy, jsonb_build_object('identifiers',
        (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each(def -> 'identifiers') AS e
         WHERE given ? e.key)), given);
END
$$;

-- The buckets an operator's act on `given` of `p_policy` names, as
-- limiter/actions.rs chooses them: every bucket counting over only the
-- identifiers given (or the one named `p_bucket`). Returns keys, names.
CREATE FUNCTION pglimit_sql_targets(p_policy text, given jsonb, p_bucket text, OUT keys bytea[], OUT names text[])
LANGUAGE plpgsql AS $$
DECLARE def jsonb := pglimit_sql_policy(p_policy); vals jsonb; pads record; missing text;
BEGIN
    vals := coalesce(pglimit_sql_some_values(p_policy, def, given), '{}');
    IF p_bucket IS NOT NULL AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(def -> 'buckets') AS b
                                            WHERE b ->> 'name' = p_bucket) THEN
        PERFORM pglimit_sql_invalid('bucket', format('%s is not a bucket of policy %s', to_json(p_bucket), to_json(p_policy)));
    END IF;
    pads := pglimit_sql_pads();
    SELECT array_agg(b.key ORDER BY b.key), array_agg(b.name ORDER BY b.key) INTO keys, names
    FROM pglimit_sql_buckets(p_policy, def, vals, pads.inner_pad, pads.outer_pad, NULL) AS b
    WHERE b.key IS NOT NULL AND (p_bucket IS NULL OR b.name = p_bucket);
    IF keys IS NULL THEN
        SELECT f INTO missing FROM jsonb_array_elements(def -> 'buckets') AS b, jsonb_array_elements_text(b -> 'on') AS f
        WHERE (p_bucket IS NULL OR b ->> 'name' = p_bucket) AND NOT vals ? f LIMIT 1;
        PERFORM pglimit_sql_invalid('identifiers.' || missing,
            format('identifier %s is required by policy %s', to_json(missing), to_json(p_policy)));
    END IF;
END
$$;

-- The audit row of an act from SQL, as limiter/actions.rs words one:
-- the actor is the calling role, keys only by their prefixes.
CREATE FUNCTION pglimit_sql_audit(action text, p_policy text, keys bytea[], names text[], detail jsonb)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO pglimit_audit (actor, action, target, detail)
    VALUES ('sql:' || session_user, action, p_policy || '/' || array_to_string(names, ','),
            detail || jsonb_build_object('keys', (SELECT jsonb_agg(jsonb_build_object('bucket', n, 'key', encode(substr(k, 1, 8), 'hex')))
                                                  FROM unnest(keys, names) AS u(k, n))))
$$;

-- Blocks the buckets of `given` for `p_for` (100ms to 366d), audited and
-- announced, as POST /admin/blocks does; returns when the block ends.
CREATE FUNCTION pglimit_sql_block(p_policy text, given jsonb, p_for interval, p_reason text, p_bucket text)
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE t record; ms numeric := extract(epoch FROM p_for) * 1000; until timestamptz;
BEGIN
    PERFORM pglimit_sql_refused_on_citus();
    IF ms IS NULL OR ms < 100 OR ms > 366 * 86400000::numeric THEN
        PERFORM pglimit_sql_invalid('for', format('for %s (a duration from 100ms to 366d)', coalesce(p_for::text, 'NULL')));
    END IF;
    IF octet_length(p_reason) > 500 THEN
        PERFORM pglimit_sql_invalid('reason', 'reason must be at most 500 bytes');
    END IF;
    t := pglimit_sql_targets(p_policy, given, p_bucket);
    SELECT max(u) INTO until FROM pglimit_block_keys(t.keys, ms::bigint, array_fill(p_policy, ARRAY[cardinality(t.keys)]), t.names, p_reason) AS u;
    PERFORM pglimit_sql_audit('block', p_policy, t.keys, t.names, jsonb_build_object(
        'for', p_for::text, 'reason', p_reason, 'until', pglimit_sql_time(until)));
    PERFORM pglimit_announce(t.keys);
    RETURN until;
END
$$;

-- Lifts every block on the buckets of `given`, audited and announced;
-- returns how many there were.
CREATE FUNCTION pglimit_sql_unblock(p_policy text, given jsonb, p_bucket text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE t record; lifted bigint;
BEGIN
    PERFORM pglimit_sql_refused_on_citus();
    t := pglimit_sql_targets(p_policy, given, p_bucket);
    DELETE FROM pglimit_blocks WHERE key = ANY (t.keys);
    GET DIAGNOSTICS lifted = ROW_COUNT;
    PERFORM pglimit_sql_audit('unblock', p_policy, t.keys, t.names, jsonb_build_object('lifted', lifted));
    PERFORM pglimit_announce(t.keys);
    RETURN lifted;
END
$$;

-- Frees a lease's slots by the id a check answered: true if it held any,
-- false if it was released already or has ended, NULL if there is no such
-- lease (leases.sql's pglimit_release).
CREATE FUNCTION pglimit_sql_release(p_lease text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pglimit_sql_refused_on_citus();
    IF p_lease IS NULL OR p_lease !~ '^lease_[0-9a-f]{32}$' THEN
        PERFORM pglimit_sql_invalid('lease',
            'lease must be a lease id as a check answered it ("lease_" and 32 hex digits)');
    END IF;
    RETURN pglimit_release(sha256(convert_to(p_lease, 'UTF8')));
END
$$;

-- An answer, or for pglimit.enforce a denial raised as SQLSTATE RL429
-- with the answer's figures as JSON in its DETAIL.
CREATE FUNCTION pglimit_sql_enforced(a pglimit_sql_answer, what text) RETURNS SETOF pglimit_sql_answer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT a.allowed THEN
        RAISE EXCEPTION USING ERRCODE = 'RL429',
            MESSAGE = format('rate limited: %s denied by %s', what,
                coalesce((SELECT string_agg(b ->> 'name', ', ') FROM jsonb_array_elements(a.buckets) AS b
                          WHERE NOT (b ->> 'allowed')::boolean), 'its buckets')),
            DETAIL = jsonb_strip_nulls(jsonb_build_object('retry_after_s', a.retry_after_s,
                'reset_at', pglimit_sql_time(a.reset_at), 'limit', a."limit", 'remaining', a.remaining,
                'blocked_by', a.blocked_by, 'override', a."override", 'buckets', a.buckets))::text,
            HINT = CASE WHEN a.retry_after_s IS NULL THEN 'this check is refused whenever it is made'
                        ELSE format('retry after %s s', a.retry_after_s) END;
    END IF;
    RETURN NEXT a;
END
$$;
