//! The slow-check log: the slowest checks since the last reset, each with
//! where its time went (`GET /admin/slow-checks`), like Redis' SLOWLOG.
//!
//! A histogram says how slow the slowest checks were, not what made them
//! slow; this keeps the few slowest whole. It holds at most `capacity`
//! entries. Once full, the fastest entry's total is the admission
//! threshold, kept in an atomic: a check that does not beat it costs one
//! atomic load (and one add to a per-thread counter of checks seen), and
//! only one that does takes the lock.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// One slow check: its total time in the service and its phases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowCheck {
    pub finished_at: DateTime<Utc>,
    /// From the handler starting to decide until the decision was back.
    pub total: Duration,
    /// Queued in this instance before its Postgres call; zero without one.
    pub queued: Duration,
    /// The Postgres call (statement, commit, round trip); zero without one.
    pub call: Duration,
    /// Checks decided by that call; 0 when no call decided this one.
    pub checks_in_call: u32,
    /// The store label of `pglimit_checks_total` (`postgres`, `deny_cache`, ...).
    pub store: &'static str,
    /// The decision label of `pglimit_checks_total` (`allowed`, `error`, ...).
    pub decision: &'static str,
    /// The policy's name, or `_adhoc`: configuration, never a key.
    pub policy: Box<str>,
}

/// Ranked by total time alone, so that the heap's top is the fastest entry.
struct Ranked(SlowCheck);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.0.total == other.0.total
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total.cmp(&other.0.total)
    }
}

/// What the log holds, as listed: the slowest first.
#[derive(Debug, Clone)]
pub struct SlowListing {
    pub capacity: usize,
    /// When the log was last reset (or the service started).
    pub since: DateTime<Utc>,
    /// Checks seen since then, slow or not.
    pub seen: u64,
    pub checks: Vec<SlowCheck>,
}

pub struct SlowChecks {
    capacity: usize,
    /// In nanoseconds: a check must take longer to be admitted. Zero until
    /// the log is full; `u64::MAX` when the log is off.
    threshold: AtomicU64,
    seen: Seen,
    log: Mutex<Log>,
}

struct Log {
    /// A min-heap on total time: the fastest entry is evicted first.
    heap: BinaryHeap<Reverse<Ranked>>,
    since: DateTime<Utc>,
}

impl SlowChecks {
    /// A log of the `capacity` slowest checks; 0 keeps nothing.
    pub fn new(capacity: usize) -> Self {
        let log = Log { heap: BinaryHeap::with_capacity(capacity), since: Utc::now() };
        let threshold = AtomicU64::new(Self::empty_threshold(capacity));
        Self { capacity, threshold, seen: Seen::default(), log: Mutex::new(log) }
    }

    fn empty_threshold(capacity: usize) -> u64 {
        if capacity == 0 {
            u64::MAX
        } else {
            0
        }
    }

    /// Whether checks should be timed for it at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Counts a check that took `total`, and keeps it (as `entry` makes it)
    /// if it is among the slowest; `entry` is called only then.
    pub fn offer(&self, total: Duration, entry: impl FnOnce() -> SlowCheck) {
        if !self.enabled() {
            return;
        }
        self.seen.add();
        if nanos(total) <= self.threshold.load(Relaxed) {
            return;
        }
        self.admit(entry());
    }

    fn admit(&self, entry: SlowCheck) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.heap.len() >= self.capacity {
            // Checked again under the lock: another check may have raised the bar.
            match log.heap.peek() {
                Some(Reverse(fastest)) if fastest.0.total < entry.total => drop(log.heap.pop()),
                _ => return,
            }
        }
        log.heap.push(Reverse(Ranked(entry)));
        if log.heap.len() >= self.capacity {
            let fastest = log.heap.peek().map_or(0, |Reverse(r)| nanos(r.0.total));
            self.threshold.store(fastest, Relaxed);
        }
    }

    /// What the log holds now, the slowest first.
    pub fn listing(&self) -> SlowListing {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let checks = log.heap.iter().map(|Reverse(r)| r.0.clone()).collect();
        self.listed(checks, log.since)
    }

    /// Empties the log and its count of checks seen; returns what it held.
    pub fn reset(&self) -> SlowListing {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let held = std::mem::take(&mut log.heap);
        let listing = self.listed(held.into_iter().map(|Reverse(r)| r.0).collect(), log.since);
        log.since = Utc::now();
        self.seen.clear();
        self.threshold.store(Self::empty_threshold(self.capacity), Relaxed);
        listing
    }

    fn listed(&self, mut checks: Vec<SlowCheck>, since: DateTime<Utc>) -> SlowListing {
        checks.sort_by_key(|c| Reverse(c.total));
        SlowListing { capacity: self.capacity, since, seen: self.seen.total(), checks }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Stripes of the count of checks seen, one cache line each.
const STRIPES: usize = 16;

/// The count of checks seen, striped by thread so that the cores do not
/// all write one cache line on every check.
#[derive(Default)]
struct Seen([Stripe; STRIPES]);

#[derive(Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// Hands each thread its stripe in turn.
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Relaxed) % STRIPES;
}

