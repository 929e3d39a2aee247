-- Checks of several fixed-window buckets (policies), with one-bucket
-- fixed-window and token-bucket checks, as one plain multi-row upsert (see
-- POLICY_UPSERT in upsert.rs): $1 each bucket's
-- check, $2 its key, $3 limit, $4 window (ms), $5 the check's cost, $6 the
-- clock (NULL: the database's), $7 the algorithm (0 fixed window, 3 token
-- bucket), $8 how many buckets its check has.
--
-- The proposed row carries what the conflict branch needs: for a fixed
-- window the limit in prev_count; for a token bucket the capacity
-- (step * limit, in µs) in prev_count and, in tat_us, now + cost * step, so
-- that the branch adds cost * step as tat_us - now. Neither algorithm reads
-- the column it borrows.
WITH clock AS (
    -- The clock in µs, once: the conflict branch below reads it too.
    SELECT pglimit_us(coalesce($6::timestamptz, now())) AS now_us
), req AS (
    SELECT r.chk, r.key, r.lim, r.win, r.cost, r.algo, r.n, r.pos::integer AS pos, at,
           CASE WHEN r.algo = pglimit_token_bucket() THEN (SELECT now_us FROM clock) END AS at_us,
           CASE WHEN r.algo = pglimit_token_bucket() THEN pglimit_token_step(r.win * 1000, r.lim) END AS step
    FROM unnest($1::integer[], $2::bytea[], $3::bigint[], $4::bigint[], $5::bigint[], $7::smallint[], $8::integer[])
         WITH ORDINALITY AS r(chk, key, lim, win, cost, algo, n, pos),
         coalesce($6::timestamptz, now()) AS at
), blk AS (
    SELECT k.key, k.until FROM {{blocks}} k
    WHERE {{route k}}k.key = ANY ($2::bytea[]) AND k.until > coalesce($6::timestamptz, now())
), multi AS MATERIALIZED (
    -- The buckets of checks of several (fixed-window) buckets, as this
    -- statement's snapshot has them (c: the live count); such a check goes
    -- ahead only if each of its buckets fits there.
    SELECT r.pos, r.chk, v.c, v.end_at, k.key IS NULL AND pglimit_fits(coalesce(v.c, 0), r.cost, r.lim) AS fits
    FROM req r
    LEFT JOIN blk k ON k.key = r.key
    LEFT JOIN LATERAL (
        SELECT pglimit_fixed_count(s.count, s.expires_at, r.at) AS c,
               pglimit_fixed_end(s.expires_at, r.at, NULL) AS end_at
        FROM {{buckets}} s WHERE {{route s}}s.key = r.key
    ) v ON true
    WHERE r.n > 1
), snap AS (
    SELECT r.*, m.c, m.end_at, k.until, g.go
    FROM req r
    LEFT JOIN blk k ON k.key = r.key
    LEFT JOIN multi m ON m.pos = r.pos
    LEFT JOIN (SELECT chk, bool_and(fits) AS go FROM {{multi}} GROUP BY chk) g ON g.chk = r.chk
), up AS (
    INSERT INTO {{buckets}} AS b ({{key}}, count, expires_at, prev_count, tat_us)
    SELECT {{route_value}}key,
           CASE WHEN algo = pglimit_token_bucket() THEN 0 ELSE cost END,
           CASE WHEN algo = pglimit_token_bucket() THEN pglimit_ts(at_us + cost * step)
                ELSE at + win * interval '1 millisecond' END,
           CASE WHEN algo = pglimit_token_bucket() THEN step * lim ELSE lim END,
           CASE WHEN algo = pglimit_token_bucket() THEN at_us + cost * step END
    FROM snap WHERE {{in_turn}}cost <= lim AND until IS NULL AND (n = 1 OR go) ORDER BY key
    ON CONFLICT ({{key}}) DO UPDATE SET
        count      = CASE WHEN EXCLUDED.tat_us IS NOT NULL THEN 0
                          ELSE pglimit_fixed_count(b.count, b.expires_at, coalesce($6::timestamptz, now()))
                               + EXCLUDED.count END,
        expires_at = CASE WHEN EXCLUDED.tat_us IS NOT NULL
                          THEN pglimit_ts(pglimit_token_tat(b.tat_us, (SELECT now_us FROM clock)) + EXCLUDED.tat_us
                                          - (SELECT now_us FROM clock))
                          ELSE pglimit_fixed_end(b.expires_at, coalesce($6::timestamptz, now()), EXCLUDED.expires_at) END,
        prev_count = 0,
        tat_us     = CASE WHEN EXCLUDED.tat_us IS NOT NULL
                          THEN pglimit_token_tat(b.tat_us, (SELECT now_us FROM clock)) + EXCLUDED.tat_us
                               - (SELECT now_us FROM clock) END
    WHERE CASE WHEN EXCLUDED.tat_us IS NOT NULL
               THEN pglimit_token_fits(pglimit_token_tat(b.tat_us, (SELECT now_us FROM clock)),
                                       EXCLUDED.tat_us - (SELECT now_us FROM clock), EXCLUDED.prev_count,
                                       (SELECT now_us FROM clock))
               ELSE pglimit_fits(pglimit_fixed_count(b.count, b.expires_at, coalesce($6::timestamptz, now())),
                                 EXCLUDED.count, EXCLUDED.prev_count) END
    RETURNING b.key, b.count, b.expires_at, b.tat_us
)
SELECT r.pos AS o_pos,
       CASE WHEN r.n > 1 AND r.go AND u.key IS NULL THEN pglimit_retry_with_locks()
            WHEN r.n = 1 THEN u.key IS NOT NULL
            ELSE r.until IS NULL AND pglimit_fits(coalesce(r.c, 0), r.cost, r.lim) END AS o_allowed,
       CASE WHEN u.key IS NOT NULL AND r.algo = pglimit_token_bucket()
            THEN pglimit_token_remaining(u.tat_us, r.step, r.lim, r.at_us)
            WHEN u.key IS NOT NULL THEN pglimit_room(r.lim, u.count)
            WHEN r.until IS NOT NULL THEN 0
            WHEN r.n > 1 THEN pglimit_room(r.lim, coalesce(r.c, 0))
            WHEN r.algo = pglimit_token_bucket()
            THEN least(pglimit_token_remaining(s.tat, r.step, r.lim, r.at_us), r.cost - 1)
            ELSE least(pglimit_room(r.lim, coalesce(s.count, r.lim)), r.cost - 1) END AS o_remaining,
       greatest(coalesce(u.expires_at,
                         CASE WHEN r.n > 1 THEN coalesce(r.end_at, r.at + r.win * interval '1 millisecond') END,
                         CASE WHEN r.algo = pglimit_token_bucket() THEN pglimit_ts(s.tat) END,
                         s.expires_at, r.at + r.win * interval '1 millisecond'), r.until) AS o_reset_at,
       CASE WHEN u.key IS NULL
            THEN greatest(CASE WHEN r.algo = pglimit_token_bucket()
                               THEN pglimit_ts(pglimit_token_retry(s.tat, r.cost, r.step, r.lim))
                               WHEN r.n = 1 THEN coalesce(s.expires_at, r.at + r.win * interval '1 millisecond')
                               WHEN NOT pglimit_fits(coalesce(r.c, 0), r.cost, r.lim)
                               THEN coalesce(r.end_at, r.at + r.win * interval '1 millisecond') END,
                          r.until) END AS o_retry_at,
       r.at AS o_now,
       r.until IS NOT NULL AS o_blocked
FROM snap r
LEFT JOIN up u ON u.key = r.key
LEFT JOIN LATERAL (
    -- A denied one-bucket check's row as the snapshot has it; a token
    -- bucket's row another instance created after the snapshot is taken
    -- as full.
    SELECT s.count, s.expires_at,
           CASE WHEN s.key IS NULL THEN r.at_us + r.step * r.lim ELSE pglimit_token_tat(s.tat_us, r.at_us) END AS tat
    FROM (SELECT NULL) AS one
    LEFT JOIN {{buckets}} s ON {{route s}}s.key = r.key
    WHERE u.key IS NULL AND r.n = 1 OFFSET 0
) s ON true
ORDER BY r.pos
