-- The whole schema of pglimit. From the first release on, migrations are
-- append-only: a change to the schema is a new file, never an edit here.
--
-- One row per bucket. The key is HMAC-SHA256 of what identifies the bucket
-- (policy, bucket, algorithm, normalised identifiers), so no raw identifier
-- is ever stored. What each algorithm keeps in a row:
--   fixed_window    count; expires_at = window end
--   sliding_window  count (current window), prev_count; expires_at = current window end + window
--   sliding_log     log (one timestamp per admitted unit); expires_at = newest + window
--   token_bucket    tat_us (theoretical arrival time); expires_at = tat
-- In every case a row whose expires_at has passed is equivalent to no row,
-- which is what the cleanup relies on.
CREATE TABLE pglimit_buckets (
    key        bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    count      bigint      NOT NULL CHECK (count >= 0),
    expires_at timestamptz NOT NULL,
    prev_count bigint      NOT NULL DEFAULT 0,
    tat_us     bigint,
    log        bigint[]
) WITH (fillfactor = 70);
-- fillfactor leaves room on each page so that counter updates (which touch no
-- indexed column) stay HOT updates.

-- Serves the cleanup, which deletes the oldest expired rows first.
CREATE INDEX pglimit_buckets_expires_at ON pglimit_buckets (expires_at);

