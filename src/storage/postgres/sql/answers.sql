-- What a check made from SQL answers: the fields of /check's JSON body,
-- decided by pglimit_check_batch (batch.sql) and put together as
-- src/limiter/checks/decision.rs and mod.rs put them: a deny list refuses
-- without counting, an allow list only peeks for blocks, the headline
-- bucket, retry_after_s, the lease, shadow mode.

CREATE TYPE pglimit_sql_answer AS (
    allowed          boolean,
    "limit"          bigint,
    remaining        bigint,
    reset_at         timestamptz,
    retry_after_s    bigint,
    buckets          jsonb,
    would_allow      boolean,
    blocked_by       text,
    "override"       jsonb,
    lease            text,
    lease_expires_at timestamptz
);

-- A time as the HTTP answers write it: RFC 3339, milliseconds, UTC.
-- STABLE as to_char is, so that the planner inlines it.
CREATE FUNCTION pglimit_sql_time(at timestamptz) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE
RETURN to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');

-- Whole seconds from `since` to `until`, rounded up from whole
-- milliseconds, at least 1 (seconds_until in decision.rs, and its max(1)).
CREATE FUNCTION pglimit_sql_retry_after(since timestamptz, until timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest((greatest(pglimit_us(until) - pglimit_us(since), 0) / 1000 + 999) / 1000, 1);

-- A new lease id (128 random bits, as limiter/leases.rs mints them) from
-- two random UUIDs (244 random bits), without pgcrypto.
CREATE FUNCTION pglimit_sql_lease_id() RETURNS text LANGUAGE sql VOLATILE
RETURN 'lease_' || encode(substr(sha256(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())), 1, 16), 'hex');

-- Decides one check of the buckets given (arrays, one entry per bucket)
-- and answers it; a denial is counted for the top list. `action` is the
-- matching override's, if any; `shown`, what the top list keeps of each
-- bucket's identifiers.
CREATE FUNCTION pglimit_sql_decide(
    p_policy text, names text[], algorithms text[], keys bytea[], limits bigint[], windows bigint[],
    algos smallint[], blocks bigint[], zones text[], lives bigint[], shown jsonb[], cost bigint, action text,
    matched jsonb, shadow boolean, v_now timestamptz
) RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE
    n integer := cardinality(keys); lease_id text; leases bytea[]; a pglimit_sql_answer;
    al boolean[]; rem bigint[]; rs timestamptz[]; re timestamptz[]; bl boolean[];
BEGIN
    IF action = 'deny' THEN
        al := array_fill(false, ARRAY[n]); rem := array_fill(0::bigint, ARRAY[n]);
        rs := array_fill(v_now, ARRAY[n]); re := array_fill(NULL::timestamptz, ARRAY[n]);
        bl := array_fill(false, ARRAY[n]);
    ELSE
        IF action IS DISTINCT FROM 'unlimited' AND cost > 0 AND pglimit_concurrency() = ANY (algos) THEN
            lease_id := pglimit_sql_lease_id();
            leases := array_fill(sha256(convert_to(lease_id, 'UTF8')), ARRAY[n]);
        END IF;
        SELECT array_agg(c.o_allowed ORDER BY c.o_pos), array_agg(c.o_remaining ORDER BY c.o_pos),
               array_agg(c.o_reset_at ORDER BY c.o_pos), array_agg(c.o_retry_at ORDER BY c.o_pos),
               array_agg(c.o_blocked ORDER BY c.o_pos)
        INTO al, rem, rs, re, bl
        FROM pglimit_check_batch(array_fill(1, ARRAY[n]), keys, limits, windows, algos,
                                 array_fill(CASE WHEN action = 'unlimited' THEN 0 ELSE cost END, ARRAY[n]),
                                 blocks, ARRAY(SELECT p_policy || '/' || x FROM unnest(names) AS x),
                                 v_now, zones, leases, lives) AS c;
        IF action = 'unlimited' THEN
            -- Admitted uncounted, unless a block names one of its keys.
            IF true = ANY (bl) THEN
                al := ARRAY(SELECT x.a OR NOT x.b FROM unnest(al, bl) AS x(a, b));
                re := ARRAY(SELECT CASE WHEN x.b THEN x.r END FROM unnest(re, bl) AS x(r, b));
            ELSE
                al := array_fill(true, ARRAY[n]); rem := limits; rs := array_fill(v_now, ARRAY[n]);
                re := array_fill(NULL::timestamptz, ARRAY[n]);
            END IF;
        END IF;
    END IF;
    SELECT * INTO a FROM pglimit_sql_answer_of(names, algorithms, limits, windows, algos, al, rem, rs, re, bl,
                                               action, matched, shadow, lease_id, v_now);
    IF NOT a.allowed THEN
        PERFORM pglimit_sql_count_denials(p_policy, keys, names, al, shown, v_now);
    END IF;
    RETURN NEXT a;
