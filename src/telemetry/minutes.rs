//! This instance's checks and denials in each of the last minutes, for the
//! console's overview (`GET /admin/overview`).
//!
//! A check adds to two running totals (one relaxed atomic add, two when
//! denied); a task ([`sample_every_minute`]) reads them once a minute and
//! keeps what each minute added. The check path thus pays what a metric
//! counter costs, and nothing of clocks or locks. Unlike the Prometheus
//! counters these exist with `PGLIMIT_METRICS=false` too, and belong to one
//! service (a test process runs several).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tokio::task::JoinHandle;

/// Minutes an overview shows, the current one included.
pub const MINUTES_SHOWN: usize = 15;

/// The checks and denials that one minute saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minute {
    /// When the minute began.
    pub start: DateTime<Utc>,
    pub checks: u64,
    pub denied: u64,
}

/// The running totals, and the minutes closed from them.
#[derive(Debug)]
pub struct Minutes {
    checks: AtomicU64,
    denied: AtomicU64,
    closed: Mutex<Closed>,
}

#[derive(Debug)]
struct Closed {
    /// The minute being counted, and the totals when it began.
    current: DateTime<Utc>,
    at_start: (u64, u64),
    /// The latest closed minutes, oldest first.
    minutes: VecDeque<Minute>,
}

impl Default for Minutes {
    fn default() -> Self {
        let closed = Closed { current: minute_of(Utc::now()), at_start: (0, 0), minutes: VecDeque::new() };
        Self { checks: AtomicU64::new(0), denied: AtomicU64::new(0), closed: Mutex::new(closed) }
    }
}

impl Minutes {
    /// A decided check; `denied` when it was refused.
    pub fn check(&self, denied: bool) {
        self.checks.fetch_add(1, Relaxed);
        if denied {
            self.denied.fetch_add(1, Relaxed);
        }
    }

    fn totals(&self) -> (u64, u64) {
        (self.checks.load(Relaxed), self.denied.load(Relaxed))
    }

    /// Closes the minute being counted, as of `now`: what it added is kept
    /// under its start, and counting goes on under `now`'s minute.
    pub fn close(&self, now: DateTime<Utc>) {
        let totals = self.totals();
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let minute = added(closed.current, closed.at_start, totals);
        closed.minutes.push_back(minute);
        while closed.minutes.len() > MINUTES_SHOWN {
            closed.minutes.pop_front();
        }
        closed.current = minute_of(now).max(closed.current + TimeDelta::minutes(1));
        closed.at_start = totals;
    }

    /// The last [`MINUTES_SHOWN`] minutes up to `now`'s, oldest first, the
    /// last one still counting; a minute nothing was kept for (before the
    /// service started) shows zeros.
    pub fn last(&self, now: DateTime<Utc>) -> Vec<Minute> {
        let totals = self.totals();
        let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let current = added(closed.current, closed.at_start, totals);
        let newest = minute_of(now).max(closed.current);
        (0..MINUTES_SHOWN as i32)
            .rev()
            .map(|ago| newest - TimeDelta::minutes(ago.into()))
            .map(|start| match closed.minutes.iter().chain([&current]).find(|m| m.start == start) {
                Some(minute) => *minute,
                None => Minute { start, checks: 0, denied: 0 },
            })
            .collect()
    }
}

/// What the totals gained since `at_start`, as the minute `start`.
fn added(start: DateTime<Utc>, at_start: (u64, u64), now: (u64, u64)) -> Minute {
    Minute { start, checks: now.0.wrapping_sub(at_start.0), denied: now.1.wrapping_sub(at_start.1) }
}

fn minute_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::minutes(1)).unwrap_or(t)
}

/// Closes a minute of `minutes` at each turn of the clock's minute, until
/// aborted (the service's background tasks are, when it is dropped).
pub fn sample_every_minute(minutes: Arc<Minutes>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let now = Utc::now();
            let next = minute_of(now) + TimeDelta::minutes(1);
            let wait = (next - now).to_std().unwrap_or_default();
            tokio::time::sleep(wait).await;
            minutes.close(Utc::now().max(next));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64, second: i64) -> DateTime<Utc> {
        // 2027-01-15T08:00:00Z, on the hour.
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
            + TimeDelta::minutes(minute)
            + TimeDelta::seconds(second)
    }

    fn fresh(now: DateTime<Utc>) -> Minutes {
        let minutes = Minutes::default();
        minutes.closed.lock().unwrap().current = minute_of(now);
        minutes
    }

    #[test]
    fn each_minute_shows_what_was_counted_in_it_and_the_current_one_so_far() {
        let minutes = fresh(at(10, 5));
        (0..3).for_each(|_| minutes.check(false));
        minutes.check(true);
        minutes.close(at(11, 0));
        minutes.check(true);
        let last = minutes.last(at(11, 30));
        assert_eq!(last.len(), MINUTES_SHOWN);
        assert_eq!(last[MINUTES_SHOWN - 2], Minute { start: at(10, 0), checks: 4, denied: 1 });
        assert_eq!(last[MINUTES_SHOWN - 1], Minute { start: at(11, 0), checks: 1, denied: 1 });
        assert!(last[..MINUTES_SHOWN - 2].iter().all(|m| m.checks == 0), "{last:?}");
        assert_eq!(last[0].start, at(11 - 14, 0));
    }

    #[test]
    fn only_the_last_fifteen_minutes_are_kept() {
        let minutes = fresh(at(0, 0));
        for minute in 1..=40 {
            minutes.check(false);
            minutes.close(at(minute, 0));
        }
        assert_eq!(minutes.closed.lock().unwrap().minutes.len(), MINUTES_SHOWN);
        let last = minutes.last(at(40, 1));
        assert_eq!(
            last.iter().map(|m| m.checks).sum::<u64>(),
            14,
            "14 closed minutes and the empty current one"
        );
    }

    #[test]
    fn a_late_sample_still_moves_on_by_at_least_a_minute() {
        let minutes = fresh(at(5, 0));
        minutes.close(at(5, 59));
        assert_eq!(minutes.closed.lock().unwrap().current, at(6, 0));
    }
}
