//! `max_wait`: a check that would be denied, and could pass within
//! `max_wait`, is held and checked again when its denial says room comes
//! back (or when [`Waiters::wake`] says room was freed), until it is
//! admitted or its deadline passes. Each recheck is one round trip; nothing
//! polls between them.
//!
//! A held request waits in the queue of the bucket that keeps it out
//! longest, and only a queue's first rechecks; a recheck denied by another
//! bucket moves it to the back of that bucket's queue, so a request its own
//! bucket denies never holds up those waiting on a bucket they share.

use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::plan::Applied;
use super::waiters::{Waiter, Waiters};
use super::{BucketDecision, CheckError, CheckRequest, Decision, Invalid, Limiter};
use crate::algorithm::Algorithm;
use crate::storage::{Freed, Key, Leases, Store};
use crate::telemetry;

/// The shortest sleep between two rechecks, so that a denial naming a
/// time already past cannot turn the wait into a busy loop.
const MIN_RECHECK: Duration = Duration::from_millis(10);

/// How often the first waiter for a concurrency slot rechecks where
/// releases cannot be heard: a few round trips a second per waited-on key.
pub const RELEASE_POLL: Duration = Duration::from_millis(250);

/// Wakes the waiters on each key whose slots a released lease freed, as
/// the store hears of releases on any instance, for as long as `limiter`
/// lives; every waiter when releases may have gone unheard. Behind a
/// transaction pooler nothing is heard: waiters for slots then recheck
/// every [`RELEASE_POLL`].
pub fn wake_on_releases<S: Store + Leases + 'static>(limiter: &Arc<Limiter<S>>) {
    let Some(mut heard) = limiter.store.releases_heard() else {
        limiter.waiters.poll_for_releases();
        return;
    };
    let limiter: Weak<Limiter<S>> = Arc::downgrade(limiter);
    tokio::spawn(async move {
        loop {
            let freed = match heard.recv().await {
                Ok(freed) => freed,
                Err(RecvError::Lagged(_)) => Freed::Any, // which keys is lost
                Err(RecvError::Closed) => return,
            };
            let Some(live) = limiter.upgrade() else { return };
            match freed {
                Freed::Slots(key) => live.waiters.wake(&key),
                Freed::Any => live.waiters.wake_all(),
            }
        }
    });
}

impl<S: Store> Limiter<S> {
    /// Who is held, and the entry point that wakes them.
    pub fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    /// Decides `request`, holding it up to `max_wait` if it would be
    /// denied; `None` or zero: [`Limiter::check`]. The answer's `waited_ms`
    /// says how long it was held.
    pub async fn check_waiting(
        &self,
        request: &CheckRequest,
        max_wait: Option<Duration>,
    ) -> Result<Decision, CheckError> {
        let Some(max_wait) = max_wait.filter(|w| !w.is_zero()) else {
            return self.check(request).await;
        };
        let bound = self.waiters.limits().max_wait;
        if max_wait > bound {
            return Err(Invalid::MaxWait { bound_ms: bound.as_millis() as u64 }.into());
        }
        let started = Instant::now();
        let deadline = started + max_wait;
        let wakes = self.waiters.wakes();
        let (queue, first) = match self.arrive(request, deadline).await? {
            Arrival::Queue(key, first) => (key, first),
            Arrival::Answer(decision) => return Ok(decision.waited(Duration::ZERO)),
        };
        let Some(waiter) = self.waiters.enter(queue) else {
            return self.answer_now(request, first).await.map(|d| d.waited(Duration::ZERO));
        };
        // Room freed between the first check and entering would go unheard.
        let first = first.filter(|_| self.waiters.wakes() == wakes);
        let decision = self.wait(request, waiter, first, deadline).await?;
        telemetry::wait_ended(decision.allowed);
        Ok(decision.waited(started.elapsed()))
    }

    /// Where a new request with `max_wait` goes: behind this instance's
    /// waiters on one of its keys, whatever the store would say (so it
    /// cannot take the room they wait for); else it checks, and queues only
    /// if its denial is one waiting could turn.
    async fn arrive(&self, request: &CheckRequest, deadline: Instant) -> Result<Arrival, CheckError> {
        let keys: Vec<Key> = self.plan(request)?.check.buckets.iter().map(|b| b.key).collect();
        if let Some(key) = self.waiters.queued_on(&keys) {
            return Ok(Arrival::Queue(key, None));
        }
        let first = self.check(request).await?;
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
                let at = self.recheck_at(denial);
                match until(&mut waiter, at.min(deadline)).await {
                    Wake::Closing => break,
                    Wake::Time if Instant::now() >= deadline => break,
                    Wake::Time | Wake::Changed => {}
                }
            }
            let wakes = self.waiters.wakes();
            let decision = self.check(request).await?;
            let Some(key) = held_for(&decision, deadline) else { return Ok(decision) };
            let moved = key != waiter.key();
            if !waiter.move_to(key) {
                return Ok(decision); // the queue of the bucket it waits on now is full
            }
            // A wake between the check and the move went to the queue it left.
            let missed_wake = moved && self.waiters.wakes() != wakes;
            last = (!missed_wake).then_some(decision);
        }
        self.answer_now(request, last).await
    }

    /// When to check `denial`'s request again: when the bucket it waits on
    /// has room. Denied by any bucket that is not a slot, that is when the
    /// last of those has room (a slot is looked at then); denied by slots
    /// alone, when a lease ends, or, where releases cannot be heard, at the
    /// next poll.
    fn recheck_at(&self, denial: &Decision) -> Instant {
        let denying = || denial.buckets.iter().filter(|b| !b.allowed);
        let timed = || denying().filter(|b| b.algorithm != Algorithm::Concurrency);
        let at = if timed().next().is_some() {
            room_at(denial, timed())
        } else if self.waiters.polls_for_releases() {
            room_at(denial, denying()).min(Instant::now() + RELEASE_POLL)
        } else {
            room_at(denial, denying())
        };
        at.max(Instant::now() + MIN_RECHECK)
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
            None => self.check(request).await,
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

/// The key to wait on if `decision` is a denial that waiting could turn:
/// not a block, not a deny list, not shadow, and room due by `deadline`.
/// That is the denying bucket whose room comes last, so a request waits in
/// the queue of what keeps it out longest (its own exhausted bucket, not a
/// shared one others wait for). A release can free a concurrency slot at
/// any time, so only the other buckets' room must be due; a request denied
/// by slots alone waits on the first, which a release heard from any
/// instance wakes.
fn held_for(decision: &Decision, deadline: Instant) -> Option<Key> {
    let deny_listed = decision.matched.as_ref().is_some_and(|m| m.action == Applied::Deny);
    if decision.allowed || decision.blocked_by.is_some() || deny_listed || decision.shadow {
        return None;
    }
    let denying = || decision.buckets.iter().filter(|b| !b.allowed);
    let timed = || denying().filter(|b| b.algorithm != Algorithm::Concurrency);
    (room_at(decision, timed()) <= deadline).then_some(())?;
    let last_room = timed().max_by_key(|b| b.retry_at.unwrap_or(b.reset_at));
    last_room.or_else(|| denying().next()).map(|b| b.key)
}

/// When every one of `buckets` has room again, on this instance's clock.
fn room_at<'a>(decision: &Decision, buckets: impl Iterator<Item = &'a BucketDecision>) -> Instant {
    let at = buckets.map(|b| b.retry_at.unwrap_or(b.reset_at)).max().unwrap_or(decision.now);
    Instant::now() + until_time(decision.now, at)
}

fn until_time(now: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}
