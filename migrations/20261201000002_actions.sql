-- Acting on limits: blocks (an operator's, or a bucket's lockout) and the
-- generation that tells instances an action happened.

-- A blocked key is denied until `until`, whatever its bucket's counts say.
-- Keys are bucket keys (HMAC, as in pglimit_buckets): no raw identifier is
-- stored. `kind` is 'admin' (POST /admin/blocks) or 'lockout' (a bucket
-- with block_for denied); `policy` and `bucket` are names from the policy
-- file, `reason` the operator's text. A row past `until` is equivalent to
-- no row, and the cleanup deletes it.
CREATE TABLE pglimit_blocks (
    key        bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    until      timestamptz NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('admin', 'lockout')),
    policy     text,
    bucket     text,
    reason     text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pglimit_blocks_until ON pglimit_blocks (until);

-- Bumped in the transaction of every reset, block and unblock, which also
-- notifies channel pglimit_actions with '<generation> <hex key>,...'.
-- An instance that reads a generation it has not heard of missed a
-- notification, and forgets every denial it remembers.
CREATE TABLE pglimit_actions (
    id         integer PRIMARY KEY CHECK (id = 1),
    generation bigint  NOT NULL
);
INSERT INTO pglimit_actions VALUES (1, 0);

-- The batch function of the first migration, now also honouring blocks and
-- lockouts: a blocked bucket denies its check (nothing is consumed) until
-- the block ends; a bucket with a lockout (p_block_for_ms > 0) that denies
-- blocks its key for that long from the denial. Blocks are read in the same
-- call, so a check still costs one round trip. An overload of the first
-- version (two more arguments; at the end of this file that version becomes
-- a wrapper around this one, so that instances of the previous build keep
-- working during a rolling deploy).
CREATE FUNCTION pglimit_check_batch(
    p_checks       integer[],
    p_keys         bytea[],
    p_limits       bigint[],
    p_windows_ms   bigint[],
    p_algos        smallint[],
    p_costs        bigint[],
    p_block_for_ms bigint[],
    p_names        text[],
    p_now          timestamptz DEFAULT NULL
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
    v_now   timestamptz := coalesce(p_now, now());
    now_us  bigint := pglimit_us(v_now);
    n       integer := cardinality(p_keys);
    -- State of each distinct key, in key order; k_block: blocked until (µs).
    k_key bytea[]; k_count bigint[]; k_prev bigint[]; k_exp bigint[]; k_tat bigint[]; k_log jsonb[];
    k_dirty boolean[]; k_block bigint[]; k_locked boolean[]; k_name text[];
    pos     integer[];
    -- Answers per bucket position.
    a_allowed boolean[]; a_rem bigint[]; a_full bigint[]; a_retry bigint[]; a_blocked boolean[];
    -- The next state of each bucket of the check being decided.
    t_count bigint[]; t_prev bigint[]; t_exp bigint[]; t_tat bigint[]; t_log jsonb[];
    b integer := 1; first_b integer; i integer; j integer; admit boolean; v record; until_us bigint;
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
           array_agg(CASE WHEN t.log IS NULL THEN NULL ELSE to_jsonb(t.log) END ORDER BY t.key),
           array_agg((SELECT pglimit_us(k.until) FROM pglimit_blocks k WHERE k.key = t.key AND k.until > v_now)
                     ORDER BY t.key)
    INTO k_key, k_count, k_prev, k_exp, k_tat, k_log, k_block
    FROM pglimit_buckets t WHERE t.key = ANY (p_keys);
    k_dirty := array_fill(false, ARRAY[cardinality(k_key)]);
    k_locked := array_fill(false, ARRAY[cardinality(k_key)]);
    k_name := array_fill(NULL::text, ARRAY[cardinality(k_key)]);
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
            a_blocked[i] := k_block[j] IS NOT NULL;
            admit := admit AND v.allowed AND NOT a_blocked[i];
            a_allowed[i] := v.allowed AND NOT a_blocked[i];
            a_rem[i] := v.remaining; a_full[i] := v.full_us; a_retry[i] := v.retry_us;
            t_count[i] := v.n_count; t_prev[i] := v.n_prev; t_exp[i] := v.n_expires; t_tat[i] := v.n_tat;
            t_log[i] := CASE WHEN p_algos[i] = 2 THEN to_jsonb(v.n_log) END;
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
                                CASE WHEN p_algos[i] = 2 THEN pglimit_log_of(k_log[j]) END,
                                p_limits[i], p_windows_ms[i] * 1000, p_costs[i], now_us, false);
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
                until_us := k_block[j];
                a_rem[i] := 0;
                a_retry[i] := greatest(coalesce(a_retry[i], 0), until_us);
                a_full[i] := greatest(a_full[i], until_us);
            END IF;
        END LOOP;
        b := b + 1;
    END LOOP;

    UPDATE pglimit_buckets t SET
        count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt,
        log = CASE WHEN s.lg IS NULL THEN NULL ELSE pglimit_log_of(s.lg) END
    FROM unnest(k_key, k_count, k_prev, k_exp, k_tat, k_log, k_dirty) AS s(key, c, p, e, tt, lg, dirty)
    WHERE s.dirty AND t.key = s.key;

    -- Lockouts, in key order like every other lock here. An operator's block
    -- that ends later is kept as it is.
    INSERT INTO pglimit_blocks AS k (key, until, kind, policy, bucket)
    SELECT s.key, pglimit_ts(s.until_us), 'lockout', split_part(s.name, '/', 1), split_part(s.name, '/', 2)
    FROM unnest(k_key, k_block, k_locked, k_name) AS s(key, until_us, locked, name)
    WHERE s.locked ORDER BY s.key
    ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, kind = 'lockout',
        policy = EXCLUDED.policy, bucket = EXCLUDED.bucket, reason = NULL, created_at = now()
    WHERE k.until < EXCLUDED.until;

    RETURN QUERY
    SELECT r.o::integer, r.al, r.rem, pglimit_ts(r.fu), pglimit_ts(r.re), v_now, r.bl
    FROM unnest(a_allowed, a_rem, a_full, a_retry, a_blocked) WITH ORDINALITY AS r(al, rem, fu, re, bl, o);
END
$$;

-- The first version's signature, for instances of the previous build: no
-- lockouts, blocks honoured.
CREATE OR REPLACE FUNCTION pglimit_check_batch(
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
) LANGUAGE sql AS $$
    SELECT b.o_pos, b.o_allowed, b.o_remaining, b.o_reset_at, b.o_retry_at, b.o_now
    FROM pglimit_check_batch(
        p_checks, p_keys, p_limits, p_windows_ms, p_algos, p_costs,
        array_fill(0::bigint, ARRAY[coalesce(cardinality(p_keys), 0)]),
        array_fill(NULL::text, ARRAY[coalesce(cardinality(p_keys), 0)]),
        p_now) AS b
$$;
