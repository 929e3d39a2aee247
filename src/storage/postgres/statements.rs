//! The two statements a lane sends. Both decide a batch of checks in one
//! round trip and one transaction, and answer one row per bucket:
//! position (1-based), allowed, remaining, reset_at, retry_at, now.

use std::collections::HashSet;

use super::lane::Job;
use crate::algorithm::Algorithm;

/// The general case: any algorithms, any number of buckets per check, keys
/// shared between checks (a hot key). See `migrations/..._batch.sql`.
pub const GENERAL: &str = "SELECT * FROM pglimit_check_batch($1, $2, $3, $4, $5, $6, $7)";

/// The common case as one plain multi-row upsert, no PL/pgSQL: every check
/// has one fixed-window bucket, costs at least 1, and no two checks share a
/// key. Checks are then independent, so each row is decided on its own:
/// the upsert resets an expired window or adds the cost only where it fits
/// (`WHERE`), and a row it does not update is a denial. The limit travels in
/// the proposed row's `prev_count`, which the fixed window does not use, so
/// that the `WHERE` can read it as `EXCLUDED.prev_count`. Rows are proposed
/// in key order, the same lock order as the general function.
///
/// A denied row's figures are read from the statement's snapshot; if another
/// instance changed the row between that snapshot and our lock, they may be
/// a moment old (the decision itself is made on the locked row). `remaining`
/// is capped below the cost so that it never contradicts the denial, and a
/// row another instance created after our snapshot (so absent from it) is
/// reported as full until a window from now.
///
/// That read of a denied row sits in a LATERAL subquery that cannot be
/// flattened (`OFFSET 0`), so `u.key IS NULL` becomes a one-time filter and
/// the index scan never runs for an admitted row. As a plain join condition
/// it ran for every row (the filter was applied after the scan), which cost
/// an index lookup and often a WAL record for pruning the page just updated.
pub const FIXED_DISTINCT: &str = "
WITH req AS (
    SELECT r.key, r.lim, r.win, r.cost, r.pos::integer AS pos, coalesce($5::timestamptz, now()) AS at
    FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS r(key, lim, win, cost, pos)
), up AS (
    INSERT INTO pglimit_buckets AS b (key, count, reset_at, prev_count)
    SELECT key, cost, at + win * interval '1 millisecond', lim FROM req WHERE cost <= lim ORDER BY key
    ON CONFLICT (key) DO UPDATE SET
        count      = CASE WHEN b.reset_at <= coalesce($5::timestamptz, now())
                          THEN EXCLUDED.count ELSE b.count + EXCLUDED.count END,
        reset_at   = CASE WHEN b.reset_at <= coalesce($5::timestamptz, now())
                          THEN EXCLUDED.reset_at ELSE b.reset_at END,
        prev_count = 0
    WHERE (b.reset_at <= coalesce($5::timestamptz, now()) OR b.count + EXCLUDED.count <= EXCLUDED.prev_count)
      AND EXCLUDED.count <= EXCLUDED.prev_count
    RETURNING b.key, b.count, b.reset_at
)
SELECT r.pos,
       u.key IS NOT NULL,
       CASE WHEN u.key IS NOT NULL THEN r.lim - u.count
            ELSE greatest(0, least(coalesce(r.lim - s.count, 0), r.cost - 1)) END,
       coalesce(u.reset_at, s.reset_at, r.at + r.win * interval '1 millisecond'),
       CASE WHEN u.key IS NULL THEN coalesce(s.reset_at, r.at + r.win * interval '1 millisecond') END,
       r.at
FROM req r
LEFT JOIN up u ON u.key = r.key
LEFT JOIN LATERAL (
    SELECT s.count, s.reset_at FROM pglimit_buckets s WHERE u.key IS NULL AND s.key = r.key OFFSET 0
) s ON true
ORDER BY r.pos";

/// Whether [`FIXED_DISTINCT`] can decide these jobs exactly.
pub fn fixed_distinct_applies(jobs: &[Job]) -> bool {
    let simple = jobs.iter().all(|job| {
        let [bucket] = job.batch.buckets.as_slice() else { return false };
        job.batch.cost > 0 && bucket.algorithm == Algorithm::FixedWindow
    });
    let mut keys = HashSet::with_capacity(jobs.len());
    simple && jobs.iter().all(|job| keys.insert(job.batch.buckets[0].key))
}
