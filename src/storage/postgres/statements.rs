//! What the decision statements share: their parameters and their rows.
//! Each decides a batch of checks in one round trip and one transaction,
//! and answers one [`Row`] per bucket; the statements themselves are the
//! layout's ([`super::layout`]).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::{Executor, FromRow};

use super::literal::{self, Arg};
use crate::storage::{Answer, BucketAnswer, BucketSpec, Check, StoreKind};

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

/// The parameters every batch function takes ($1 to $10), one element per
/// bucket of `checks`, the clock to decide at ($9), and each calendar
/// window's zone ($10; NULL for other windows).
pub(super) fn check_args<'a>(checks: &'a [&'a Check], now: Option<DateTime<Utc>>) -> Vec<Arg<'a>> {
    let buckets = || buckets_of(checks);
    let block_for = |b: &BucketSpec| b.lockout.as_ref().map_or(0, |l| to_i64(l.duration.as_millis()));
    vec![
        Arg::Ints(buckets().map(|(i, _, _)| i as i32).collect()),
        Arg::Bytes(buckets().map(|(_, _, b)| b.key.as_slice()).collect()),
        Arg::Bigints(buckets().map(|(_, _, b)| to_i64(b.limit)).collect()),
        Arg::Bigints(buckets().map(|(_, _, b)| to_i64(b.window.as_millis())).collect()),
        Arg::Smallints(buckets().map(|(_, _, b)| b.algorithm.code()).collect()),
        Arg::Bigints(buckets().map(|(_, check, _)| to_i64(check.cost)).collect()),
        Arg::Bigints(buckets().map(|(_, _, b)| block_for(b)).collect()),
        Arg::Texts(buckets().map(|(_, _, b)| b.lockout.as_ref().map(|l| &*l.name)).collect()),
        Arg::Clock(now),
        Arg::Texts(buckets().map(|(_, _, b)| b.calendar.map(|c| c.zone.name())).collect()),
    ]
}

/// [`check_args`] and, as $11, each bucket's lease (the SHA-256 of its
/// check's lease id; empty for none) and, as $12, how long renewals may
/// keep it (ms; 0 for none): the single-node functions take them.
pub(super) fn check_args_with_leases<'a>(
    checks: &'a [&'a Check],
    now: Option<DateTime<Utc>>,
) -> Vec<Arg<'a>> {
    let mut args = check_args(checks, now);
    let lease = |check: &'a Check| check.lease.as_ref().map_or(&[][..], |l| l.id.as_slice());
    let life = |check: &Check| check.lease.map_or(0, |l| to_i64(l.max_life.as_millis()));
    args.push(Arg::Bytes(buckets_of(checks).map(|(_, check, _)| lease(check)).collect()));
    args.push(Arg::Bigints(buckets_of(checks).map(|(_, check, _)| life(check)).collect()));
    args
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

/// Each bucket of `checks` in order, with its batch and the batch's index.
pub(super) fn buckets_of<'a>(
    checks: &'a [&'a Check],
) -> impl Iterator<Item = (usize, &'a Check, &'a BucketSpec)> + Clone + 'a {
    checks.iter().enumerate().flat_map(|(i, check)| check.buckets.iter().map(move |b| (i, *check, b)))
}

/// Gives each row the position `to[p - 1]` in place of its `p`: for a
/// statement that answers the buckets in another order than its checks'
/// (Citus mode's, shard by shard).
pub(super) fn renumber(rows: &mut [Row], to: &[i32]) -> Result<(), sqlx::Error> {
    for row in rows {
        let from = usize::try_from(row.o_pos - 1).ok();
        row.o_pos = *from.and_then(|p| to.get(p)).ok_or_else(|| {
            sqlx::Error::Protocol(format!("a statement answered position {} of {}", row.o_pos, to.len()))
        })?;
    }
    Ok(())
}

/// Hands each batch the rows of its own buckets, in the order they were asked.
pub(super) fn answers(checks: &[&Check], mut rows: Vec<Row>) -> Result<Vec<Answer>, sqlx::Error> {
    rows.sort_by_key(|r| r.o_pos);
    let expected: usize = checks.iter().map(|b| b.buckets.len()).sum();
    if rows.len() != expected {
        let msg = format!("pglimit_check_batch returned {} rows for {expected} buckets", rows.len());
        return Err(sqlx::Error::Protocol(msg));
    }
    let mut rows = rows.into_iter();
    let answers = checks.iter().map(|check| {
        let mine: Vec<Row> = rows.by_ref().take(check.buckets.len()).collect();
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

/// Whether the server answered `e` with the SQLSTATE `code`.
pub(super) fn is_sqlstate(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(code))
}
