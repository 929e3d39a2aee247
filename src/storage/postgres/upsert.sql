-- One-bucket fixed-window checks as one plain multi-row upsert (see
-- ONE_BUCKET_UPSERT in upsert.rs), with algorithms.sql's arithmetic: $1 each check's key, $2 limit,
-- $3 window (ms), $4 cost, $5 the clock (NULL: the database's).
WITH req AS (
    SELECT r.key, r.lim, r.win, r.cost, r.pos::integer AS pos, coalesce($5::timestamptz, now()) AS at,
           coalesce($5::timestamptz, now()) + r.win * interval '1 millisecond' AS new_end
    FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS r(key, lim, win, cost, pos)
), blk AS (
    SELECT k.key, k.until FROM {{blocks}} k
    WHERE {{route k}}k.key = ANY ($1::bytea[]) AND k.until > coalesce($5::timestamptz, now())
), up AS (
    INSERT INTO {{buckets}} AS b ({{key}}, count, expires_at, prev_count)
    SELECT {{route_value}}key, cost, new_end, lim FROM req
    WHERE {{in_turn}}cost <= lim AND NOT EXISTS (SELECT 1 FROM blk WHERE blk.key = req.key) ORDER BY key
    ON CONFLICT ({{key}}) DO UPDATE SET
        count      = pglimit_fixed_count(b.count, b.expires_at, coalesce($5::timestamptz, now())) + EXCLUDED.count,
        expires_at = pglimit_fixed_end(b.expires_at, coalesce($5::timestamptz, now()), EXCLUDED.expires_at),
        prev_count = 0
    WHERE pglimit_fits(pglimit_fixed_count(b.count, b.expires_at, coalesce($5::timestamptz, now())),
                       EXCLUDED.count, EXCLUDED.prev_count)
    RETURNING b.key, b.count, b.expires_at
)
SELECT r.pos AS o_pos,
       u.key IS NOT NULL AS o_allowed,
       CASE WHEN u.key IS NOT NULL THEN pglimit_room(r.lim, u.count)
            WHEN k.key IS NOT NULL THEN 0
            ELSE least(pglimit_room(r.lim, coalesce(s.count, r.lim)), r.cost - 1) END AS o_remaining,
       greatest(coalesce(u.expires_at, s.ends, r.new_end), k.until) AS o_reset_at,
       CASE WHEN u.key IS NOT NULL THEN NULL
            WHEN k.key IS NULL THEN coalesce(u.expires_at, s.ends, r.new_end)
            -- Blocked: retry when the block ends, or the window if it is full too.
            WHEN pglimit_fits(coalesce(s.counted, 0), r.cost, r.lim) THEN k.until
            ELSE greatest(s.ends, k.until) END AS o_retry_at,
       r.at AS o_now,
       k.key IS NOT NULL AS o_blocked
FROM req r
LEFT JOIN up u ON u.key = r.key
LEFT JOIN blk k ON k.key = r.key
LEFT JOIN LATERAL (
    SELECT s.count, pglimit_fixed_count(s.count, s.expires_at, r.at) AS counted,
           pglimit_fixed_end(s.expires_at, r.at, r.new_end) AS ends
    FROM {{buckets}} s WHERE u.key IS NULL AND {{route s}}s.key = r.key OFFSET 0
) s ON true
ORDER BY r.pos
