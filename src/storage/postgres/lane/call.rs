//! One call: a batch of checks (or Citus refunds) sent on one connection.
//!
//! The lane ([`super`]) decides which checks go together and on which
//! of its connections; this module sends them and answers each caller.

use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use tokio::sync::oneshot;

use super::{Job, Task};
use crate::storage::postgres::layout::Layout;
use crate::storage::postgres::node::Node;
use crate::storage::postgres::session::{classify, timed_out, Session};
use crate::storage::postgres::statements::is_sqlstate;
use crate::storage::{Answer, CallTiming, Check, StoreError, StoreKind};
use crate::telemetry;

/// A connection and the session generation it was opened in; `None` until
/// it is (re)opened.
pub(super) type LaneConnection = Option<(PgConnection, u64)>;

/// Decides `jobs` (all of one task kind and one clock) in one call on
/// `slot`, answers each caller, and hands the connection back.
pub(super) async fn call(
    session: &Session,
    node: Option<&Node>,
    mut slot: LaneConnection,
    jobs: Vec<Job>,
) -> LaneConnection {
    let sent = Instant::now();
    let now = jobs.first().and_then(|job| job.now);
    let (jobs, mut replies): (Vec<Sent>, Vec<Reply>) =
        jobs.into_iter().map(|j| ((j.batch, j.task, j.queued), j.reply)).unzip();
    let batches = jobs.iter().map(|(batch, ..)| batch).collect();
    let work = Work { batches, tasks: jobs.iter().map(|(_, task, _)| task).collect(), now, node };
    let result = tokio::select! {
        result = run_again_if_ended(session, &mut slot, &work) => result,
        () = abandoned(&mut replies, sent + session.patience()) => {
            // Every caller stopped waiting and answered from memory: what
            // this call would take in Postgres must not be taken too (a
            // pooler holding the statement while the server is down runs it
            // when the server is back). Dropping the connection withdraws it.
            return None;
        }
    };
    let took = sent.elapsed();
    telemetry::db_call(took, jobs.len());
    let checks = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
    let timing =
        |queued: Instant| CallTiming { queued: sent.saturating_duration_since(queued), call: took, checks };
    for (_, _, queued) in &jobs {
        telemetry::check_phases(timing(*queued).queued, took);
    }
    match result {
        Ok(answers) => jobs.iter().zip(replies).zip(answers).for_each(|(((_, _, queued), reply), a)| {
            let answer = Answer { timing: Some(timing(*queued)), ..a };
            drop(reply.send(Ok(answer)));
        }),
        Err(e) => {
            let e = classify(e);
            replies.into_iter().for_each(|reply| drop(reply.send(Err(e.clone()))));
        }
    }
    slot
}

type Sent = (Check, Task, Instant);

/// What one call sends: the batches, what to do with them, and their clock.
struct Work<'a> {
    batches: Vec<&'a Check>,
    tasks: Vec<&'a Task>,
    now: Option<DateTime<Utc>>,
    /// Where the lane connects: a Citus worker, or the URL's server.
    node: Option<&'a Node>,
}
type Reply = oneshot::Sender<Result<Answer, StoreError>>;

/// Resolves once no caller waits for an answer any more and the call has
/// run past `patience`: a caller gone sooner hung up (its client did), and
/// dropping a healthy connection for that would let clients churn them.
async fn abandoned(replies: &mut [Reply], patience: Instant) {
    for reply in replies.iter_mut() {
        reply.closed().await;
    }
    tokio::time::sleep_until(patience.into()).await;
}

async fn run_again_if_ended(
    session: &Session,
    slot: &mut LaneConnection,
    work: &Work<'_>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let result = run(session, slot, work).await;
    if result.as_ref().is_err_and(ended_by_server) && work.may_send_again() {
        return run(session, slot, work).await;
    }
    result
}

impl Work<'_> {
    /// Whether a call the server ended may be sent again. Checks may: on a
    /// single node a call is one statement, which the end rolled back; in
    /// Citus mode a worker's statements before the one ended may have
    /// committed, and deciding them again counts them twice, which can deny
    /// early but never admit too much. Refunds may not: given back twice,
    /// a bucket would admit past its limit; not given back, it stays counted.
    fn may_send_again(&self) -> bool {
        self.tasks.iter().all(|t| t.is_check())
    }
}

/// One call on the connection, opened afresh if it is from before an outage
/// or was lost.
async fn run(
    session: &Session,
    slot: &mut LaneConnection,
    work: &Work<'_>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let Work { batches, tasks, now, node } = work;
    let generation = session.generation();
    if slot.as_ref().is_some_and(|(_, g)| *g != generation) {
        *slot = None;
    }
    if slot.is_none() {
        *slot = Some((session.open_on(*node).await?, generation));
    }
    let Some((conn, _)) = slot.as_mut() else {
        return Err(timed_out("connecting"));
    };
    let sending = async {
        let layout = session.layout();
        if tasks.first().is_none_or(|t| t.is_check()) {
            layout.decide(conn, batches, *now, session.per_transaction(), *node).await
        } else {
            refund(conn, layout, batches, tasks).await
        }
    };
    let result = match tokio::time::timeout(session.hard_limit(), sending).await {
        Ok(result) => result,
        Err(_) => Err(timed_out("waiting for a batch")),
    };
    if result.as_ref().is_err_and(|e| !matches!(e, sqlx::Error::Database(_)) || ended_by_server(e)) {
        *slot = None; // the connection's state is unknown, or it is gone: start afresh
    }
    result
}

/// The server ended the connection while the server itself stays up
/// (57P01: `pg_terminate_backend`, a pooler or a maintenance restart
/// closing sessions): a new connection serves, no outage to declare.
fn ended_by_server(e: &sqlx::Error) -> bool {
    is_sqlstate(e, "57P01")
}

/// Gives back each batch's take, one call per batch (each on one worker).
async fn refund(
    conn: &mut PgConnection,
    layout: &Layout,
    batches: &[&Check],
    tasks: &[&Task],
) -> Result<Vec<Answer>, sqlx::Error> {
    let mut answers = Vec::with_capacity(batches.len());
    for (batch, task) in batches.iter().zip(tasks) {
        let Task::Refund(taken) = task else {
            return Err(sqlx::Error::Protocol("a check among refunds".into()));
        };
        layout.refund(conn, batch, taken).await?;
        answers.push(Answer {
            buckets: Vec::new(),
            now: taken.now,
            store: StoreKind::Postgres,
            degraded: false,
            cached: false,
            timing: None,
        });
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work<'a>(tasks: Vec<&'a Task>) -> Work<'a> {
        Work { batches: Vec::new(), tasks, now: None, node: None }
    }

    #[test]
    fn checks_the_server_ended_are_sent_again_and_refunds_are_not() {
        let taken = Answer {
            buckets: Vec::new(),
            now: chrono::Utc::now(),
            store: StoreKind::Postgres,
            degraded: false,
            cached: false,
            timing: None,
        };
        let refund = Task::Refund(taken);
        assert!(work(vec![&Task::Check, &Task::Check]).may_send_again());
        assert!(!work(vec![&refund, &refund]).may_send_again(), "a refund given back twice");
    }
}
