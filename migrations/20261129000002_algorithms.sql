-- Four algorithms per bucket: fixed window, sliding window counter, sliding
-- log and token bucket (GCRA). pglimit_decide is a line-by-line translation
-- of src/algorithm.rs (the model; a test checks the two agree on random
-- traces). All times are integer microseconds since the epoch.
--
-- What each algorithm keeps in a row:
--   fixed_window    count; reset_at = window end
--   sliding_window  count (current window), prev_count; reset_at = current window end + window
--   sliding_log     log (one timestamp per admitted unit); reset_at = newest + window
--   token_bucket    tat_us (theoretical arrival time); reset_at = tat
-- In every case a row whose reset_at has passed is equivalent to no row,
-- which is what the cleanup relies on.
ALTER TABLE pglimit_buckets
    ADD COLUMN prev_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN tat_us bigint,
    ADD COLUMN log bigint[];

DROP FUNCTION pglimit_check(bytea[], bigint[], bigint[], bigint);

CREATE FUNCTION pglimit_us(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (extract(epoch FROM ts) * 1000000)::bigint;

CREATE FUNCTION pglimit_ts(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN timestamptz 'epoch' + us * interval '1 microsecond';

CREATE FUNCTION pglimit_decide(
    algo smallint, s_count bigint, s_prev bigint, s_expires bigint, s_tat bigint, s_log bigint[],
    lim bigint, win bigint, cost bigint, now_us bigint, admit boolean,
    OUT allowed boolean, OUT remaining bigint, OUT full_us bigint, OUT retry_us bigint,
    OUT n_count bigint, OUT n_prev bigint, OUT n_expires bigint, OUT n_tat bigint, OUT n_log bigint[]
) LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    c bigint; p bigint; w bigint; start_us bigint; end_us bigint; need bigint;
    entries bigint[]; k bigint; step bigint; cap bigint; tat bigint; new_tat bigint;
BEGIN
    n_count := 0; n_prev := 0; n_tat := NULL; n_log := NULL;
    IF algo = 0 THEN  -- fixed window
        IF s_expires > now_us THEN c := s_count; end_us := s_expires;
        ELSE c := 0; end_us := now_us + win; END IF;
        allowed := c + cost <= lim;
        IF admit THEN c := c + cost; END IF;
        remaining := greatest(lim - c, 0);
        full_us := end_us;
        retry_us := CASE WHEN allowed THEN NULL ELSE end_us END;
        n_count := c; n_expires := end_us;
    ELSIF algo = 1 THEN  -- sliding window counter
        start_us := div(now_us, win) * win;
        end_us := start_us + win;
        IF s_expires - win = end_us THEN c := s_count; p := s_prev;
        ELSIF s_expires - win = start_us THEN c := 0; p := s_count;
        ELSE c := 0; p := 0; END IF;
        w := div(p::numeric * (win - (now_us - start_us)), win)::bigint;
        allowed := w + c + cost <= lim;
        IF admit THEN c := c + cost; END IF;
        remaining := greatest(lim - w - c, 0);
        full_us := CASE WHEN c > 0 THEN end_us + win WHEN p > 0 THEN end_us ELSE now_us END;
        IF NOT allowed THEN
            IF c + cost <= lim THEN
                retry_us := start_us + pglimit_sliding_earliest(win, p, lim - c - cost);
            ELSE
                retry_us := end_us + pglimit_sliding_earliest(win, c, greatest(lim - cost, 0));
            END IF;
        END IF;
        n_count := c; n_prev := p; n_expires := end_us + win;
    ELSIF algo = 2 THEN  -- sliding log
        entries := ARRAY(SELECT x FROM unnest(coalesce(s_log, '{}')) AS x WHERE x > now_us - win ORDER BY x);
        allowed := cardinality(entries) + cost <= lim;
        IF NOT allowed THEN
            k := cardinality(entries) + cost - lim;
            retry_us := coalesce(entries[k] + win, now_us);
        END IF;
        IF admit THEN entries := entries || array_fill(now_us, ARRAY[cost::int]); END IF;
        full_us := coalesce(entries[cardinality(entries)] + win, now_us);
        remaining := greatest(lim - cardinality(entries), 0);
        n_log := entries; n_expires := full_us;
    ELSE  -- token bucket (GCRA)
        step := greatest(win / greatest(lim, 1), 1);
        cap := step * lim;
        tat := greatest(coalesce(s_tat, now_us), now_us);
        new_tat := tat + cost * step;
        allowed := new_tat - now_us <= cap;
        IF admit THEN tat := new_tat; END IF;
        remaining := greatest((now_us + cap - tat) / step, 0);
        full_us := tat;
        retry_us := CASE WHEN allowed THEN NULL ELSE new_tat - cap END;
        n_tat := tat; n_expires := tat;
    END IF;
END
$$;

-- Smallest elapsed time e (µs into a window) with
-- floor(prev * (win - e) / win) <= need.
CREATE FUNCTION pglimit_sliding_earliest(win bigint, prev bigint, need bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(win - ceil((need + 1)::numeric * win / greatest(prev, 1))::bigint + 1, 0);

-- Decides one check of any number of buckets, all or nothing.
--
-- Invariant: a check is admitted only if every bucket allows it (and its
-- cost is above zero); then every bucket takes the cost. Otherwise no bucket
-- changes: a denied check consumes nothing. The clock is now(); p_now exists
-- only so that tests can replay traces deterministically.
--
-- Rows are locked in key order (creating missing ones first, as expired
-- rows), so two checks that share buckets always lock them in the same
-- order and cannot deadlock, and no concurrent check can change a bucket
-- between our read and our write.
CREATE FUNCTION pglimit_check(
    p_keys       bytea[],
    p_limits     bigint[],
    p_windows_ms bigint[],
    p_algos      smallint[],
    p_cost       bigint,
    p_now        timestamptz DEFAULT NULL
) RETURNS TABLE (
    o_idx       integer,
    o_allowed   boolean,
    o_remaining bigint,
    o_reset_at  timestamptz,
    o_retry_at  timestamptz,
    o_now       timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    v_now_us bigint := pglimit_us(v_now);
    v_admit  boolean;
BEGIN
    -- DO UPDATE ... WHERE false writes nothing but still locks an existing row.
    INSERT INTO pglimit_buckets AS b (key, count, reset_at)
    SELECT u.key, 0, v_now
    FROM unnest(p_keys) AS u(key)
    ORDER BY u.key
    ON CONFLICT (key) DO UPDATE SET count = b.count WHERE false;

    SELECT bool_and(d.allowed) AND p_cost > 0 INTO v_admit
    FROM unnest(p_keys, p_limits, p_windows_ms, p_algos) AS u(key, lim, win, algo)
    JOIN pglimit_buckets b ON b.key = u.key
    CROSS JOIN LATERAL pglimit_decide(u.algo, b.count, b.prev_count, pglimit_us(b.reset_at), b.tat_us,
                                      b.log, u.lim, u.win * 1000, p_cost, v_now_us, false) d;

    IF v_admit THEN
        RETURN QUERY
        WITH d AS (
            SELECT u.idx, u.key, x.*
            FROM unnest(p_keys, p_limits, p_windows_ms, p_algos) WITH ORDINALITY AS u(key, lim, win, algo, idx)
            JOIN pglimit_buckets b ON b.key = u.key
            CROSS JOIN LATERAL pglimit_decide(u.algo, b.count, b.prev_count, pglimit_us(b.reset_at), b.tat_us,
                                              b.log, u.lim, u.win * 1000, p_cost, v_now_us, true) x
        )
        UPDATE pglimit_buckets b SET
            count      = d.n_count,
            prev_count = d.n_prev,
            reset_at   = pglimit_ts(d.n_expires),
            tat_us     = d.n_tat,
            log        = d.n_log
        FROM d
        WHERE b.key = d.key
        RETURNING d.idx::integer, d.allowed, d.remaining, pglimit_ts(d.full_us), pglimit_ts(d.retry_us), v_now;
    ELSE
        RETURN QUERY
        SELECT u.idx::integer, d.allowed, d.remaining, pglimit_ts(d.full_us), pglimit_ts(d.retry_us), v_now
        FROM unnest(p_keys, p_limits, p_windows_ms, p_algos) WITH ORDINALITY AS u(key, lim, win, algo, idx)
        JOIN pglimit_buckets b ON b.key = u.key
        CROSS JOIN LATERAL pglimit_decide(u.algo, b.count, b.prev_count, pglimit_us(b.reset_at), b.tat_us,
                                          b.log, u.lim, u.win * 1000, p_cost, v_now_us, false) d;
    END IF;
END
$$;
