//! The requests held by `max_wait`: one queue per key waited on, served in
//! arrival order within this instance, a bound on how many are held (and a
//! share of it per key), and the two ways to hurry them: [`Queues::wake`]
//! (room was freed on a key) and [`Queues::close`] (the service is
//! shutting down).
//!
//! Queues signal through `watch` channels rather than `Notify`: a waiter
//! that is between two looks at its queue still sees a change made then.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::waiter::{ByKey, Waiter};

use crate::policy::MAX_WAIT_CEILING;
use crate::storage::Key;
use crate::telemetry;

/// A key may hold at most this fraction (1 / `KEY_SHARE`) of the pool, so
/// that the callers of one key cannot take every place.
const KEY_SHARE: usize = 10;

/// What the operator allows: how many requests may be held at once
/// (`PGLIMIT_MAX_WAITING`) and the longest `max_wait` accepted.
#[derive(Debug, Clone, Copy)]
pub struct WaitLimits {
    pub max_waiting: usize,
    pub max_wait: Duration,
}

impl WaitLimits {
    /// A wait, then its last check (which may take `longest_check`), and the
    /// answer's writing (1 s) end before the request timeout cuts the
    /// request off with a 503.
    pub fn new(max_waiting: usize, request_timeout: Duration, longest_check: Duration) -> Self {
        let fits = request_timeout.saturating_sub(longest_check + Duration::from_secs(1));
        Self { max_waiting, max_wait: fits.min(MAX_WAIT_CEILING) }
    }

    /// The most requests held on one key waited on: a tenth of the pool,
    /// rounded up (so at least 1 while waiting is on).
    pub fn per_key(&self) -> usize {
        self.max_waiting.div_ceil(KEY_SHARE)
    }
}

impl Default for WaitLimits {
    /// Those of a service with default settings: 30 s requests, 5 s for
    /// the longest check (20 × 250 ms), so waits of up to 24 s.
    fn default() -> Self {
        Self::new(500, Duration::from_secs(30), Duration::from_secs(5))
    }
}

/// Every queue of held requests on this instance, and the bound on them.
pub struct Queues {
    limits: WaitLimits,
    queues: Mutex<ByKey>,
    pub(super) held: AtomicUsize,
    tickets: AtomicU64,
    pub(super) closing: watch::Sender<bool>,
    /// Releases are not heard here: waiters for slots poll.
    polls: AtomicBool,
    /// Bumped by every wake, under the `queues` lock.
    wakes: AtomicU64,
}

impl Queues {
    pub fn new(limits: WaitLimits) -> Self {
        let (closing, _) = watch::channel(false);
        Self {
            limits,
            queues: Mutex::default(),
            held: AtomicUsize::new(0),
            tickets: AtomicU64::new(0),
            closing,
            polls: AtomicBool::new(false),
            wakes: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> WaitLimits {
        self.limits
    }

    /// Releases will not be heard ([`Queues::wake`] never called): a
    /// request waiting for a slot rechecks at intervals instead.
    pub fn poll_for_releases(&self) {
        self.polls.store(true, Ordering::Relaxed);
    }

    pub fn polls_for_releases(&self) -> bool {
        self.polls.load(Ordering::Relaxed)
    }

    /// Room was freed on `key` (a lease released, heard through the
    /// instances' notifications): its first waiter rechecks now rather
    /// than at the time its denial named. A key nobody waits on costs a
    /// map lookup and a count.
    pub fn wake(&self, key: &Key) {
        let queues = self.lock();
        self.wakes.fetch_add(1, Ordering::AcqRel);
        if let Some(queue) = queues.get(key) {
            queue.bump();
        }
    }

    /// Room may have been freed on any key (releases may have gone
    /// unheard): the first waiter of every queue rechecks now.
    pub fn wake_all(&self) {
        let queues = self.lock();
        self.wakes.fetch_add(1, Ordering::AcqRel);
        queues.values().for_each(|queue| queue.bump());
    }

    /// How many wakes there have been. A request that checked before it
    /// entered a queue (or moved to another) compares this before and after:
    /// a wake in between found it in no queue to tell, so it rechecks at once.
    pub fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Acquire)
    }

    /// The service is stopping: every held request answers now (its last
    /// denial), and none is held from now on.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    pub fn is_closed(&self) -> bool {
        *self.closing.borrow()
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// How many requests this instance holds waiting on `key`.
    pub fn waiting_on(&self, key: &Key) -> usize {
        self.lock().get(key).map_or(0, |queue| queue.len())
    }