END
$$;

-- Counts each bucket that denied a refused check for the top list
-- (GET /admin/top), in the minute it was answered, as the service's
-- instances add theirs (limiter/denials/): a shadow policy's denial was
-- answered as allowed and is not counted.
CREATE FUNCTION pglimit_sql_count_denials(
    p_policy text, keys bytea[], names text[], al boolean[], shown jsonb[], v_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pglimit_denials AS d (minute, key, policy, bucket, shown, count)
    SELECT date_trunc('minute', v_now), u.k, p_policy, u.n, u.s, 1
    FROM unnest(keys, names, al, shown) AS u(k, n, a, s) WHERE NOT u.a ORDER BY u.k
    ON CONFLICT (key, minute) DO UPDATE SET count = d.count + 1, shown = coalesce(excluded.shown, d.shown);
END
$$;

-- The answer to a check whose buckets answered al, rem, rs (reset), re
-- (retry) and bl (blocked): the headline is, of the denying buckets, the
-- one to wait for longest (the last on a tie), or else the one with the
-- least remaining (the later reset, then the first).
CREATE FUNCTION pglimit_sql_answer_of(
    names text[], algorithms text[], limits bigint[], windows bigint[], algos smallint[], al boolean[],
    rem bigint[], rs timestamptz[], re timestamptz[], bl boolean[], action text, matched jsonb, shadow boolean,
    lease_id text, v_now timestamptz
) RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE a pglimit_sql_answer; h integer; granted boolean;
BEGIN
    a.allowed := NOT (false = ANY (al));
    SELECT x.i INTO h FROM unnest(al, rem, rs, re) WITH ORDINALITY AS x(al, rem, rs, re, i)
    WHERE a.allowed OR NOT x.al
    ORDER BY CASE WHEN a.allowed THEN x.rem END, CASE WHEN a.allowed THEN x.rs END DESC,
             CASE WHEN NOT a.allowed THEN coalesce(x.re, x.rs) END DESC,
             CASE WHEN a.allowed THEN x.i ELSE -x.i END
    LIMIT 1;
    a."limit" := limits[h]; a.remaining := rem[h]; a.reset_at := rs[h];
    IF NOT a.allowed AND action IS DISTINCT FROM 'deny' THEN
        a.retry_after_s := pglimit_sql_retry_after(v_now, coalesce(re[h], rs[h]));
    END IF;
    a.blocked_by := names[array_position(bl, true)];
    a."override" := matched;
    a.buckets := (SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                      'name', x.n, 'algorithm', x.alg, 'allowed', x.al, 'limit', x.l, 'remaining', x.r,
                      'reset_at', pglimit_sql_time(x.rs), 'blocked', CASE WHEN x.b THEN true END)) ORDER BY x.i)
                  FROM unnest(names, algorithms, al, limits, rem, rs, bl) WITH ORDINALITY AS x(n, alg, al, l, r, rs, b, i));
    granted := lease_id IS NOT NULL AND a.allowed;
    IF granted THEN
        a.lease := lease_id;
        a.lease_expires_at := v_now + (SELECT min(w) FROM unnest(windows, algos) AS x(w, c)
                                       WHERE c = pglimit_concurrency()) * interval '1 millisecond';
    END IF;
    IF shadow THEN
        a.would_allow := a.allowed; a.allowed := true; a.retry_after_s := NULL;
    END IF;
    RETURN NEXT a;
END
$$;