impl Seen {
    fn add(&self) {
        let stripe = STRIPE.with(|s| *s);
        self.0[stripe].0.fetch_add(1, Relaxed);
    }

    fn total(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Relaxed)).sum()
    }

    fn clear(&self) {
        self.0.iter().for_each(|s| s.0.store(0, Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(total_ms: u64) -> SlowCheck {
        SlowCheck {
            finished_at: Utc::now(),
            total: Duration::from_millis(total_ms),
            queued: Duration::ZERO,
            call: Duration::ZERO,
            checks_in_call: 0,
            store: "memory",
            decision: "allowed",
            policy: "_adhoc".into(),
        }
    }

    fn offer(log: &SlowChecks, total_ms: u64) {
        log.offer(Duration::from_millis(total_ms), || check(total_ms));
    }

    fn totals_ms(log: &SlowChecks) -> Vec<u128> {
        log.listing().checks.iter().map(|c| c.total.as_millis()).collect()
    }

    #[test]
    fn the_log_keeps_the_slowest_checks_slowest_first() {
        let log = SlowChecks::new(3);
        for ms in [5, 1, 9, 3, 7, 2, 8] {
            offer(&log, ms);
        }
        assert_eq!(totals_ms(&log), [9, 8, 7]);
        assert_eq!(log.listing().seen, 7);
    }

    #[test]
    fn once_full_the_fastest_entry_is_the_bar_a_check_must_beat() {
        let log = SlowChecks::new(2);
        offer(&log, 4);
        assert_eq!(log.threshold.load(Relaxed), 0, "not full: every check is admitted");
        offer(&log, 6);
        assert_eq!(log.threshold.load(Relaxed), nanos(Duration::from_millis(4)));
        let mut built = false;
        log.offer(Duration::from_millis(4), || {
            built = true;
            check(4)
        });
        assert!(!built, "a check that only ties the bar is not even built");
        offer(&log, 5);
        assert_eq!(totals_ms(&log), [6, 5]);
        assert_eq!(log.threshold.load(Relaxed), nanos(Duration::from_millis(5)), "the bar rose");
    }

    #[test]
    fn a_reset_empties_the_log_and_answers_what_it_held() {
        let log = SlowChecks::new(2);
        for ms in [3, 8, 1] {
            offer(&log, ms);
        }
        let held = log.reset();
        assert_eq!(held.checks.iter().map(|c| c.total.as_millis()).collect::<Vec<_>>(), [8, 3]);
        assert_eq!(held.seen, 3);
        let now = log.listing();
        assert!(now.checks.is_empty() && now.seen == 0, "{now:?}");
        assert!(now.since >= held.since);
        offer(&log, 1);
        assert_eq!(totals_ms(&log), [1], "the bar is down again: a fast check is admitted");
    }

    #[test]
    fn capacity_zero_keeps_and_counts_nothing() {
        let log = SlowChecks::new(0);
        assert!(!log.enabled());
        log.offer(Duration::from_secs(60), || panic!("no entry is built when the log is off"));
        assert!(log.listing().checks.is_empty());
        assert_eq!(log.listing().seen, 0);
        log.reset();
        log.offer(Duration::from_secs(60), || panic!("nor after a reset"));
    }

    #[test]
    fn checks_offered_from_many_threads_are_all_counted_and_the_slowest_kept() {
        let log = SlowChecks::new(4);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let log = &log;
                s.spawn(move || (0..100).for_each(|i| offer(log, t * 100 + i)));
            }
        });
        assert_eq!(log.listing().seen, 800);
        assert_eq!(totals_ms(&log), [799, 798, 797, 796]);
    }
}