    /// The first of `keys` that has waiters: a new request on it queues
    /// behind them rather than taking the room they wait for.
    pub fn queued_on<'k>(&self, keys: impl IntoIterator<Item = &'k Key>) -> Option<Key> {
        let queues = self.lock();
        keys.into_iter().find(|k| queues.contains_key(*k)).copied()
    }

    /// A place at the back of `key`'s queue, or `None` when
    /// `PGLIMIT_MAX_WAITING` requests are held already, or `key`'s share of
    /// them ([`WaitLimits::per_key`]), or the service is shutting down.
    pub fn enter(&self, key: Key) -> Option<Waiter<'_>> {
        if self.limits.max_waiting == 0 {
            return None; // waiting is off: no series, nothing to count
        }
        let mut queues = self.lock();
        if self.is_closed() || !self.has_room(&queues, &key) || !self.take_place() {
            drop(queues);
            telemetry::wait_refused();
            return None;
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let waiter = Waiter::join(self, &mut queues, key, ticket);
        drop(queues);
        telemetry::waiting(self.held());
        Some(waiter)
    }

    /// Whether `key`'s queue may take one more: fewer than its share.
    pub(super) fn has_room(&self, queues: &ByKey, key: &Key) -> bool {
        queues.get(key).is_none_or(|queue| queue.len() < self.limits.per_key())
    }

    /// Counts one more held, unless `PGLIMIT_MAX_WAITING` are.
    fn take_place(&self) -> bool {
        let max = self.limits.max_waiting;
        self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ByKey> {
        lock(&self.queues)
    }
}

/// A poisoned lock only means a waiter panicked while holding it; the
/// queue itself is still whole (every change is one call).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(max_waiting: usize) -> Queues {
        Queues::new(WaitLimits { max_waiting, max_wait: Duration::from_secs(1) })
    }

    #[test]
    fn the_first_to_enter_is_first_and_the_next_follows_when_it_leaves() {
        let w = queues(20);
        let (first, second) = (w.enter([1; 32]).expect("room"), w.enter([1; 32]).expect("room"));
        assert!(first.is_first() && !second.is_first());
        drop(first);
        assert!(second.is_first());
        assert_eq!(w.held(), 1);
    }

    #[test]
    fn past_the_bound_or_after_close_nobody_is_held() {
        let w = queues(1);
        let held = w.enter([1; 32]).expect("room");
        assert!(w.enter([2; 32]).is_none(), "the bound is per instance, not per key");
        drop(held);
        w.close();
        assert!(w.enter([2; 32]).is_none());
        assert_eq!(w.held(), 0);
    }

    #[test]
    fn a_queue_is_forgotten_when_its_last_waiter_leaves() {
        let w = queues(4);
        let waiter = w.enter([3; 32]).expect("room");
        assert_eq!(w.queued_on([&[9; 32], &[3; 32]]), Some([3; 32]));
        drop(waiter);
        assert_eq!(w.queued_on([&[3; 32]]), None);
    }

    #[test]
    fn waking_a_key_tells_its_queues() {
        let w = queues(4);
        let mut waiter = w.enter([5; 32]).expect("room");
        waiter.changed.mark_unchanged();
        w.wake(&[5; 32]);
        assert!(waiter.changed.has_changed().unwrap_or(false));
    }

    #[test]
    fn waking_all_tells_the_waiters_of_every_key() {
        let w = queues(4);
        let mut places = [w.enter([6; 32]).expect("room"), w.enter([7; 32]).expect("room")];
        places.iter_mut().for_each(|p| p.changed.mark_unchanged());
        w.wake_all();
        assert!(places.iter().all(|p| p.changed.has_changed().unwrap_or(false)));
    }

    #[test]
    fn a_wake_before_anyone_waits_is_counted_for_those_about_to() {
        let w = queues(4);
        let seen = w.wakes();
        w.wake(&[8; 32]);
        let _place = w.enter([8; 32]).expect("room");
        assert_ne!(w.wakes(), seen, "the request that checked before entering rechecks");
    }

    #[test]
    fn a_key_holds_at_most_a_tenth_of_the_pool_rounded_up() {
        let share = |max_waiting| queues(max_waiting).limits().per_key();
        assert_eq!((share(500), share(20), share(15), share(1)), (50, 2, 2, 1));
        let w = queues(20);
        let _held = [w.enter([1; 32]).expect("room"), w.enter([1; 32]).expect("room")];
        assert!(w.enter([1; 32]).is_none(), "past its share");
        assert!(w.enter([2; 32]).is_some(), "another key still has room");
    }

    #[test]
    fn a_waiter_moving_to_another_key_lets_the_next_on_its_old_key_recheck() {
        let w = queues(20);
        let (mut first, mut second) = (w.enter([1; 32]).expect("room"), w.enter([1; 32]).expect("room"));
        second.changed.mark_unchanged();
        assert!(first.move_to([2; 32]));
        assert!(second.is_first() && second.changed.has_changed().unwrap_or(false));
        assert!(first.is_first() && first.key() == [2; 32]);
        assert_eq!(w.held(), 2, "a move is no new waiter");
        drop((first, second));
        assert_eq!((w.held(), w.queued_on([&[1; 32], &[2; 32]])), (0, None));
    }

    #[test]
    fn a_waiter_does_not_move_to_a_key_holding_its_share() {
        let w = queues(20);
        let _full = [w.enter([2; 32]).expect("room"), w.enter([2; 32]).expect("room")];
        let mut waiter = w.enter([1; 32]).expect("room");
        assert!(!waiter.move_to([2; 32]));
        assert!(waiter.is_first() && waiter.key() == [1; 32], "it stays where it was");
    }
}