-- Times cross between SQL and the model as integer microseconds since the epoch.
CREATE FUNCTION pglimit_us(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (extract(epoch FROM ts) * 1000000)::bigint;

CREATE FUNCTION pglimit_ts(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN timestamptz 'epoch' + us * interval '1 microsecond';

-- One bucket's decision: a line-by-line translation of src/algorithm/
-- (the model; a test checks the two agree on random traces). The codes are
-- Algorithm::code: 0 fixed window, 1 sliding window counter, 2 sliding log,
-- 3 token bucket (GCRA); any other raises.
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
    ELSIF algo = 3 THEN  -- token bucket (GCRA)
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
    ELSE
        RAISE EXCEPTION 'pglimit_decide: unknown algorithm code %', algo;
    END IF;
END
$$;

-- Smallest elapsed time e (µs into a window) with
-- floor(prev * (win - e) / win) <= need.
CREATE FUNCTION pglimit_sliding_earliest(win bigint, prev bigint, need bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(win - ceil((need + 1)::numeric * win / greatest(prev, 1))::bigint + 1, 0);

-- Many checks in one call: one round trip, one transaction, one row lock per
-- distinct key per batch. The service queues concurrent checks and sends
-- those that arrive while a call is in flight together as the next batch.
--
-- p_checks gives, for each bucket, the check it belongs to; a check's
-- buckets are contiguous and checks are in arrival order. Each check is
-- decided in that order against the state the checks before it left, all
-- or nothing, exactly as if the checks had been separate calls in a row;
-- so a hot key is locked and written once per batch, not once per check.
--
-- Rows are locked (created first when missing, as expired rows) in key
-- order, so batches sharing keys cannot deadlock. The decision itself is
-- pglimit_decide, the SQL translation of src/algorithm/.
CREATE FUNCTION pglimit_check_batch(
    p_checks     integer[],
    p_keys       bytea[],
    p_limits     bigint[],
    p_windows_ms bigint[],
    p_algos      smallint[],
    p_costs      bigint[],
    p_now        timestamptz DEFAULT NULL
) RETURNS TABLE (
    o_pos       integer,
    o_allowed   boolean,
    o_remaining bigint,
    o_reset_at  timestamptz,
    o_retry_at  timestamptz,
    o_now       timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    now_us  bigint := pglimit_us(v_now);
    n       integer := cardinality(p_keys);
    -- State of each distinct key, in key order.
    k_key bytea[]; k_count bigint[]; k_prev bigint[]; k_exp bigint[]; k_tat bigint[]; k_log jsonb[]; k_dirty boolean[];
    pos     integer[];
    -- Answers per bucket position.
    a_allowed boolean[]; a_rem bigint[]; a_full bigint[]; a_retry bigint[];
    -- The next state of each bucket of the check being decided.
    t_count bigint[]; t_prev bigint[]; t_exp bigint[]; t_tat bigint[]; t_log jsonb[];
    b integer := 1; first_b integer; i integer; j integer; admit boolean; v record;
BEGIN
    IF coalesce(n, 0) = 0 THEN
        RETURN;
    END IF;
    -- DO UPDATE ... WHERE false writes nothing but still locks an existing row.
    INSERT INTO pglimit_buckets AS t (key, count, expires_at)
    SELECT DISTINCT u.key, 0, v_now FROM unnest(p_keys) AS u(key) ORDER BY 1
    ON CONFLICT (key) DO UPDATE SET count = t.count WHERE false;

    SELECT array_agg(t.key ORDER BY t.key), array_agg(t.count ORDER BY t.key),
           array_agg(t.prev_count ORDER BY t.key), array_agg(pglimit_us(t.expires_at) ORDER BY t.key),
           array_agg(t.tat_us ORDER BY t.key),
           array_agg(CASE WHEN t.log IS NULL THEN NULL ELSE to_jsonb(t.log) END ORDER BY t.key)
    INTO k_key, k_count, k_prev, k_exp, k_tat, k_log
    FROM pglimit_buckets t WHERE t.key = ANY (p_keys);
    k_dirty := array_fill(false, ARRAY[cardinality(k_key)]);
    pos := ARRAY(SELECT array_position(k_key, u.key) FROM unnest(p_keys) WITH ORDINALITY AS u(key, o) ORDER BY u.o);

    WHILE b <= n LOOP
        first_b := b;
        WHILE b < n AND p_checks[b + 1] = p_checks[first_b] LOOP b := b + 1; END LOOP;
        admit := p_costs[first_b] > 0;
        FOR i IN first_b..b LOOP
            j := pos[i];
            v := pglimit_decide(p_algos[i], k_count[j], k_prev[j], k_exp[j], k_tat[j],
                                CASE WHEN p_algos[i] = 2 THEN pglimit_log_of(k_log[j]) END,
                                p_limits[i], p_windows_ms[i] * 1000, p_costs[i], now_us, true);
            admit := admit AND v.allowed;
            a_allowed[i] := v.allowed; a_rem[i] := v.remaining; a_full[i] := v.full_us; a_retry[i] := v.retry_us;
            t_count[i] := v.n_count; t_prev[i] := v.n_prev; t_exp[i] := v.n_expires; t_tat[i] := v.n_tat;
            t_log[i] := CASE WHEN p_algos[i] = 2 THEN to_jsonb(v.n_log) END;
        END LOOP;
        FOR i IN first_b..b LOOP
            j := pos[i];
            IF admit THEN
                k_count[j] := t_count[i]; k_prev[j] := t_prev[i]; k_exp[j] := t_exp[i];
                k_tat[j] := t_tat[i]; k_log[j] := t_log[i]; k_dirty[j] := true;
            ELSE
                -- Not admitted: the figures of the state as it stands.
                v := pglimit_decide(p_algos[i], k_count[j], k_prev[j], k_exp[j], k_tat[j],
                                    CASE WHEN p_algos[i] = 2 THEN pglimit_log_of(k_log[j]) END,
                                    p_limits[i], p_windows_ms[i] * 1000, p_costs[i], now_us, false);
                a_rem[i] := v.remaining; a_full[i] := v.full_us; a_retry[i] := v.retry_us;
            END IF;
        END LOOP;
        b := b + 1;
    END LOOP;

    UPDATE pglimit_buckets t SET
        count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt,
        log = CASE WHEN s.lg IS NULL THEN NULL ELSE pglimit_log_of(s.lg) END
    FROM unnest(k_key, k_count, k_prev, k_exp, k_tat, k_log, k_dirty) AS s(key, c, p, e, tt, lg, dirty)
    WHERE s.dirty AND t.key = s.key;

    RETURN QUERY
    SELECT r.o::integer, r.al, r.rem, pglimit_ts(r.fu), pglimit_ts(r.re), v_now
    FROM unnest(a_allowed, a_rem, a_full, a_retry) WITH ORDINALITY AS r(al, rem, fu, re, o);
END
$$;

-- A log kept as jsonb while a batch is decided, back to bigint[].
CREATE FUNCTION pglimit_log_of(j jsonb) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN j IS NULL OR jsonb_typeof(j) <> 'array' THEN NULL
            ELSE ARRAY(SELECT e::bigint FROM jsonb_array_elements_text(j) AS e) END;

-- One row per running service instance, refreshed every 2 s, so that an
-- instance that loses Postgres knows how many were sharing it and can keep
-- to its share of each limit from memory.
CREATE TABLE pglimit_instances (
    id        bytea       PRIMARY KEY CHECK (octet_length(id) = 16),
    last_seen timestamptz NOT NULL
);
