//! `max_wait`: a check that would be denied, and could pass within
//! `max_wait`, is held and checked again when its denial says room comes
//! back (or when [`Queues::wake`] says room was freed), until it is
//! admitted or its deadline passes. Each recheck is one round trip; nothing
//! polls between them.
//!
//! A held request waits in the queue of the bucket that keeps it out
//! longest, and only a queue's first rechecks; a recheck denied by another
//! bucket moves it to the back of that bucket's queue, so a request its own
//! bucket denies never holds up those waiting on a bucket they share.
//!
//! Here is the held check's loop; `room.rs` reads a denial (which key to
//! wait on, and when to look again), `queues.rs` keeps the per-key queues
//! and the bound on how many are held, `waiter.rs` a held request's place.

mod queues;
mod room;
mod waiter;

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

pub use queues::{Queues, WaitLimits};
use room::{held_for, recheck_at};
pub use waiter::Waiter;

use super::checks::{Checks, Decision};
use super::request::{CheckError, CheckRequest, Invalid};
use crate::storage::{Freed, Key, LeaseStore, Store};
use crate::telemetry;

/// Checks with `max_wait`: each is decided by [`Checks`], and held in
/// [`Queues`] while waiting could turn its denial.
pub struct Waiting<S> {
    checks: Checks<S>,
    queues: Queues,
}

impl<S: Store> Waiting<S> {
    /// Holds checks within `limits`.
    pub fn new(checks: Checks<S>, limits: WaitLimits) -> Self {
        telemetry::waits_expected(limits.max_waiting > 0);
        Self { checks, queues: Queues::new(limits) }
    }

    /// Who is held, and the entry point that wakes them.
    pub fn queues(&self) -> &Queues {
        &self.queues
    }

