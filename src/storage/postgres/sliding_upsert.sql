-- One-bucket sliding-window checks as one plain multi-row upsert (see
-- SLIDING_UPSERT in upsert.rs): $1 each check's key, $2 limit, $3 window
-- (ms), $4 cost, $5 the clock (NULL: the database's).
--
-- The sliding window counter (pglimit_decide, algo 1) keeps the current
-- window's count and the previous one's; windows are aligned on the clock,
-- and a row ends one window after its current window (end_at). The
-- proposed row is the state a first check leaves. The row has no column to
-- spare for the limit and the window, so the conflict branch reads them at
-- the key's place in $1 (no key appears twice here).
WITH clock AS (
    SELECT coalesce($5::timestamptz, now()) AS at,
           (extract(epoch FROM coalesce($5::timestamptz, now())) * 1000000)::bigint AS now_us
), req AS (
    SELECT r.key, r.lim, r.win * 1000 AS win_us, r.cost, r.pos::integer AS pos, c.at, c.now_us,
           timestamptz 'epoch' + (c.now_us / (r.win * 1000) + 2) * r.win * 1000 * interval '1 microsecond' AS end_at
    FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS r(key, lim, win, cost, pos),
         clock c
), blk AS (
    SELECT k.key, k.until FROM pglimit_blocks k
    WHERE k.key = ANY ($1::bytea[]) AND k.until > coalesce($5::timestamptz, now())
), up AS (
    INSERT INTO pglimit_buckets AS b (key, count, expires_at, prev_count)
    SELECT key, cost, end_at, 0 FROM req
    WHERE cost <= lim AND NOT EXISTS (SELECT 1 FROM blk WHERE blk.key = req.key) ORDER BY key
    ON CONFLICT (key) DO UPDATE SET
        count      = CASE WHEN b.expires_at = EXCLUDED.expires_at THEN b.count ELSE 0 END + EXCLUDED.count,
        prev_count = pglimit_sliding_prev(b.count, b.prev_count, b.expires_at, EXCLUDED.expires_at,
                                          ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)] * 1000),
        expires_at = EXCLUDED.expires_at
    WHERE pglimit_sliding_weight(pglimit_sliding_prev(b.count, b.prev_count, b.expires_at, EXCLUDED.expires_at,
                                                      ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)] * 1000),
                                 ($3::bigint[])[array_position($1::bytea[], EXCLUDED.key)] * 1000,
                                 (SELECT now_us FROM clock))
          + CASE WHEN b.expires_at = EXCLUDED.expires_at THEN b.count ELSE 0 END + EXCLUDED.count
          <= ($2::bigint[])[array_position($1::bytea[], EXCLUDED.key)]
    RETURNING b.key, b.count, b.prev_count, b.expires_at
)
SELECT r.pos AS o_pos,
       -- Denied on its locked row but admitted on the statement's snapshot:
       -- the row changed in between, and the figures below would contradict
       -- the denial; the batch is decided again with locks (upsert.rs).
       CASE WHEN d.allowed AND k.key IS NULL THEN pglimit_retry_with_locks()
            ELSE u.key IS NOT NULL END AS o_allowed,
       CASE WHEN u.key IS NOT NULL
            THEN greatest(r.lim - pglimit_sliding_weight(u.prev_count, r.win_us, r.now_us) - u.count, 0)
            WHEN k.key IS NOT NULL THEN 0
            ELSE d.remaining END AS o_remaining,
       greatest(coalesce(u.expires_at, timestamptz 'epoch' + d.full_us * interval '1 microsecond'), k.until) AS o_reset_at,
       CASE WHEN u.key IS NULL
            THEN greatest(timestamptz 'epoch' + d.retry_us * interval '1 microsecond', k.until) END AS o_retry_at,
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
    CROSS JOIN LATERAL pglimit_decide(1::smallint, s.count, s.prev_count,
                                      (extract(epoch FROM s.expires_at) * 1000000)::bigint, NULL, NULL,
                                      r.lim, r.win_us, r.cost, r.now_us, false) AS d
    WHERE u.key IS NULL OFFSET 0
) d ON true
ORDER BY r.pos
