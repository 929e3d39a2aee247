-- One-bucket checks of the sliding window, the sliding log and the token
-- bucket as one plain multi-row upsert (see ALGORITHMS_UPSERT in upsert.rs):
-- $1 each check's key, $2 limit, $3 window (ms), $4 cost, $5 the clock
-- (NULL: the database's), $6 the algorithm (1 sliding window, 2 sliding log,
-- 3 token bucket).
--
-- The arithmetic is algorithms.sql's. The sliding window counter keeps the current
-- window's count and the previous one's; windows are aligned on the clock,
-- and a row ends one window after its current window (end_at). The sliding
-- log keeps a timestamp per unit admitted in the last window. The proposed
-- row is the state a first check leaves, and a sliding log's is the one
-- with a log. The token bucket (GCRA) keeps its theoretical arrival time in
-- tat_us; its proposed row carries, in tat_us, now + cost * step, so that
-- the branch adds cost * step as tat_us - now, and the capacity
-- (step * limit) in prev_count, which it does not read. The sliding rows
-- have no column to spare for the limit and the window, so the branch reads
-- them at the key's place in $1 (no key appears twice here).
WITH clock AS (
    SELECT coalesce($5::timestamptz, now()) AS at,
           pglimit_us(coalesce($5::timestamptz, now())) AS now_us
), req AS (
    SELECT q.*, pglimit_ts(CASE
                     WHEN q.algo = pglimit_sliding_window() THEN pglimit_sliding_row_end(q.now_us, q.win_us)
                     WHEN q.algo = pglimit_token_bucket()
                     THEN ((q.now_us + q.cost * q.step) / greatest(q.step * q.lim, 1) + 1) * q.step * q.lim
                     ELSE ((q.now_us + q.win_us) / q.win_us + 1) * q.win_us END) AS end_at
    FROM (
        SELECT r.key, r.lim, r.win * 1000 AS win_us, r.cost, r.algo, r.pos::integer AS pos, c.at, c.now_us,
               CASE WHEN r.algo = pglimit_token_bucket() THEN pglimit_token_step(r.win * 1000, r.lim) END AS step
        FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[], $6::smallint[])
             WITH ORDINALITY AS r(key, lim, win, cost, algo, pos),
             clock c
    ) q
), blk AS (
    SELECT k.key, k.until FROM pglimit_blocks k
    WHERE k.key = ANY ($1::bytea[]) AND k.until > coalesce($5::timestamptz, now())
), up AS (
    -- A token bucket's and a sliding log's row end, for the cleanup, at the
    -- first multiple of its capacity (a window) after their exact end, so
    -- that expires_at, an indexed column, changes once a window and most
    -- updates stay HOT (docs/performance.md); neither algorithm reads it.
    INSERT INTO pglimit_buckets AS b (key, count, expires_at, prev_count, log, tat_us)
    SELECT key, CASE WHEN algo = pglimit_sliding_window() THEN cost ELSE 0 END, end_at,
           CASE WHEN algo = pglimit_token_bucket() THEN step * lim ELSE 0 END,
           CASE WHEN algo = pglimit_sliding_log() THEN pglimit_log_take('{}', cost, now_us) END,
           CASE WHEN algo = pglimit_token_bucket() THEN now_us + cost * step END
    FROM req
    WHERE cost <= lim AND NOT EXISTS (SELECT 1 FROM blk WHERE blk.key = req.key) ORDER BY key
    ON CONFLICT (key) DO UPDATE SET
        count      = CASE WHEN EXCLUDED.tat_us IS NOT NULL THEN 0
                          WHEN EXCLUDED.log IS NULL
                          THEN pglimit_sliding_current(b.count, b.expires_at, EXCLUDED.expires_at) + EXCLUDED.count
                          ELSE 0 END,
        prev_count = CASE WHEN EXCLUDED.log IS NULL AND EXCLUDED.tat_us IS NULL
                          THEN pglimit_sliding_previous(b.count, b.prev_count, b.expires_at, EXCLUDED.expires_at,
                                                        EXCLUDED.expires_at - ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)]
                                                                              * interval '1 millisecond')
                          ELSE 0 END,
        expires_at = CASE WHEN EXCLUDED.tat_us IS NOT NULL
                          THEN greatest(b.expires_at, pglimit_ts(
                                        ((pglimit_token_tat(b.tat_us, (SELECT now_us FROM clock)) + EXCLUDED.tat_us
                                          - (SELECT now_us FROM clock)) / EXCLUDED.prev_count + 1) * EXCLUDED.prev_count))
                          WHEN EXCLUDED.log IS NOT NULL THEN greatest(b.expires_at, EXCLUDED.expires_at)
                          ELSE EXCLUDED.expires_at END,
        tat_us     = CASE WHEN EXCLUDED.tat_us IS NOT NULL
                          THEN pglimit_token_tat(b.tat_us, (SELECT now_us FROM clock)) + EXCLUDED.tat_us
                               - (SELECT now_us FROM clock) END,
        -- The entries still in the window, then this check's.
        log        = CASE WHEN EXCLUDED.log IS NOT NULL
                          THEN ARRAY(SELECT x FROM unnest(b.log) AS x
                                     WHERE pglimit_log_keeps(x, (SELECT now_us FROM clock),
                                                             ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)] * 1000)
                                     ORDER BY x) || EXCLUDED.log END
    WHERE CASE WHEN EXCLUDED.tat_us IS NOT NULL
               THEN pglimit_token_fits(pglimit_token_tat(b.tat_us, (SELECT now_us FROM clock)),
                                       EXCLUDED.tat_us - (SELECT now_us FROM clock), EXCLUDED.prev_count,
                                       (SELECT now_us FROM clock))
               ELSE CASE WHEN EXCLUDED.log IS NULL
                    THEN pglimit_fits(pglimit_sliding_weight(
                             pglimit_sliding_previous(b.count, b.prev_count, b.expires_at, EXCLUDED.expires_at,
                                                      EXCLUDED.expires_at - ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)]
                                                                            * interval '1 millisecond'),
                             ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)] * 1000,
                             (SELECT now_us FROM clock))
                         + pglimit_sliding_current(b.count, b.expires_at, EXCLUDED.expires_at),
                         EXCLUDED.count, ($2::bigint[])[array_position($1::bytea[], EXCLUDED.key)])
                    ELSE pglimit_fits((SELECT count(*) FROM unnest(b.log) AS x
                                       WHERE pglimit_log_keeps(x, (SELECT now_us FROM clock),
                                                               ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)] * 1000)),
                                      cardinality(EXCLUDED.log), ($2::bigint[])[array_position($1::bytea[], EXCLUDED.key)]) END
               END
    RETURNING b.key, b.count, b.prev_count, b.expires_at, b.tat_us, cardinality(b.log) AS entries
)
SELECT r.pos AS o_pos,
       -- Denied on its locked row but admitted on the statement's snapshot:
       -- the row changed in between, and the figures below would contradict
       -- the denial; the batch is decided again with locks (upsert.rs).
       CASE WHEN d.allowed AND k.key IS NULL THEN pglimit_retry_with_locks()
            ELSE u.key IS NOT NULL END AS o_allowed,
       CASE WHEN u.key IS NOT NULL AND r.algo = pglimit_sliding_log() THEN pglimit_room(r.lim, u.entries)
            WHEN u.key IS NOT NULL AND r.algo = pglimit_token_bucket()
            THEN pglimit_token_remaining(u.tat_us, r.step, r.lim, r.now_us)
            WHEN u.key IS NOT NULL
            THEN pglimit_room(r.lim, pglimit_sliding_weight(u.prev_count, r.win_us, r.now_us) + u.count)
            WHEN k.key IS NOT NULL THEN 0
            ELSE d.remaining END AS o_remaining,
       -- An admitted token bucket's and sliding log's row ends later than
       -- their figures say (the INSERT above).
       greatest(coalesce(CASE WHEN u.key IS NULL THEN NULL
                              WHEN r.algo = pglimit_sliding_window() THEN u.expires_at
                              WHEN r.algo = pglimit_sliding_log() THEN pglimit_ts(pglimit_log_full(ARRAY[r.now_us], r.win_us, r.now_us))
                              ELSE pglimit_ts(u.tat_us) END,
                         pglimit_ts(d.full_us)), k.until) AS o_reset_at,
       CASE WHEN u.key IS NULL
            THEN greatest(pglimit_ts(d.retry_us), k.until) END AS o_retry_at,
       r.at AS o_now,
       k.key IS NOT NULL AS o_blocked
FROM req r
LEFT JOIN up u ON u.key = r.key
LEFT JOIN blk k ON k.key = r.key
LEFT JOIN LATERAL (
    -- A denied check's figures, from the statement's snapshot, by the
    -- model's SQL translation (a row absent from it counts as new).
    SELECT d.* FROM (SELECT NULL) AS one
    LEFT JOIN pglimit_buckets s ON s.key = r.key
    CROSS JOIN LATERAL pglimit_decide(r.algo, s.count, s.prev_count,
                                      pglimit_us(s.expires_at), s.tat_us, s.log,
                                      r.lim, r.win_us, r.cost, r.now_us, false) AS d
    WHERE u.key IS NULL OFFSET 0
) d ON true
ORDER BY r.pos
