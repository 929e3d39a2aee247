//! Telling a slow Postgres from a gone one.
//!
//! A check that has waited a whole timeout with no call of this instance
//! completing asks Postgres directly, on a connection kept open for the
//! purpose. How long that ping may take adapts to what has been seen: the
//! slowest recent ping (a busy database answers, slowly), and how late this
//! process's own timer fired (a starved process hears answers late). On a
//! quiet instance both are small and a dead server is declared gone after
//! about two timeouts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A ping is given this many times the recent ping latency...
const LATENCY_FACTOR: u32 = 4;
/// ...but never more than this many timeouts, so that a server that stops
/// answering under load is still declared gone within a bounded time.
const MAX_BUDGET_FACTOR: u32 = 4;

pub(super) struct Detector {
    timeout: Duration,
    epoch: Instant,
    /// Milliseconds since `epoch` when a primary call last completed.
    last_progress_ms: AtomicU64,
    /// One liveness ping at a time, however many checks are waiting.
    pinging: AtomicBool,
}

/// Held while this check is the one pinging.
pub(super) struct Asking<'a>(&'a AtomicBool);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Detector {
    pub fn new(timeout: Duration) -> Self {
        let (last_progress_ms, pinging) = (AtomicU64::new(0), AtomicBool::new(false));
        Self { timeout, epoch: Instant::now(), last_progress_ms, pinging }
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A call to the primary completed.
    pub fn progressed(&self) {
        self.last_progress_ms.fetch_max(self.now_ms(), Ordering::AcqRel);
    }

    /// Whether a call completed at or after `since_ms`.
    pub fn progressed_since(&self, since_ms: u64) -> bool {
        self.last_progress_ms.load(Ordering::Acquire) >= since_ms
    }

    /// `None` if another check is already pinging.
    pub fn start_ping(&self) -> Option<Asking<'_>> {
        (!self.pinging.swap(true, Ordering::AcqRel)).then_some(Asking(&self.pinging))
    }

    /// How long a ping may take: the timeout, widened by `recent` (the
    /// slowest recent ping) and by `lag` (how late this process's timer
    /// fired), within bounds.
    pub fn ping_budget(&self, recent: Duration, lag: Duration) -> Duration {
        let widened = self.timeout.max(recent * LATENCY_FACTOR).max(lag * 2);
        widened.min(self.timeout * MAX_BUDGET_FACTOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(100);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn on_a_quiet_instance_a_ping_gets_one_timeout() {
        assert_eq!(Detector::new(T).ping_budget(MS, Duration::ZERO), T);
    }

    #[test]
    fn slow_pings_and_a_late_timer_widen_the_budget_within_bounds() {
        let detector = Detector::new(T);
        assert_eq!(detector.ping_budget(MS * 60, Duration::ZERO), MS * 240);
        assert_eq!(detector.ping_budget(MS, MS * 150), MS * 300);
        assert_eq!(detector.ping_budget(Duration::from_secs(5), Duration::ZERO), T * MAX_BUDGET_FACTOR);
    }

    #[test]
    fn progress_is_seen_by_checks_waiting_since_before_it() {
        let detector = Detector::new(T);
        let since = detector.now_ms();
        assert!(!detector.progressed_since(since + 1));
        detector.progressed();
        assert!(detector.progressed_since(since));
    }

    #[test]
    fn one_check_pings_at_a_time() {
        let detector = Detector::new(T);
        let first = detector.start_ping();
        assert!(first.is_some());
        assert!(detector.start_ping().is_none());
        drop(first);
        assert!(detector.start_ping().is_some());
    }
}
