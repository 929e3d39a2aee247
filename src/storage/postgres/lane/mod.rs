//! A lane: one task, a few connections, checks sent in batches.
//!
//! A lane takes the first check waiting in its queue and every check queued
//! behind it (up to [`MAX_BATCH`]), and decides them all in one call (see
//! [`super::call`]). So an idle service adds no waiting (the first check goes
//! at once), and under load the checks that arrive while calls are in
//! flight form the next batch. In between, at light load, a call that ends
//! with a few checks in play makes the next one wait up to [`LINGER_FOR`]
//! for as many to arrive ([`Linger`]), since their callers usually send
//! their next checks at once: otherwise two callers take turns, one check
//! per call.
//!
//! A lane has several connections and keeps up to `depth` calls in flight
//! (`PGLIMIT_DB_PIPELINE`), so that the next batch can run while the
//! previous one waits for its commit's WAL flush. One at a time is the
//! default: more calls cut the same checks into more, smaller batches, a
//! batch's cost is mostly per call, and the flushes queue on the disk anyway
//! (docs/performance.md). A call that has run for [`SPILL_AFTER`] no longer
//! counts against the depth, so the other connections are spares: a row
//! locked by a stuck transaction stalls only the calls on it.
//!
//! A check whose keys are all free goes out at once; a check that shares a
//! key with a call in flight, or with a check held back before it, waits for
//! that call to end, so that checks on one key are decided in the order they
//! arrived.
//!
//! The connections are owned, not pooled: a pool pings a connection each
//! time it is returned, which would double the round trips.

mod call;
mod handle;

pub(super) use handle::{answer, LaneHandle};

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::stream::{FuturesUnordered, StreamExt};
use sqlx::postgres::PgConnection;
use tokio::sync::{mpsc, oneshot};

use super::node::Node;
use super::session::Session;
use crate::storage::{Answer, Check, Key, StoreError};
use call::{call, LaneConnection};

/// Most checks decided in one call.
const MAX_BATCH: usize = 128;

/// A call counts as stalled, and a spare connection may take the next batch,
/// once it has run this long: far longer than a call takes under full load,
/// far shorter than any timeout (docs/performance.md).
const SPILL_AFTER: Duration = Duration::from_millis(5);

/// A queued check: the batch of buckets, the clock to use (`None`: the
/// database's `now()`), when it was queued, and where to send the answer.
pub(super) struct Job {
    pub batch: Check,
    pub now: Option<DateTime<Utc>>,
    pub task: Task,
    pub queued: Instant,
    pub reply: oneshot::Sender<Result<Answer, StoreError>>,
}

impl Job {
    fn keys(&self) -> impl Iterator<Item = &Key> {
        self.batch.buckets.iter().map(|b| &b.key)
    }

    /// Whether `other` can go in the same call: one task kind, one clock.
    fn goes_with(&self, other: &Job) -> bool {
        self.now == other.now && self.task.is_check() == other.task.is_check()
    }
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
    pub fn is_check(&self) -> bool {
        matches!(self, Task::Check)
    }
}

/// Runs a lane on `conns`, at most `depth` calls at once unless some stall,
/// until every sender of `queue` is gone and every call has ended.
pub(super) async fn lane(
    session: Arc<Session>,
    node: Option<Node>,
    mut queue: mpsc::Receiver<Job>,
    conns: Vec<PgConnection>,
    depth: usize,
) {
    let (generation, width) = (session.generation(), conns.len());
    let mut idle: Vec<LaneConnection> = conns.into_iter().map(|c| Some((c, generation))).collect();
    let (mut waiting, mut flying) = (Waiting::default(), InFlight::default());
    // The calls run inside this task rather than as tasks of their own: a
    // task per call cost two more wake-ups per call, measurably more CPU.
    let (session, node) = (&*session, node.as_ref());
    let start = |id: u64, slot: LaneConnection, jobs: Vec<Job>| async move {
        (id, call(session, node, slot, jobs).await)
    };
    let mut calls = FuturesUnordered::new();
    let (mut open, mut next_id) = (true, 0u64);
    let mut linger: Option<Linger> = None;
    loop {
        open &= waiting.receive(&mut queue, width);
        let now = Instant::now();
        linger = linger.filter(|g| open && g.holds(now, &waiting));
        while !idle.is_empty() {
            let running = flying.running(now);
            // A gathering holds only an idle lane: behind a running call, checks queue anyway.
            if running >= depth.max(1) || (running == 0 && linger.is_some()) {
                break;
            }
            let Some(jobs) = waiting.next_batch(&flying) else { break };
            linger = None;
            let keys: Vec<Key> = jobs.iter().flat_map(Job::keys).copied().collect();
            next_id += 1;
            flying.start(next_id, keys, jobs.len());
            calls.push(start(next_id, idle.pop().flatten(), jobs));
        }
        if !open && calls.is_empty() {
            return; // the queue is closed and drained: nothing will come
        }
        // When the oldest running call will count as stalled, if a spare
        // could then take what waits; or when a gathering ends.
        let spill = flying.next_stall(now).filter(|_| !idle.is_empty());
        let wake =
            [spill, linger.map(|g| g.until)].into_iter().flatten().min().filter(|_| !waiting.jobs.is_empty());
        tokio::select! {
            biased;
            Some((id, slot)) = calls.next(), if !calls.is_empty() => {
                let answered = flying.end(id);
                idle.push(slot);
                linger = Linger::after(answered, waiting.jobs.len() + queue.len(), Instant::now());
            }
            job = queue.recv(), if open && waiting.has_room(width) => match job {
                Some(job) => waiting.push(job),
                None => open = false,
            },
            () = sleep_until(wake), if wake.is_some() => {}
            // Unreachable: with no call in flight a check goes, or a gathering's end wakes the lane.
            else => return,
        }
    }
}

