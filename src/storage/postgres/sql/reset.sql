-- Resets and releases, from SQL as from the service: the one statement
-- that puts buckets back to full and tells every instance.

-- Puts the buckets of `keys` back to full: no row is a full bucket for
-- every algorithm. Lockouts go too (a reset is a fresh start); an
-- operator's block stays. The leases holding slots in them end first: a
-- lease whose slot another may now take must not be renewed or released.
-- Bumps the actions generation and notifies pglimit_actions, on commit,
-- so that every instance forgets the denials it remembers of these keys
-- (listener.rs reads the payload: '<generation> <hex key>,...', or
-- '<generation> *' past 100 keys). Returns the generation.
CREATE FUNCTION pglimit_reset_keys(keys bytea[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE g bigint;
BEGIN
    PERFORM pglimit_end_leases(keys);
    DELETE FROM pglimit_buckets WHERE key = ANY (keys);
    DELETE FROM pglimit_blocks WHERE key = ANY (keys) AND kind = 'lockout';
    UPDATE pglimit_actions a SET generation = a.generation + 1 RETURNING a.generation INTO g;
    PERFORM pg_notify('pglimit_actions', g || ' ' || CASE WHEN cardinality(keys) > 100 THEN '*'
        ELSE coalesce((SELECT string_agg(encode(k, 'hex'), ',' ORDER BY o) FROM unnest(keys) WITH ORDINALITY AS u(k, o)), '') END);
    RETURN g;
END
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

-- Frees a lease's slots by the id a check answered: true if it held any,
-- false if it was released already or has ended, NULL if there is no such
-- lease (leases.sql's pglimit_release). Refused in Citus mode, as checks
-- are: it grants no lease, and the leases' lookup cannot be planned there.
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
