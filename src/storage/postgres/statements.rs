//! The statements a lane sends, their parameters and their rows. Each
//! decides a batch of checks in one round trip and one transaction, and
//! answers one [`Row`] per bucket.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::{Executor, FromRow};

use super::literal::{self, Arg};
use super::upsert;
use crate::storage::{Answer, BucketAnswer, BucketSpec, CheckBatch, StoreKind};
use crate::telemetry;

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

/// One bucket's answer, as every statement returns it.
#[derive(sqlx::FromRow)]
pub(super) struct Row {
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
///
/// `per_transaction`: behind a transaction pooler, the settings each
/// transaction starts with; the statement then travels with its values
/// written out ([`fetch_rows`]).
pub(super) async fn decide(
    conn: &mut PgConnection,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
    per_transaction: Option<&str>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let distinct = keys_distinct(batches);
    let via = per_transaction;
    // Written out, a plain upsert is planned on every call, where the batch
    // functions' own statements keep their plans in the server's session:
    // behind a transaction pooler the functions were the faster (bench/results/).
    let road = if via.is_some() { None } else { upsert::road(batches, distinct) };
    let mut rows = match road {
        Some(road) => match upsert::run(&mut *conn, road, batches, now).await {
            Err(e) if upsert::must_retry_with_locks(&e) => {
                tracing::debug!(
                    "a bucket's row changed under the upsert; deciding its batch again with locks"
                );
                telemetry::upsert_retried();
                check_batch(conn, batches, now, Route::Distinct, via).await?
            }
            rows => rows?,
        },
        None if distinct => check_batch(conn, batches, now, Route::Distinct, via).await?,
        None => check_batch(conn, batches, now, Route::Any, via).await?,
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
    let mut rows = check_batch(conn, batches, now, Route::Node(route, routes), None).await?;
    rows.sort_by_key(|r| r.o_pos);
    split(batches, rows)
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

async fn check_batch(
    conn: &mut PgConnection,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
    route: Route<'_>,
    per_transaction: Option<&str>,
) -> Result<Vec<Row>, sqlx::Error> {
    let buckets = || buckets_of(batches);
    let block_for = |b: &BucketSpec| b.lockout.as_ref().map_or(0, |l| to_i64(l.duration.as_millis()));
    let mut args = vec![
        Arg::Ints(buckets().map(|(i, _, _)| i as i32).collect()),
        Arg::Bytes(buckets().map(|(_, _, b)| b.key.as_slice()).collect()),
        Arg::Bigints(buckets().map(|(_, _, b)| to_i64(b.limit)).collect()),
        Arg::Bigints(buckets().map(|(_, _, b)| to_i64(b.window.as_millis())).collect()),
        Arg::Smallints(buckets().map(|(_, _, b)| b.algorithm.code()).collect()),
        Arg::Bigints(buckets().map(|(_, batch, _)| to_i64(batch.cost)).collect()),
        Arg::Bigints(buckets().map(|(_, _, b)| block_for(b)).collect()),
        Arg::Texts(buckets().map(|(_, _, b)| b.lockout.as_ref().map(|l| &*l.name)).collect()),
        Arg::Clock(now),
    ];
    let sql = match route {
        Route::Any => CHECK_BATCH,
        Route::Distinct => CHECK_DISTINCT,
        Route::Node(route, routes) => {
            args.extend([Arg::Int(route), Arg::Ints(routes.to_vec())]);
            CHECK_NODE
        }
    };
    fetch_rows(conn, sql, args, per_transaction).await
}

/// Runs a statement that answers [`Row`]s: prepared, with `args` bound; or,
/// behind a transaction pooler, as one simple-protocol message that starts
/// with the settings (`SET LOCAL`) and has the values written in, so that
/// nothing is prepared and the settings hold for this statement whichever
/// server connection runs it.
pub(super) async fn fetch_rows(
    conn: &mut PgConnection,
    sql: &str,
    args: Vec<Arg<'_>>,
    per_transaction: Option<&str>,
) -> Result<Vec<Row>, sqlx::Error> {
    let Some(settings) = per_transaction else {
        let query = args.into_iter().fold(sqlx::query_as(sql), |query, arg| arg.bind_to(query));
        return query.fetch_all(conn).await;
    };
    let message = format!("{settings} {}", literal::written_out(sql, &args)?);
    let rows = conn.fetch_all(&*message).await?;
    rows.iter().map(Row::from_row).collect()
}

/// Each bucket of `batches` in order, with its batch and the batch's index.
pub(super) fn buckets_of<'a>(
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
        Answer { buckets, now, store: StoreKind::Postgres, degraded: false, cached: false, timing: None }
    });
    Ok(answers.collect())
}

pub(super) fn to_i64<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}
