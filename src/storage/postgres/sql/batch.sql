-- Many checks in one call: one round trip, one transaction, one row lock per
-- distinct key per batch. The service queues concurrent checks and sends
-- those that arrive while a call is in flight together as the next batch.
--
-- p_checks gives, for each bucket, the check it belongs to; a check's
-- buckets are contiguous and checks are in arrival order. Each check is
-- decided in that order against the state the checks before it left, all
-- or nothing, exactly as if the checks had been separate calls in a row;
-- so a hot key is locked and written once per batch, not once per check.
-- A blocked bucket denies its check (nothing is consumed) until the block
-- ends; a bucket with a lockout (p_block_for_ms > 0) that denies blocks its
-- key for that long from the denial. p_zones gives a calendar window's
-- zone (NULL for any other window; the whole array NULL when none is).

-- A log kept as jsonb while a batch is decided (a bigint[][] cannot hold
-- logs of different lengths), back to bigint[].
CREATE FUNCTION pglimit_log_of(j jsonb) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN j IS NULL OR jsonb_typeof(j) <> 'array' THEN NULL
            ELSE ARRAY(SELECT e::bigint FROM jsonb_array_elements_text(j) AS e) END;

-- Creates the rows of `keys` that are missing and locks every one, in key
-- order, so that batches sharing keys cannot deadlock: every statement
-- that decides or writes back with locks starts here. DO UPDATE ... WHERE
-- false writes nothing but still locks an existing row. A new row ends at
-- the epoch, over for every clock: ending at now, it was a live window to
-- a call whose clock is earlier (its transaction began first, then waited
-- for this lock), and that call's take was lost when the window ended
-- moments later.
CREATE FUNCTION pglimit_lock_buckets(keys bytea[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pglimit_buckets AS t (key, count, expires_at)
    SELECT DISTINCT u.key, 0, timestamptz 'epoch' FROM unnest(keys) AS u(key) ORDER BY 1
    ON CONFLICT (key) DO UPDATE SET count = t.count WHERE false;
END
$$;

-- Lockouts: blocks `keys` until `untils_us`, each named by its bucket
-- (`policy/bucket`), in key order like every other lock here. An operator's
-- block that ends later is kept as it is.
CREATE FUNCTION pglimit_lock_out(keys bytea[], untils_us bigint[], names text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pglimit_blocks AS k (key, until, kind, policy, bucket)
    SELECT s.key, pglimit_ts(s.until_us), 'lockout', split_part(s.name, '/', 1), split_part(s.name, '/', 2)
    FROM unnest(keys, untils_us, names) AS s(key, until_us, name) ORDER BY s.key
    ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, kind = 'lockout',
        policy = EXCLUDED.policy, bucket = EXCLUDED.bucket, reason = NULL, created_at = now()
    WHERE k.until < EXCLUDED.until;
END
$$;

-- The decisions of a batch on the state of its distinct keys (k_*, locked
-- by the caller; pos: each bucket's key among them): the loop that
-- pglimit_check_batch and Citus' pglimit_check_node share, which differ
-- only in where they read and write the rows. Returns the keys' next state
-- (k_dirty: changed; k_locked: a lockout starts, until k_block, named
-- k_name) and each bucket's answer (a_*).
CREATE FUNCTION pglimit_decide_batch(
    p_checks integer[], pos integer[], p_limits bigint[], p_windows_ms bigint[], p_algos smallint[],
    p_costs bigint[], p_block_for_ms bigint[], p_names text[], p_zones text[], now_us bigint,
    INOUT k_count bigint[], INOUT k_prev bigint[], INOUT k_exp bigint[], INOUT k_tat bigint[],
    INOUT k_log jsonb[], INOUT k_block bigint[],
    OUT k_dirty boolean[], OUT k_locked boolean[], OUT k_name text[],
    OUT a_allowed boolean[], OUT a_rem bigint[], OUT a_full bigint[], OUT a_retry bigint[], OUT a_blocked boolean[]
) LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n integer := cardinality(p_checks);
    -- The next state of each bucket of the check being decided.
    t_count bigint[]; t_prev bigint[]; t_exp bigint[]; t_tat bigint[]; t_log jsonb[];
    b integer := 1; first_b integer; i integer; j integer; admit boolean; v record;
BEGIN
    k_dirty := array_fill(false, ARRAY[cardinality(k_count)]);
    k_locked := array_fill(false, ARRAY[cardinality(k_count)]);
    k_name := array_fill(NULL::text, ARRAY[cardinality(k_count)]);
    WHILE b <= n LOOP
        first_b := b;
        WHILE b < n AND p_checks[b + 1] = p_checks[first_b] LOOP b := b + 1; END LOOP;
        admit := p_costs[first_b] > 0;
        FOR i IN first_b..b LOOP
            j := pos[i];
            v := pglimit_decide(p_algos[i], k_count[j], k_prev[j], k_exp[j], k_tat[j],
                                CASE WHEN p_algos[i] IN (pglimit_sliding_log(), pglimit_concurrency()) THEN pglimit_log_of(k_log[j]) END,
                                p_limits[i], p_windows_ms[i] * 1000, p_costs[i], now_us, true, p_zones[i]);
            a_blocked[i] := k_block[j] IS NOT NULL;
            admit := admit AND v.allowed AND NOT a_blocked[i];
            a_allowed[i] := v.allowed AND NOT a_blocked[i];
            a_rem[i] := v.remaining; a_full[i] := v.full_us; a_retry[i] := v.retry_us;
            t_count[i] := v.n_count; t_prev[i] := v.n_prev; t_exp[i] := v.n_expires; t_tat[i] := v.n_tat;
            t_log[i] := CASE WHEN p_algos[i] IN (pglimit_sliding_log(), pglimit_concurrency()) THEN to_jsonb(v.n_log) END;
        END LOOP;
        FOR i IN first_b..b LOOP
            j := pos[i];
            IF admit THEN
                k_count[j] := t_count[i]; k_prev[j] := t_prev[i]; k_exp[j] := t_exp[i];
                k_tat[j] := t_tat[i]; k_log[j] := t_log[i]; k_dirty[j] := true;
                CONTINUE;
            END IF;
            -- Not admitted: the figures of the state as it stands.
            v := pglimit_decide(p_algos[i], k_count[j], k_prev[j], k_exp[j], k_tat[j],
                                CASE WHEN p_algos[i] IN (pglimit_sliding_log(), pglimit_concurrency()) THEN pglimit_log_of(k_log[j]) END,
                                p_limits[i], p_windows_ms[i] * 1000, p_costs[i], now_us, false, p_zones[i]);
            a_rem[i] := v.remaining; a_full[i] := v.full_us; a_retry[i] := v.retry_us;
            -- This bucket denied by its own count: its lockout starts now.
            IF NOT a_blocked[i] AND NOT a_allowed[i] AND coalesce(p_block_for_ms[i], 0) > 0 THEN
                k_block[j] := greatest(coalesce(k_block[j], 0), now_us + p_block_for_ms[i] * 1000);
                k_locked[j] := true;
                k_name[j] := p_names[i];
            END IF;
            IF a_blocked[i] OR k_locked[j] THEN
                -- Blocked from here on, and said so from this first denial.
                a_blocked[i] := true;
                a_rem[i] := 0;
                a_retry[i] := greatest(coalesce(a_retry[i], 0), k_block[j]);
                a_full[i] := greatest(a_full[i], k_block[j]);
            END IF;
        END LOOP;
        b := b + 1;
    END LOOP;
END
$$;

-- Any batch on a single node. Rows are locked (created first when missing,
-- as expired rows) in key order, so batches sharing keys cannot deadlock;
-- blocks are read in the same call, so a check still costs one round trip.
CREATE FUNCTION pglimit_check_batch(
    p_checks       integer[],
    p_keys         bytea[],
    p_limits       bigint[],
    p_windows_ms   bigint[],
    p_algos        smallint[],
    p_costs        bigint[],
    p_block_for_ms bigint[],
    p_names        text[],
    p_now          timestamptz DEFAULT NULL,
    p_zones        text[] DEFAULT NULL,
    p_leases       bytea[] DEFAULT NULL,
    p_lease_lives  bigint[] DEFAULT NULL
) RETURNS TABLE (
    o_pos       integer,
    o_allowed   boolean,
    o_remaining bigint,
    o_reset_at  timestamptz,
    o_retry_at  timestamptz,
    o_now       timestamptz,
    o_blocked   boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    k_key bytea[]; k_count bigint[]; k_prev bigint[]; k_exp bigint[]; k_tat bigint[]; k_log jsonb[];
    k_block bigint[]; pos integer[]; d record;
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM pglimit_lock_buckets(p_keys);

    SELECT array_agg(t.key ORDER BY t.key), array_agg(t.count ORDER BY t.key),
           array_agg(t.prev_count ORDER BY t.key), array_agg(pglimit_us(t.expires_at) ORDER BY t.key),
           array_agg(t.tat_us ORDER BY t.key),
           array_agg(CASE WHEN t.log IS NULL THEN NULL ELSE to_jsonb(t.log) END ORDER BY t.key),
           array_agg((SELECT pglimit_us(k.until) FROM pglimit_blocks k WHERE k.key = t.key AND k.until > v_now)
                     ORDER BY t.key)
    INTO k_key, k_count, k_prev, k_exp, k_tat, k_log, k_block
    FROM pglimit_buckets t WHERE t.key = ANY (p_keys);
    pos := ARRAY(SELECT array_position(k_key, u.key) FROM unnest(p_keys) WITH ORDINALITY AS u(key, o) ORDER BY u.o);

    d := pglimit_decide_batch(p_checks, pos, p_limits, p_windows_ms, p_algos, p_costs, p_block_for_ms, p_names,
                              p_zones, pglimit_us(v_now), k_count, k_prev, k_exp, k_tat, k_log, k_block);

    UPDATE pglimit_buckets t SET
        count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt,
        log = CASE WHEN s.lg IS NULL THEN NULL ELSE pglimit_log_of(s.lg) END
    FROM unnest(k_key, d.k_count, d.k_prev, d.k_exp, d.k_tat, d.k_log, d.k_dirty) AS s(key, c, p, e, tt, lg, dirty)
    WHERE s.dirty AND t.key = s.key;

    IF true = ANY (d.k_locked) THEN
        PERFORM pglimit_lock_out(array_agg(s.key), array_agg(s.until_us), array_agg(s.name))
        FROM unnest(k_key, d.k_block, d.k_locked, d.k_name) AS s(key, until_us, locked, name) WHERE s.locked;
    END IF;

    -- Only a batch with a concurrency bucket has leases to write.
    IF pglimit_concurrency() = ANY (p_algos) THEN
        PERFORM pglimit_take_leases(p_checks, p_keys, p_windows_ms, p_algos, p_costs, p_leases, d.a_allowed, v_now,
                                    p_lease_lives);
    END IF;

    RETURN QUERY
    SELECT r.o::integer, r.al, r.rem, pglimit_ts(r.fu), pglimit_ts(r.re), v_now, r.bl
    FROM unnest(d.a_allowed, d.a_rem, d.a_full, d.a_retry, d.a_blocked) WITH ORDINALITY AS r(al, rem, fu, re, bl, o);
END
$$;
