//! The statements a lane sends, their parameters and their rows. Each
//! decides a batch of checks in one round trip and one transaction, and
//! answers one [`Row`] per bucket.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use crate::algorithm::Algorithm;
use crate::storage::{Answer, BucketAnswer, BucketSpec, CheckBatch, StoreKind};

/// The general case: any algorithms, any number of buckets per check, keys
/// shared between checks (a hot key). See `pglimit_check_batch` in
/// `migrations/`.
const CHECK_BATCH: &str = "SELECT * FROM pglimit_check_batch($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// The same for a batch in which no key appears twice, decided set-based
/// rather than bucket by bucket. See `pglimit_check_distinct` in `migrations/`.
const CHECK_DISTINCT: &str = "SELECT * FROM pglimit_check_distinct($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// The same for buckets on one worker, in Citus mode (see `citus/`): $10 is
/// the route Citus sends the call by, $11 each bucket's route.
const CHECK_NODE: &str = "SELECT * FROM pglimit_check_node($10, $11, $1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// The common case as one plain multi-row upsert, no PL/pgSQL: every bucket
/// is a fixed window (or a check's one bucket a token bucket), none has a
/// lockout, every check costs at least 1, and no key appears twice. A blocked key is read in the same statement and left
/// out of the upsert (denied, nothing consumed). The upsert resets an
/// expired window or adds the cost only where it fits (`WHERE`), so each row
/// is decided on its locked state. The limit travels in the proposed row's
/// `prev_count`, which the fixed window does not use, so that the `WHERE`
/// can read it as `EXCLUDED.prev_count`. Rows are proposed in key order, the
/// same lock order as the batch functions.
///
/// A check of one bucket is admitted exactly when its row is updated. A
/// check of several (a policy) is proposed only if every bucket fits as the
/// statement's snapshot has it, and must then be updated in every row: if
/// another instance changed one of them after the snapshot so that it no
/// longer fits, the statement raises (`pglimit_retry_with_locks`, 40001),
/// which rolls it back whole, and the batch is decided again by
/// `pglimit_check_distinct`, which locks before it reads. So a new key costs
/// one write, not a lock and a write.
///
/// A denied row's figures are read from the snapshot; for a one-bucket check
/// another instance may have changed the row between that snapshot and our
/// lock, so `remaining` is capped below the cost so that it never
/// contradicts the denial, and a row another instance created after our
/// snapshot (so absent from it) is reported as full until a window from now.
/// Those reads sit in LATERAL subqueries that cannot be flattened
/// (`OFFSET 0`), so that they run only where needed: as a plain join they ran
/// an index lookup for every row.
const PLAIN_UPSERT: &str = include_str!("upsert.sql");

/// The SQLSTATE `pglimit_retry_with_locks` raises.
const RETRY_WITH_LOCKS: &str = "40001";

/// One bucket's answer, as both statements return it.
#[derive(sqlx::FromRow)]
struct Row {
    /// The bucket's position in the batch, from 1.
    o_pos: i32,
    o_allowed: bool,
    o_remaining: i64,
    /// When the bucket is back to full.
    o_reset_at: DateTime<Utc>,
    o_retry_at: Option<DateTime<Utc>>,
    /// The clock the batch was decided at.
    o_now: DateTime<Utc>,
    /// Denied by a block (an operator's, or a lockout) rather than its count.
    o_blocked: bool,
}

/// Decides `batches` in one call, at `now` (`None`: the database's clock),
/// and returns one answer per batch, in order.
pub(super) async fn decide(
    conn: &mut PgConnection,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let mut rows = if plain_upsert_applies(batches) {
        match plain_upsert(&mut *conn, batches, now).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(RETRY_WITH_LOCKS) => {
                tracing::debug!(
                    "a policy's row changed under the upsert; deciding its batch again with locks"
                );
                check_batch(conn, batches, now, Route::Distinct).await?
            }
            rows => rows?,
        }
    } else if keys_distinct(batches) {
        check_batch(conn, batches, now, Route::Distinct).await?
    } else {
        check_batch(conn, batches, now, Route::Any).await?
    };
    rows.sort_by_key(|r| r.o_pos);
    split(batches, rows)
}

/// Like [`decide`], in Citus mode, for checks whose buckets are all on the
/// worker of `route`; `routes` gives each bucket's route.
pub(super) async fn decide_on_node(
    conn: &mut PgConnection,
    route: i32,
    routes: &[i32],
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let mut rows = check_batch(conn, batches, now, Route::Node(route, routes)).await?;
    rows.sort_by_key(|r| r.o_pos);
    split(batches, rows)
}

