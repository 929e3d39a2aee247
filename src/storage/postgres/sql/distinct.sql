-- A set-based batch function for the common case of pglimit_check_batch:
-- no key appears twice in the batch (random identities, policies with
-- several buckets, any of the five algorithms, lockouts). Same arguments,
-- same rows, same decisions; it replaces the per-bucket PL/pgSQL loop,
-- several times dearer (docs/performance.md), by two statements.
--
-- Why it is exact: the first statement creates missing rows (as expired
-- rows) and locks every row in key order, as pglimit_check_batch does. A
-- volatile function's next statement takes a fresh snapshot, so the second
-- one reads each row as last committed, and no one else can change it
-- until we commit. With every key distinct, each bucket's next state
-- depends only on its own row and on whether its check is admitted (all of
-- its buckets fit, none is blocked, cost > 0): so every bucket is decided
-- at once, by the functions of algorithms.sql.
-- The random-trace tests compare both functions with the Rust model.
CREATE FUNCTION pglimit_check_distinct(
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
    v_now  timestamptz := coalesce(p_now, now());
    now_us bigint := pglimit_us(v_now);
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM pglimit_lock_buckets(p_keys);

    -- Written for the executor: each row's times converted once, and
    -- subqueries in MATERIALIZED steps so that they run once per row
    -- however often their result is read.
    RETURN QUERY
    WITH cur AS MATERIALIZED (
        SELECT r.chk, r.key, r.lim, r.win * 1000 AS win, r.algo, r.cost, r.bf, r.name, r.tz, r.pos::integer AS pos,
               b.count, b.prev_count, b.tat_us, b.log,
               pglimit_us(b.expires_at) AS exp_us,
               (SELECT pglimit_us(k.until) FROM pglimit_blocks k
                WHERE k.key = r.key AND k.until > v_now) AS until_us
        FROM unnest(p_checks, p_keys, p_limits, p_windows_ms, p_algos, p_costs, p_block_for_ms, p_names, p_zones)
             WITH ORDINALITY AS r(chk, key, lim, win, algo, cost, bf, name, tz, pos)
        JOIN pglimit_buckets b ON b.key = r.key
    ), st AS MATERIALIZED (
        -- Each algorithm's state as it stands now (algorithms.sql).
        SELECT c.*,
               pglimit_fixed_count(c.count, c.exp_us, now_us) AS f_c,
               pglimit_fixed_end(c.exp_us, now_us, pglimit_window_end(now_us, c.win, c.tz)) AS f_end,
               pglimit_sliding_current(c.count, c.exp_us, pglimit_sliding_row_end(now_us, c.win)) AS sw_c,
               pglimit_sliding_previous(c.count, c.prev_count, c.exp_us, pglimit_sliding_row_end(now_us, c.win),
                                        pglimit_sliding_row_end(now_us, c.win) - c.win) AS sw_p,
               -- pglimit_log_live and pglimit_leases_held, written out (algorithms.sql).
               CASE c.algo WHEN pglimit_sliding_log() THEN ARRAY(
                   SELECT x FROM unnest(coalesce(c.log, '{}')) AS x WHERE pglimit_log_keeps(x, now_us, c.win) ORDER BY x)
                           WHEN pglimit_concurrency() THEN ARRAY(
                   SELECT x FROM unnest(coalesce(c.log, '{}')) AS x WHERE pglimit_lease_holds(x, now_us) ORDER BY x) END AS lg,
               pglimit_token_tat(c.tat_us, now_us) AS tb_tat,
               pglimit_token_step(c.win, c.lim) AS tb_step
        FROM cur c
    ), used AS (
        -- What each bucket holds now, in its algorithm's unit (a token
        -- bucket's is its tat).
        SELECT s.*, CASE s.algo WHEN pglimit_fixed_window() THEN s.f_c
                                WHEN pglimit_sliding_window() THEN pglimit_sliding_weight(s.sw_p, s.win, now_us) + s.sw_c
                                WHEN pglimit_token_bucket() THEN NULL
                                ELSE cardinality(s.lg) END AS held
        FROM st s
    ), dec AS (
        SELECT c.*, fit.fit,
               c.cost > 0 AND bool_and(fit.fit AND c.until_us IS NULL) OVER (PARTITION BY c.chk) AS admit,
               -- Denied by its own count: its lockout starts now.
               NOT fit.fit AND c.until_us IS NULL AND coalesce(c.bf, 0) > 0 AS locks
        FROM used c CROSS JOIN LATERAL (SELECT CASE c.algo
            WHEN pglimit_token_bucket() THEN pglimit_token_fits(c.tb_tat, c.cost * c.tb_step, c.tb_step * c.lim, now_us)
            ELSE pglimit_fits(c.held, c.cost, c.lim) END AS fit) AS fit
    ), fig AS (
        -- The figures and the next state: admitted, or as it stands.
        SELECT d.*, n.*,
               coalesce(d.until_us, CASE WHEN d.locks THEN now_us + d.bf * 1000 END) AS block_us
        FROM dec d CROSS JOIN LATERAL (SELECT
            CASE WHEN d.admit THEN d.cost ELSE 0 END AS used,
            CASE WHEN NOT d.admit THEN d.lg
                 WHEN d.algo = pglimit_sliding_log() THEN pglimit_log_take(d.lg, d.cost, now_us)
                 -- pglimit_lease_take, written out (algorithms.sql).
                 WHEN d.algo = pglimit_concurrency()
                 THEN ARRAY(SELECT x FROM unnest(d.lg || array_fill(now_us + d.win, ARRAY[d.cost::integer])) AS x ORDER BY x)
            END AS n_lg
        ) AS u CROSS JOIN LATERAL (SELECT
            CASE d.algo
                WHEN pglimit_token_bucket()
                THEN pglimit_token_remaining(d.tb_tat + u.used * d.tb_step, d.tb_step, d.lim, now_us)
                WHEN pglimit_sliding_log() THEN pglimit_room(d.lim, cardinality(u.n_lg))
                WHEN pglimit_concurrency() THEN pglimit_room(d.lim, cardinality(u.n_lg))
                ELSE pglimit_room(d.lim, d.held + u.used)
            END AS rem,
            CASE d.algo
                WHEN pglimit_fixed_window() THEN d.f_end
                WHEN pglimit_sliding_window() THEN pglimit_sliding_full(d.sw_c + u.used, d.sw_p, now_us, d.win)
                WHEN pglimit_sliding_log() THEN pglimit_log_full(u.n_lg, d.win, now_us)
                WHEN pglimit_concurrency() THEN pglimit_log_full(u.n_lg, 0, now_us)
                WHEN pglimit_token_bucket() THEN d.tb_tat + u.used * d.tb_step
            END AS full_us,
            CASE WHEN d.fit THEN NULL ELSE CASE d.algo
                WHEN pglimit_fixed_window() THEN d.f_end
                WHEN pglimit_sliding_window()
                THEN pglimit_sliding_retry(d.lim, d.win, pglimit_sliding_start(now_us, d.win), d.sw_c, d.sw_p, d.cost)
                WHEN pglimit_sliding_log() THEN pglimit_log_retry(d.lg, d.cost, d.lim, d.win, now_us)
                WHEN pglimit_concurrency() THEN pglimit_log_retry(d.lg, d.cost, d.lim, 0, now_us)
                WHEN pglimit_token_bucket() THEN pglimit_token_retry(d.tb_tat, d.cost, d.tb_step, d.lim)
            END END AS retry_us,
            u.n_lg
        ) AS n
    ), up AS (
        UPDATE pglimit_buckets t SET
            count      = CASE f.algo WHEN pglimit_fixed_window() THEN f.f_c + f.cost
                                     WHEN pglimit_sliding_window() THEN f.sw_c + f.cost ELSE 0 END,
            prev_count = CASE WHEN f.algo = pglimit_sliding_window() THEN f.sw_p ELSE 0 END,
            expires_at = pglimit_ts(CASE WHEN f.algo = pglimit_sliding_window() THEN pglimit_sliding_row_end(now_us, f.win)
                                         ELSE f.full_us END),
            tat_us     = CASE WHEN f.algo = pglimit_token_bucket() THEN f.full_us END,
            log        = CASE WHEN f.algo IN (pglimit_sliding_log(), pglimit_concurrency()) THEN f.n_lg END
        FROM fig f WHERE f.admit AND t.key = f.key
    ), lk AS (
        -- Lockouts and leases through the functions pglimit_check_batch
        -- calls (batch.sql, leases.sql), each called only when there is
        -- one: a row each, which the answers below join.
        SELECT CASE WHEN bool_or(f.locks) THEN pglimit_lock_out(array_agg(f.key) FILTER (WHERE f.locks),
                                                              array_agg(f.block_us) FILTER (WHERE f.locks),
                                                              array_agg(f.name) FILTER (WHERE f.locks)) END AS done
        FROM fig f
    ), ls AS (
        SELECT CASE WHEN bool_or(f.algo = pglimit_concurrency())
                    THEN pglimit_take_leases(p_checks, p_keys, p_windows_ms, p_algos, p_costs, p_leases,
                                             array_agg(f.fit AND f.until_us IS NULL ORDER BY f.pos), v_now,
                                             p_lease_lives) END AS done
        FROM fig f
    )
    SELECT f.pos, f.fit AND f.until_us IS NULL,
           CASE WHEN f.block_us IS NULL THEN f.rem ELSE 0 END,
           pglimit_ts(greatest(f.full_us, f.block_us)),
           pglimit_ts(CASE WHEN f.block_us IS NULL THEN f.retry_us
                           ELSE greatest(coalesce(f.retry_us, 0), f.block_us) END),
           v_now, f.block_us IS NOT NULL
    FROM fig f CROSS JOIN lk CROSS JOIN ls ORDER BY f.pos;
END
$$;

-- Raised by the service's plain fixed-window upsert when a check of several
-- buckets, admitted on the statement's snapshot, finds one of its rows
-- changed by another instance before it could lock it: the statement (its
-- own transaction) is rolled back whole, and the service decides the batch
-- again with pglimit_check_distinct, which locks first. 40001 is the code
-- for "retry the transaction".
CREATE FUNCTION pglimit_retry_with_locks() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '40001',
        MESSAGE = 'pglimit: a row changed between the snapshot and its lock; deciding again with locks';
END
$$;
