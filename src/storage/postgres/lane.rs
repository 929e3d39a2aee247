//! A lane: one task, one connection, checks sent in batches.
//!
//! A lane takes the first check waiting in its queue and every check
//! queued behind it (up to [`MAX_BATCH`]), and decides them all in one call.
//! So an idle service adds no waiting (the first check goes at once), and
//! under load the checks that arrive while a call is in flight form the next
//! batch. The connection is owned, not pooled: a pool pings a connection each
//! time it is returned, which would double the round trips.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use tokio::sync::{mpsc, oneshot};

use super::{classify, statements, timed_out, Shared};
use crate::storage::{BucketState, CheckBatch, Checked, StoreError, StoreKind};

/// Most checks decided in one call.
pub const MAX_BATCH: usize = 128;

/// A queued check: the batch of buckets, the clock to use (`None`: the
/// database's `now()`), and where to send the answer.
pub(super) struct Job {
    pub batch: CheckBatch,
    pub now: Option<DateTime<Utc>>,
    pub reply: oneshot::Sender<Result<Checked, StoreError>>,
}

/// One row of `pglimit_check_batch`: bucket position (1-based), allowed,
/// remaining, reset_at, retry_at, now.
type Row = (i32, bool, i64, DateTime<Utc>, Option<DateTime<Utc>>, DateTime<Utc>);

/// When a lane's current call started, for the router; 0 while idle.
#[derive(Default)]
pub(super) struct Busy {
    since_us: AtomicU64,
}

impl Busy {
    fn start(&self) {
        self.since_us.store(elapsed_us().max(1), Ordering::Release);
    }

    fn stop(&self) {
        self.since_us.store(0, Ordering::Release);
    }

    /// Whether a call has been running for longer than `after`.
    pub fn stalled(&self, after: Duration) -> bool {
        let since = self.since_us.load(Ordering::Acquire);
        since != 0 && elapsed_us().saturating_sub(since) > after.as_micros() as u64
    }
}

fn elapsed_us() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64
}

pub(super) async fn lane(
    shared: Arc<Shared>,
    mut queue: mpsc::Receiver<Job>,
    mut conn: Option<(PgConnection, u64)>,
    busy: Arc<Busy>,
) {
    while let Some(jobs) = next_batch(&mut queue).await {
        busy.start();
        for group in by_clock(jobs) {
            match shared.run(&mut conn, &group).await {
                Ok(answers) => {
                    group.into_iter().zip(answers).for_each(|(job, a)| drop(job.reply.send(Ok(a))))
                }
                Err(e) => {
                    let e = classify(e);
                    group.into_iter().for_each(|job| drop(job.reply.send(Err(e.clone()))));
                }
            }
        }
        busy.stop();
    }
}

/// The next check and those queued behind it, minus any whose caller has
/// given up (the fallback answered it, so it must not be counted here).
async fn next_batch(queue: &mut mpsc::Receiver<Job>) -> Option<Vec<Job>> {
    let mut jobs = vec![queue.recv().await?];
    while jobs.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
    jobs.retain(|job| !job.reply.is_closed());
    Some(jobs)
}

/// Splits jobs into runs that share a clock (only replays set one).
fn by_clock(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut groups: Vec<Vec<Job>> = Vec::new();
    for job in jobs {
        match groups.last_mut() {
            Some(group) if group[0].now == job.now => group.push(job),
            _ => groups.push(vec![job]),
        }
    }
    groups
}

impl Shared {
    async fn run(
        &self,
        slot: &mut Option<(PgConnection, u64)>,
        jobs: &[Job],
    ) -> Result<Vec<Checked>, sqlx::Error> {
        let generation = self.generation.load(Ordering::Acquire);
        if slot.as_ref().is_some_and(|(_, g)| *g != generation) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some((self.open().await?, generation));
        }
        let Some((conn, _)) = slot.as_mut() else {
            return Err(timed_out("connecting"));
        };
        let result = match tokio::time::timeout(self.hard_limit(), call(conn, jobs)).await {
            Ok(result) => result,
            Err(_) => Err(timed_out("waiting for pglimit_check_batch")),
        };
        if result.as_ref().is_err_and(|e| !matches!(e, sqlx::Error::Database(_))) {
            *slot = None; // the connection's state is unknown: start afresh
        }
        result
    }
}

async fn call(conn: &mut PgConnection, jobs: &[Job]) -> Result<Vec<Checked>, sqlx::Error> {
    let now = jobs.first().and_then(|j| j.now);
    let mut rows: Vec<Row> = if statements::fixed_distinct_applies(jobs) {
        let buckets = || jobs.iter().map(|job| (job, &job.batch.buckets[0]));
        sqlx::query_as(statements::FIXED_DISTINCT)
            .bind(buckets().map(|(_, b)| b.key.as_slice()).collect::<Vec<_>>())
            .bind(buckets().map(|(_, b)| to_i64(b.limit)).collect::<Vec<_>>())
            .bind(buckets().map(|(_, b)| to_i64(b.window.as_millis())).collect::<Vec<_>>())
            .bind(buckets().map(|(job, _)| to_i64(job.batch.cost)).collect::<Vec<_>>())
            .bind(now)
            .fetch_all(conn)
            .await?
    } else {
        let (mut checks, mut keys, mut limits, mut windows, mut algorithms, mut costs) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for (i, job) in jobs.iter().enumerate() {
            for b in &job.batch.buckets {
                checks.push(i as i32);
                keys.push(b.key.as_slice());
                limits.push(to_i64(b.limit));
                windows.push(to_i64(b.window.as_millis()));
                algorithms.push(b.algorithm.code());
                costs.push(to_i64(job.batch.cost));
            }
        }
        sqlx::query_as(statements::GENERAL)
            .bind(checks)
            .bind(keys)
            .bind(limits)
            .bind(windows)
            .bind(algorithms)
            .bind(costs)
            .bind(now)
            .fetch_all(conn)
            .await?
    };
    rows.sort_by_key(|r| r.0);
    split(jobs, rows)
}

/// Hands each job the rows of its own buckets.
fn split(jobs: &[Job], rows: Vec<Row>) -> Result<Vec<Checked>, sqlx::Error> {
    let expected: usize = jobs.iter().map(|j| j.batch.buckets.len()).sum();
    if rows.len() != expected {
        let msg = format!("pglimit_check_batch returned {} rows for {expected} buckets", rows.len());
        return Err(sqlx::Error::Protocol(msg));
    }
    let mut rows = rows.into_iter();
    let answers = jobs.iter().map(|job| {
        let mine: Vec<Row> = rows.by_ref().take(job.batch.buckets.len()).collect();
        let now = mine.first().map_or_else(Utc::now, |r| r.5);
        let buckets = mine
            .into_iter()
            .map(|(_, allowed, remaining, reset_at, retry_at, _)| BucketState {
                allowed,
                remaining: remaining.max(0) as u64,
                reset_at,
                retry_at,
            })
            .collect();
        Checked { buckets, now, store: StoreKind::Postgres, degraded: false }
    });
    Ok(answers.collect())
}

fn to_i64<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}
