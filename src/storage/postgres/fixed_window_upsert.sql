-- Fixed-window checks as one plain multi-row upsert (see FIXED_WINDOW_UPSERT
-- in statements.rs): $1 each bucket's check, $2 its key, $3 limit, $4 window
-- (ms), $5 the check's cost, $6 the clock (NULL: the database's).
WITH req AS (
    SELECT r.chk, r.key, r.lim, r.win, r.cost, r.pos::integer AS pos, coalesce($6::timestamptz, now()) AS at,
           count(*) OVER (PARTITION BY r.chk) AS n
    FROM unnest($1::integer[], $2::bytea[], $3::bigint[], $4::bigint[], $5::bigint[])
         WITH ORDINALITY AS r(chk, key, lim, win, cost, pos)
), blk AS (
    SELECT k.key, k.until FROM pglimit_blocks k
    WHERE k.key = ANY ($2::bytea[]) AND k.until > coalesce($6::timestamptz, now())
), snap AS (
    -- A check of several buckets goes ahead only if each of them fits as
    -- this statement's snapshot has it (c: the count in the live window).
    SELECT r.*, v.c, v.end_at, k.until,
           bool_and(k.key IS NULL AND r.cost <= r.lim - coalesce(v.c, 0)) OVER (PARTITION BY r.chk) AS go
    FROM req r
    LEFT JOIN blk k ON k.key = r.key
    LEFT JOIN LATERAL (
        SELECT CASE WHEN s.expires_at > r.at THEN s.count ELSE 0 END AS c,
               CASE WHEN s.expires_at > r.at THEN s.expires_at END AS end_at
        FROM pglimit_buckets s WHERE r.n > 1 AND s.key = r.key OFFSET 0
    ) v ON true
), up AS (
    INSERT INTO pglimit_buckets AS b (key, count, expires_at, prev_count)
    SELECT key, cost, at + win * interval '1 millisecond', lim FROM snap
    WHERE cost <= lim AND until IS NULL AND (n = 1 OR go) ORDER BY key
    ON CONFLICT (key) DO UPDATE SET
        count      = CASE WHEN b.expires_at <= coalesce($6::timestamptz, now())
                          THEN EXCLUDED.count ELSE b.count + EXCLUDED.count END,
        expires_at = CASE WHEN b.expires_at <= coalesce($6::timestamptz, now())
                          THEN EXCLUDED.expires_at ELSE b.expires_at END,
        prev_count = 0
    WHERE (b.expires_at <= coalesce($6::timestamptz, now()) OR b.count + EXCLUDED.count <= EXCLUDED.prev_count)
      AND EXCLUDED.count <= EXCLUDED.prev_count
    RETURNING b.key, b.count, b.expires_at
)
SELECT r.pos AS o_pos,
       CASE WHEN r.n > 1 AND r.go AND u.key IS NULL THEN pglimit_retry_with_locks()
            WHEN r.n = 1 THEN u.key IS NOT NULL
            ELSE r.until IS NULL AND r.cost <= r.lim - coalesce(r.c, 0) END AS o_allowed,
       CASE WHEN u.key IS NOT NULL THEN r.lim - u.count
            WHEN r.until IS NOT NULL THEN 0
            WHEN r.n > 1 THEN greatest(r.lim - coalesce(r.c, 0), 0)
            ELSE greatest(0, least(coalesce(r.lim - s.count, 0), r.cost - 1)) END AS o_remaining,
       greatest(coalesce(u.expires_at, CASE WHEN r.n > 1 THEN coalesce(r.end_at, r.at + r.win * interval '1 millisecond') END,
                         s.expires_at, r.at + r.win * interval '1 millisecond'), r.until) AS o_reset_at,
       CASE WHEN u.key IS NULL
            THEN greatest(CASE WHEN r.n = 1 THEN coalesce(s.expires_at, r.at + r.win * interval '1 millisecond')
                               WHEN r.cost > r.lim - coalesce(r.c, 0)
                               THEN coalesce(r.end_at, r.at + r.win * interval '1 millisecond') END,
                          r.until) END AS o_retry_at,
       r.at AS o_now,
       r.until IS NOT NULL AS o_blocked
FROM snap r
LEFT JOIN up u ON u.key = r.key
LEFT JOIN LATERAL (
    SELECT s.count, s.expires_at FROM pglimit_buckets s WHERE u.key IS NULL AND r.n = 1 AND s.key = r.key OFFSET 0
) s ON true
ORDER BY r.pos