    /// Wakes the waiters on each key whose slots a released lease freed, as
    /// the store hears of releases on any instance, for as long as `self`
    /// lives; every waiter when releases may have gone unheard. Behind a
    /// transaction pooler nothing is heard: waiters for slots then recheck
    /// every `RELEASE_POLL` (`room.rs`).
    pub fn wake_on_releases(self: &Arc<Self>)
    where
        S: LeaseStore,
    {
        let Some(mut heard) = self.checks.store().releases_heard() else {
            self.queues.poll_for_releases();
            return;
        };
        let waiting: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let freed = match heard.recv().await {
                    Ok(freed) => freed,
                    Err(RecvError::Lagged(_)) => Freed::Any, // which keys is lost
                    Err(RecvError::Closed) => return,
                };
                let Some(live) = waiting.upgrade() else { return };
                match freed {
                    Freed::Slots(key) => live.queues.wake(&key),
                    Freed::Any => live.queues.wake_all(),
                }
            }
        });
    }

    /// Decides `request`, holding it up to `max_wait` if it would be
    /// denied; zero: [`Checks::check`]. The answer's `waited_ms` says how
    /// long it was held. A denial answered is counted once for the top
    /// list, however many times the check was tried while held.
    pub async fn check(&self, request: &CheckRequest, max_wait: Duration) -> Result<Decision, CheckError> {
        if max_wait.is_zero() {
            return self.checks.check(request).await;
        }
        let decision = self.hold(request, max_wait).await?;
        self.checks.tally_answer(request, &decision);
        Ok(decision)
    }

    /// [`Waiting::check`] with a `max_wait` above zero.
    async fn hold(&self, request: &CheckRequest, max_wait: Duration) -> Result<Decision, CheckError> {
        let bound = self.queues.limits().max_wait;
        if max_wait > bound {
            return Err(Invalid::MaxWait { bound_ms: bound.as_millis() as u64 }.into());
        }
        let started = Instant::now();
        let deadline = started + max_wait;
        let wakes = self.queues.wakes();
        let (queue, first) = match self.arrive(request, deadline).await? {
            Arrival::Queue(key, first) => (key, first),
            Arrival::Answer(decision) => return Ok(decision.waited(Duration::ZERO)),
        };
        let Some(waiter) = self.queues.enter(queue) else {
            return self.answer_now(request, first).await.map(|d| d.waited(Duration::ZERO));
        };
        // Room freed between the first check and entering would go unheard.
        let first = first.filter(|_| self.queues.wakes() == wakes);
        let decision = self.wait(request, waiter, first, deadline).await?;
        telemetry::wait_ended(decision.allowed);
        Ok(decision.waited(started.elapsed()))
    }

    /// Where a new request with `max_wait` goes: behind this instance's
    /// waiters on one of its keys, whatever the store would say (so it
    /// cannot take the room they wait for); else it checks, and queues only
    /// if its denial is one waiting could turn.
    async fn arrive(&self, request: &CheckRequest, deadline: Instant) -> Result<Arrival, CheckError> {
        let keys: Vec<Key> = self.checks.plan(request)?.check.buckets.iter().map(|b| b.key).collect();
        if let Some(key) = self.queues.queued_on(&keys) {
            return Ok(Arrival::Queue(key, None));
        }
        let first = self.checks.attempt(request).await?;
        Ok(match held_for(&first, deadline) {
            Some(key) => Arrival::Queue(key, Some(first)),
            None => Arrival::Answer(first),
        })
    }

    /// Holds `request` as `waiter` until it is admitted, its deadline
    /// passes, or the service shuts down; `last` is its latest denial.
    async fn wait(
        &self,
        request: &CheckRequest,
        mut waiter: Waiter<'_>,
        mut last: Option<Decision>,
        deadline: Instant,
    ) -> Result<Decision, CheckError> {
        loop {
            if !waiter.is_first() {
                // Rechecked at once on reaching the front: the one before
                // left because it was admitted (room may remain), gave up,
                // or moved to the queue of a bucket of its own.
                last = None;
                match until(&mut waiter, deadline).await {
                    Wake::Changed => continue,
                    Wake::Time | Wake::Closing => break,
                }
            }
            if let Some(denial) = &last {
                let at = recheck_at(denial, self.queues.polls_for_releases());
                match until(&mut waiter, at.min(deadline)).await {
                    Wake::Closing => break,
                    Wake::Time if Instant::now() >= deadline => break,
                    Wake::Time | Wake::Changed => {}
                }
            }
            let wakes = self.queues.wakes();
            let decision = self.checks.attempt(request).await?;
            let Some(key) = held_for(&decision, deadline) else { return Ok(decision) };
            let moved = key != waiter.key();
            if !waiter.move_to(key) {
                return Ok(decision); // the queue of the bucket it waits on now is full
            }
            // A wake between the check and the move went to the queue it left.
            let missed_wake = moved && self.queues.wakes() != wakes;
            last = (!missed_wake).then_some(decision);
        }
        self.answer_now(request, last).await
    }

    /// The denial to answer with: the latest, or, for a request that never
    /// checked (it queued behind others), one check now.
    async fn answer_now(
        &self,
        request: &CheckRequest,
        last: Option<Decision>,
    ) -> Result<Decision, CheckError> {
        match last {
            Some(denial) => Ok(denial),
            None => self.checks.attempt(request).await,
        }
    }
}

/// What becomes of a request with `max_wait` when it arrives.
enum Arrival {
    /// It waits in the queue of this key, with its first denial if it checked.
    Queue(Key, Option<Decision>),
    /// It is answered now: admitted, or a denial waiting cannot turn.
    Answer(Decision),
}

/// Why a held request stopped sleeping.
enum Wake {
    /// The time it slept until came.
    Time,
    /// Its queue changed: the front left, or its key was woken.
    Changed,
    /// The service is shutting down.
    Closing,
}

/// Sleeps until `at`, or until the queue changes or the service stops.
async fn until(waiter: &mut Waiter<'_>, at: Instant) -> Wake {
    if *waiter.closing.borrow() {
        return Wake::Closing;
    }
    tokio::select! {
        () = tokio::time::sleep_until(at) => Wake::Time,
        Ok(()) = waiter.changed.changed() => Wake::Changed,
        _ = waiter.closing.changed() => Wake::Closing,
    }
}
