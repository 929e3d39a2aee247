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
-- pglimit_decide, the SQL translation of src/algorithm.rs.
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
    INSERT INTO pglimit_buckets AS t (key, count, reset_at)
    SELECT DISTINCT u.key, 0, v_now FROM unnest(p_keys) AS u(key) ORDER BY 1
    ON CONFLICT (key) DO UPDATE SET count = t.count WHERE false;

    SELECT array_agg(t.key ORDER BY t.key), array_agg(t.count ORDER BY t.key),
           array_agg(t.prev_count ORDER BY t.key), array_agg(pglimit_us(t.reset_at) ORDER BY t.key),
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
        count = s.c, prev_count = s.p, reset_at = pglimit_ts(s.e), tat_us = s.tt,
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

-- Superseded: a single check is a batch of one.
DROP FUNCTION pglimit_check(bytea[], bigint[], bigint[], smallint[], bigint, timestamptz);