/// After a call of a few checks ends, the next one waits a moment for the
/// checks their callers send next, so that light load makes calls of
/// several checks rather than one: a call costs about the same whatever it
/// carries (docs/performance.md, *Gathering at light load*).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Linger {
    until: Instant,
    /// The checks that were in play when the call ended.
    target: usize,
}

/// Longest a check waits for others to join its call.
const LINGER_FOR: Duration = Duration::from_micros(200);

/// Beyond this many checks in play, calls fill without waiting, and a wait
/// would keep the database idle while the service answers
/// (docs/performance.md, *Gathering at light load*).
const LINGER_UP_TO: usize = 4;

impl Linger {
    /// After a call that answered `answered` checks, with `waiting` more
    /// already waiting (ended at `now`): wait for as many as were in play,
    /// if there were few, but more than one.
    fn after(answered: usize, waiting: usize, now: Instant) -> Option<Linger> {
        let target = answered + waiting;
        (2..=LINGER_UP_TO).contains(&target).then_some(Linger { until: now + LINGER_FOR, target })
    }

    /// Whether the next call should wait still.
    fn holds(self, now: Instant, waiting: &Waiting) -> bool {
        now < self.until && waiting.jobs.len() < self.target
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

/// Checks received but not yet sent, in arrival order.
#[derive(Default)]
struct Waiting {
    jobs: VecDeque<Job>,
}

impl Waiting {
    /// Held checks wait here rather than in the queue, up to a full batch per
    /// connection; beyond that the queue fills and callers feel it.
    fn has_room(&self, width: usize) -> bool {
        self.jobs.len() < MAX_BATCH * width.max(1)
    }

    fn push(&mut self, job: Job) {
        self.jobs.push_back(job);
    }

    /// Takes what the queue holds now; false once it is closed and empty.
    fn receive(&mut self, queue: &mut mpsc::Receiver<Job>, width: usize) -> bool {
        while self.has_room(width) {
            match queue.try_recv() {
                Ok(job) => self.jobs.push_back(job),
                Err(mpsc::error::TryRecvError::Empty) => return true,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
        true
    }

    /// The next call's checks: from the oldest on, each that goes with the
    /// first and whose keys are free, minus any whose caller has given up
    /// (the fallback answered it, so it must not be counted here). A check
    /// held back holds back every later check that shares a key with it.
    fn next_batch(&mut self, flying: &InFlight) -> Option<Vec<Job>> {
        self.jobs.retain(|job| !job.reply.is_closed());
        let mut batch: Vec<Job> = Vec::new();
        let mut held: HashSet<Key> = HashSet::new();
        let mut rest = VecDeque::with_capacity(self.jobs.len());
        while let Some(job) = self.jobs.pop_front() {
            let fits = batch.len() < MAX_BATCH && batch.first().is_none_or(|first| first.goes_with(&job));
            if fits && job.keys().all(|k| !flying.holds(k) && !held.contains(k)) {
                batch.push(job);
            } else {
                held.extend(job.keys().copied());
                rest.push_back(job);
            }
        }
        self.jobs = rest;
        (!batch.is_empty()).then_some(batch)
    }
}

/// The calls in flight, and their keys, each counted once per call that
/// has it.
#[derive(Default)]
struct InFlight {
    keys: HashMap<Key, u32>,
    calls: HashMap<u64, RunningCall>,
}

/// A call in flight: when it started, its checks' keys, and how many checks.
struct RunningCall {
    started: Instant,
    keys: Vec<Key>,
    checks: usize,
}

impl InFlight {
    fn holds(&self, key: &Key) -> bool {
        self.keys.contains_key(key)
    }

    /// Calls in flight that have not yet run for [`SPILL_AFTER`].
    fn running(&self, now: Instant) -> usize {
        self.calls.values().filter(|call| now.duration_since(call.started) < SPILL_AFTER).count()
    }

    /// When the next running call will have run for [`SPILL_AFTER`].
    fn next_stall(&self, now: Instant) -> Option<Instant> {
        let running = self.calls.values().filter(|call| now.duration_since(call.started) < SPILL_AFTER);
        running.map(|call| call.started + SPILL_AFTER).min()
    }

    fn start(&mut self, id: u64, keys: Vec<Key>, checks: usize) {
        for key in &keys {
            *self.keys.entry(*key).or_default() += 1;
        }
        self.calls.insert(id, RunningCall { started: Instant::now(), keys, checks });
    }

    /// Forgets call `id`; how many checks it had.
    fn end(&mut self, id: u64) -> usize {
        let Some(RunningCall { keys, checks, .. }) = self.calls.remove(&id) else { return 0 };
        for key in keys {
            if let Some(n) = self.keys.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.keys.remove(&key);
                }
            }
        }
        checks
    }
}

#[cfg(test)]
mod tests;
