-- A set-based batch function for the common case of pglimit_check_batch:
-- no key appears twice in the batch (random identities, policies with
-- several buckets, any of the four algorithms, lockouts). Same arguments,
-- same rows, same decisions; it replaces the per-bucket PL/pgSQL loop
-- (measured at 0.5-1.7 ms a call in bench/run) by two statements.
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
    -- DO UPDATE ... WHERE false writes nothing but still locks an existing row;
    -- a new one ends at the epoch, over for every clock (see batch.sql).
    INSERT INTO pglimit_buckets AS t (key, count, expires_at)
    SELECT u.key, 0, timestamptz 'epoch' FROM unnest(p_keys) AS u(key) ORDER BY 1
    ON CONFLICT (key) DO UPDATE SET count = t.count WHERE false;

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
        -- Each algorithm's state as it stands now (algorithms.sql); a
        -- sliding window's current window ends at sw_start + win, and its
        -- row's expires_at one window later.
        SELECT c.*,
               pglimit_fixed_count(c.count, c.exp_us, now_us) AS f_c,
               pglimit_fixed_end(c.exp_us, now_us, pglimit_window_end(now_us, c.win, c.tz)) AS f_end,
               pglimit_sliding_start(now_us, c.win) AS sw_start,
               pglimit_sliding_current(c.count, c.exp_us, pglimit_sliding_start(now_us, c.win) + 2 * c.win) AS sw_c,
               pglimit_sliding_previous(c.count, c.prev_count, c.exp_us, pglimit_sliding_start(now_us, c.win) + 2 * c.win,
                                        pglimit_sliding_start(now_us, c.win) + c.win) AS sw_p,
               CASE WHEN c.algo = 2 THEN ARRAY(
                   SELECT x FROM unnest(coalesce(c.log, '{}')) AS x WHERE pglimit_log_keeps(x, now_us, c.win) ORDER BY x)
                    WHEN c.algo = 4 THEN ARRAY(
                   SELECT x FROM unnest(coalesce(c.log, '{}')) AS x WHERE pglimit_lease_holds(x, now_us) ORDER BY x) END AS lg,
               pglimit_token_tat(c.tat_us, now_us) AS tb_tat,
               pglimit_token_step(c.win, c.lim) AS tb_step
        FROM cur c
    ), cur2 AS (
        SELECT s.*, CASE WHEN s.algo = 1 THEN pglimit_sliding_weight(s.sw_p, s.win, now_us) END AS sw_w
        FROM st s
    ), cur3 AS (
        SELECT c.*,
               CASE c.algo WHEN 0 THEN c.f_c + c.cost <= c.lim
                           WHEN 1 THEN c.sw_w + c.sw_c + c.cost <= c.lim
                           WHEN 2 THEN cardinality(c.lg) + c.cost <= c.lim
                           WHEN 4 THEN cardinality(c.lg) + c.cost <= c.lim
                           WHEN 3 THEN pglimit_token_fits(c.tb_tat, c.cost * c.tb_step, c.tb_step * c.lim, now_us)
               END AS fit
        FROM cur2 c
    ), dec AS (
        SELECT c.*,
               c.cost > 0 AND bool_and(c.fit AND c.until_us IS NULL) OVER (PARTITION BY c.chk) AS admit,
               -- Denied by its own count: its lockout starts now.
               NOT c.fit AND c.until_us IS NULL AND coalesce(c.bf, 0) > 0 AS locks
        FROM cur3 c
    ), fig AS (
        -- The figures and the next state: admitted, or as it stands.
        SELECT d.*, n.*,
               coalesce(d.until_us, CASE WHEN d.locks THEN now_us + d.bf * 1000 END) AS block_us
        FROM dec d CROSS JOIN LATERAL (SELECT
            CASE WHEN d.admit THEN d.cost ELSE 0 END AS used,
            CASE WHEN d.admit AND d.algo = 2
                 THEN d.lg || array_fill(now_us, ARRAY[d.cost::integer])
                 WHEN d.admit AND d.algo = 4
                 THEN ARRAY(SELECT x FROM unnest(d.lg || array_fill(now_us + d.win, ARRAY[d.cost::integer])) AS x ORDER BY x)
                 ELSE d.lg END AS n_lg
        ) AS u CROSS JOIN LATERAL (SELECT
            CASE d.algo
                WHEN 0 THEN greatest(d.lim - d.f_c - u.used, 0)
                WHEN 1 THEN greatest(d.lim - d.sw_w - d.sw_c - u.used, 0)
                WHEN 2 THEN greatest(d.lim - cardinality(u.n_lg), 0)
                WHEN 4 THEN greatest(d.lim - cardinality(u.n_lg), 0)
                WHEN 3 THEN greatest((now_us + d.tb_step * d.lim - d.tb_tat - u.used * d.tb_step) / d.tb_step, 0)
            END AS rem,
            CASE d.algo
                WHEN 0 THEN d.f_end
                WHEN 1 THEN CASE WHEN d.sw_c + u.used > 0 THEN d.sw_start + 2 * d.win
                                 WHEN d.sw_p > 0 THEN d.sw_start + d.win ELSE now_us END
                WHEN 2 THEN coalesce(u.n_lg[cardinality(u.n_lg)] + d.win, now_us)
                WHEN 4 THEN coalesce(u.n_lg[cardinality(u.n_lg)], now_us)
                WHEN 3 THEN d.tb_tat + u.used * d.tb_step
            END AS full_us,
            CASE WHEN d.fit THEN NULL ELSE CASE d.algo
                WHEN 0 THEN d.f_end
                WHEN 1 THEN pglimit_sliding_retry(d.lim, d.win, d.sw_start, d.sw_c, d.sw_p, d.cost)
                WHEN 2 THEN coalesce(d.lg[cardinality(d.lg) + d.cost - d.lim] + d.win, now_us)
                WHEN 4 THEN coalesce(d.lg[cardinality(d.lg) + d.cost - d.lim], now_us)
                WHEN 3 THEN d.tb_tat + d.cost * d.tb_step - d.tb_step * d.lim
            END END AS retry_us,
            u.n_lg
        ) AS n
    ), up AS (
        UPDATE pglimit_buckets t SET
            count      = CASE f.algo WHEN 0 THEN f.f_c + f.cost WHEN 1 THEN f.sw_c + f.cost ELSE 0 END,
            prev_count = CASE WHEN f.algo = 1 THEN f.sw_p ELSE 0 END,
            expires_at = pglimit_ts(CASE f.algo WHEN 1 THEN f.sw_start + 2 * f.win ELSE f.full_us END),
            tat_us     = CASE WHEN f.algo = 3 THEN f.full_us END,
            log        = CASE WHEN f.algo IN (2, 4) THEN f.n_lg END
        FROM fig f WHERE f.admit AND t.key = f.key
    ), lk AS (
        -- Lockouts, in key order like every other lock here. An operator's
        -- block that ends later is kept as it is.
        INSERT INTO pglimit_blocks AS k (key, until, kind, policy, bucket)
        SELECT f.key, pglimit_ts(f.block_us), 'lockout', split_part(f.name, '/', 1), split_part(f.name, '/', 2)
        FROM fig f WHERE f.locks ORDER BY f.key
        ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, kind = 'lockout',
            policy = EXCLUDED.policy, bucket = EXCLUDED.bucket, reason = NULL, created_at = now()
        WHERE k.until < EXCLUDED.until
    ), ls AS (
        -- Each admitted check's lease (leases.sql), ending as its entries do.
        INSERT INTO pglimit_leases (id, key, slots, lease_us, expires_at, ends_by)
        SELECT p_leases[f.pos], f.key, f.cost, f.win, pglimit_ts(now_us + f.win),
               pglimit_lease_ends_by(now_us, p_lease_lives[f.pos])
        FROM fig f WHERE f.admit AND f.algo = 4 AND octet_length(p_leases[f.pos]) = 32
        ORDER BY 1, 2
        ON CONFLICT DO NOTHING
    )
    SELECT f.pos, f.fit AND f.until_us IS NULL,
           CASE WHEN f.block_us IS NULL THEN f.rem ELSE 0 END,
           pglimit_ts(greatest(f.full_us, f.block_us)),
           pglimit_ts(CASE WHEN f.block_us IS NULL THEN f.retry_us
                           ELSE greatest(coalesce(f.retry_us, 0), f.block_us) END),
           v_now, f.block_us IS NOT NULL
    FROM fig f ORDER BY f.pos;
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