/// Whether [`PLAIN_UPSERT`] decides these batches exactly.
fn plain_upsert_applies(batches: &[&CheckBatch]) -> bool {
    let simple = batches.iter().all(|batch| {
        let plain = match batch.buckets.as_slice() {
            [one] => matches!(one.algorithm, Algorithm::FixedWindow | Algorithm::TokenBucket),
            all => all.iter().all(|b| b.algorithm == Algorithm::FixedWindow),
        };
        batch.cost > 0 && plain && batch.buckets.iter().all(|b| b.lockout.is_none())
    });
    simple && keys_distinct(batches)
}

/// Whether no key appears twice among the buckets of `batches`.
fn keys_distinct(batches: &[&CheckBatch]) -> bool {
    let mut keys = HashSet::with_capacity(batches.len() * 3);
    batches.iter().flat_map(|batch| &batch.buckets).all(|bucket| keys.insert(bucket.key))
}

/// Which batch function decides a batch.
enum Route<'a> {
    /// `pglimit_check_batch`: any batch.
    Any,
    /// `pglimit_check_distinct`: no key twice.
    Distinct,
    /// `pglimit_check_node` (Citus mode): the call's route and each bucket's.
    Node(i32, &'a [i32]),
}

async fn plain_upsert(
    conn: &mut PgConnection,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Row>, sqlx::Error> {
    let buckets = || buckets_of(batches);
    sqlx::query_as(PLAIN_UPSERT)
        .bind(buckets().map(|(i, _, _)| i as i32).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| b.key.as_slice()).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| to_i64(b.limit)).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| to_i64(b.window.as_millis())).collect::<Vec<_>>())
        .bind(buckets().map(|(_, batch, _)| to_i64(batch.cost)).collect::<Vec<_>>())
        .bind(now)
        .bind(buckets().map(|(_, _, b)| b.algorithm.code()).collect::<Vec<_>>())
        .fetch_all(conn)
        .await
}

async fn check_batch(
    conn: &mut PgConnection,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
    route: Route<'_>,
) -> Result<Vec<Row>, sqlx::Error> {
    let buckets = || buckets_of(batches);
    let block_for = |b: &BucketSpec| b.lockout.as_ref().map_or(0, |l| to_i64(l.duration.as_millis()));
    let query = sqlx::query_as(match route {
        Route::Any => CHECK_BATCH,
        Route::Distinct => CHECK_DISTINCT,
        Route::Node(..) => CHECK_NODE,
    });
    let query = query
        .bind(buckets().map(|(i, _, _)| i as i32).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| b.key.as_slice()).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| to_i64(b.limit)).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| to_i64(b.window.as_millis())).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| b.algorithm.code()).collect::<Vec<_>>())
        .bind(buckets().map(|(_, batch, _)| to_i64(batch.cost)).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| block_for(b)).collect::<Vec<_>>())
        .bind(buckets().map(|(_, _, b)| b.lockout.as_ref().map(|l| &*l.name)).collect::<Vec<_>>())
        .bind(now);
    match route {
        Route::Node(route, routes) => query.bind(route).bind(routes).fetch_all(conn).await,
        Route::Any | Route::Distinct => query.fetch_all(conn).await,
    }
}

/// Each bucket of `batches` in order, with its batch and the batch's index.
fn buckets_of<'a>(
    batches: &'a [&'a CheckBatch],
) -> impl Iterator<Item = (usize, &'a CheckBatch, &'a BucketSpec)> + 'a {
    batches.iter().enumerate().flat_map(|(i, batch)| batch.buckets.iter().map(move |b| (i, *batch, b)))
}

/// Hands each batch the rows of its own buckets.
fn split(batches: &[&CheckBatch], rows: Vec<Row>) -> Result<Vec<Answer>, sqlx::Error> {
    let expected: usize = batches.iter().map(|b| b.buckets.len()).sum();
    if rows.len() != expected {
        let msg = format!("pglimit_check_batch returned {} rows for {expected} buckets", rows.len());
        return Err(sqlx::Error::Protocol(msg));
    }
    let mut rows = rows.into_iter();
    let answers = batches.iter().map(|batch| {
        let mine: Vec<Row> = rows.by_ref().take(batch.buckets.len()).collect();
        let now = mine.first().map_or_else(Utc::now, |r| r.o_now);
        let buckets = mine
            .into_iter()
            .map(|r| BucketAnswer {
                allowed: r.o_allowed,
                remaining: r.o_remaining.max(0) as u64,
                reset_at: r.o_reset_at,
                retry_at: r.o_retry_at,
                blocked: r.o_blocked,
            })
            .collect();
        Answer { buckets, now, store: StoreKind::Postgres, degraded: false, cached: false }
    });
    Ok(answers.collect())
}

fn to_i64<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}
