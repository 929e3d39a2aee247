-- One-bucket fixed-window checks where a key may come more than once (a hot
-- key), each key's checks alike in limit, window and cost (see
-- HOT_UPSERT in upsert.rs): upsert.sql with the checks of a key proposed as
-- one row. In arrival order a key's checks fit until the first that does
-- not, so the row takes k of its n checks, k = least(n, room / cost): one
-- row lock and one write for the lot, where pglimit_check_batch decides
-- them one by one. $1 each check's key, $2 limit, $3 window (ms), $4 cost,
-- $5 the clock (NULL: the database's).
--
-- The proposed row carries the limit in prev_count, k as if the row were
-- new in tat_us (which a fixed window does not use) and k * cost in count
-- (so EXCLUDED.count / EXCLUDED.tat_us is the cost, k being at least 1);
-- the conflict branch writes the k it admits to tat_us, so that RETURNING
-- says which of the key's checks were admitted: the first k.
WITH req AS (
    SELECT r.key, r.lim, r.win, r.cost, r.pos::integer AS pos, coalesce($5::timestamptz, now()) AS at,
           coalesce($5::timestamptz, now()) + r.win * interval '1 millisecond' AS new_end,
           row_number() OVER (PARTITION BY r.key ORDER BY r.pos) AS nth
    FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS r(key, lim, win, cost, pos)
), grp AS (
    SELECT lim, win, cost, at, new_end, key, pglimit_fixed_takes(count(*), lim, cost) AS fit FROM req
    GROUP BY key, lim, win, cost, at, new_end
), blk AS (
    SELECT k.key, k.until FROM {{blocks}} k
    WHERE {{route k}}k.key = ANY ($1::bytea[]) AND k.until > coalesce($5::timestamptz, now())
), up AS (
    INSERT INTO {{buckets}} AS b ({{key}}, count, expires_at, prev_count, tat_us)
    SELECT {{route_value}}key, fit * cost, new_end, lim, fit FROM grp
    WHERE {{in_turn}}cost <= lim AND NOT EXISTS (SELECT 1 FROM blk WHERE blk.key = grp.key) ORDER BY key
    ON CONFLICT ({{key}}) DO UPDATE SET
        count      = pglimit_fixed_count(b.count, b.expires_at, coalesce($5::timestamptz, now()))
                     + EXCLUDED.count / EXCLUDED.tat_us * pglimit_fixed_takes(EXCLUDED.tat_us,
                         EXCLUDED.prev_count - pglimit_fixed_count(b.count, b.expires_at, coalesce($5::timestamptz, now())),
                         EXCLUDED.count / EXCLUDED.tat_us),
        expires_at = pglimit_fixed_end(b.expires_at, coalesce($5::timestamptz, now()), EXCLUDED.expires_at),
        prev_count = 0,
        tat_us     = pglimit_fixed_takes(EXCLUDED.tat_us,
                         EXCLUDED.prev_count - pglimit_fixed_count(b.count, b.expires_at, coalesce($5::timestamptz, now())),
                         EXCLUDED.count / EXCLUDED.tat_us)
    WHERE pglimit_fits(pglimit_fixed_count(b.count, b.expires_at, coalesce($5::timestamptz, now())),
                       EXCLUDED.count / EXCLUDED.tat_us, EXCLUDED.prev_count)
    RETURNING b.key, b.count, b.expires_at, b.tat_us AS fit
)
SELECT r.pos AS o_pos,
       r.nth <= coalesce(u.fit, 0) AS o_allowed,
       CASE WHEN u.key IS NOT NULL THEN pglimit_room(r.lim, u.count) + greatest(u.fit - r.nth, 0) * r.cost
            WHEN k.key IS NOT NULL THEN 0
            ELSE least(pglimit_room(r.lim, coalesce(s.count, r.lim)), r.cost - 1) END AS o_remaining,
       greatest(coalesce(u.expires_at, s.ends, r.new_end), k.until) AS o_reset_at,
       CASE WHEN r.nth <= coalesce(u.fit, 0) THEN NULL
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
