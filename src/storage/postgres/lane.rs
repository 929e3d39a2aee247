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

use super::session::{classify, timed_out, Session};
use super::{citus, statements};
use crate::storage::{Answer, CheckBatch, StoreError, StoreKind};
use crate::telemetry;

/// Most checks decided in one call.
const MAX_BATCH: usize = 128;

/// A queued check: the batch of buckets, the clock to use (`None`: the
/// database's `now()`), and where to send the answer.
pub(super) struct Job {
    pub batch: CheckBatch,
    pub now: Option<DateTime<Utc>>,
    pub task: Task,
    pub reply: oneshot::Sender<Result<Answer, StoreError>>,
}

/// What a job asks of its lane.
#[derive(Debug, Clone)]
pub(super) enum Task {
    Check,
    /// Citus mode: give back what `batch` (one worker's part of a check that
    /// another worker denied) took, as the taking answered it (its clock,
    /// and each bucket's reset time, which tells the window it took from).
    /// Answered with no buckets.
    Refund(Answer),
}

impl Task {
    fn is_check(&self) -> bool {
        matches!(self, Task::Check)
    }
}

/// A lane's connection and the session generation it was opened in.
type Slot = Option<(PgConnection, u64)>;

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

/// Runs a lane until every sender of `queue` is gone.
pub(super) async fn lane(
    session: Arc<Session>,
    mut queue: mpsc::Receiver<Job>,
    conn: PgConnection,
    busy: Arc<Busy>,
) {
    let mut slot: Slot = Some((conn, session.generation()));
    while let Some(jobs) = next_batch(&mut queue).await {
        busy.start();
        for group in by_clock(jobs) {
            let batches: Vec<&CheckBatch> = group.iter().map(|job| &job.batch).collect();
            let taken: Vec<&Task> = group.iter().map(|job| &job.task).collect();
            let started = Instant::now();
            let result = run(&session, &mut slot, &batches, group[0].now, &taken).await;
            telemetry::db_call(started.elapsed(), batches.len());
            match result {
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

/// Splits jobs into runs that share a task and a clock (only replays and
/// refunds set one).
fn by_clock(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut groups: Vec<Vec<Job>> = Vec::new();
    for job in jobs {
        match groups.last_mut() {
            Some(group) if group[0].now == job.now && group[0].task.is_check() == job.task.is_check() => {
                group.push(job)
            }
            _ => groups.push(vec![job]),
        }
    }
    groups
}

/// One call on the lane's connection, opened afresh if it is from before an
/// outage or was lost.
async fn run(
    session: &Session,
    slot: &mut Slot,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
    tasks: &[&Task],
) -> Result<Vec<Answer>, sqlx::Error> {
    let generation = session.generation();
    if slot.as_ref().is_some_and(|(_, g)| *g != generation) {
        *slot = None;
    }
    if slot.is_none() {
        *slot = Some((session.open().await?, generation));
    }
    let Some((conn, _)) = slot.as_mut() else {
        return Err(timed_out("connecting"));
    };
    let work = async {
        match (session.routes(), tasks.first().is_none_or(|t| t.is_check())) {
            (None, true) => statements::decide(conn, batches, now).await,
            (Some(routes), true) => citus::decide(conn, routes, batches, now).await,
            (Some(routes), false) => refund(conn, routes, batches, tasks).await,
            (None, false) => Err(sqlx::Error::Protocol("a refund outside Citus mode".into())),
        }
    };
    let result = match tokio::time::timeout(session.hard_limit(), work).await {
        Ok(result) => result,
        Err(_) => Err(timed_out("waiting for a batch")),
    };
    if result.as_ref().is_err_and(|e| !matches!(e, sqlx::Error::Database(_))) {
        *slot = None; // the connection's state is unknown: start afresh
    }
    result
}

/// Gives back each batch's take, one call per batch (each on one worker).
async fn refund(
    conn: &mut PgConnection,
    routes: &citus::Routes,
    batches: &[&CheckBatch],
    tasks: &[&Task],
) -> Result<Vec<Answer>, sqlx::Error> {
    let mut answers = Vec::with_capacity(batches.len());
    for (batch, task) in batches.iter().zip(tasks) {
        let Task::Refund(taken) = task else {
            return Err(sqlx::Error::Protocol("a check among refunds".into()));
        };
        citus::refund(conn, routes, batch, taken).await?;
        answers.push(Answer {
            buckets: Vec::new(),
            now: taken.now,
            store: StoreKind::Postgres,
            degraded: false,
            cached: false,
        });
    }
    Ok(answers)
}
