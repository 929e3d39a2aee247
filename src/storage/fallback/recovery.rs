//! Returning to Postgres: probe until it answers, hand it what memory
//! admitted, then serve from Postgres again.
//!
//! Memory keeps deciding while its debts are written (draining them leaves
//! its decisions as they were), so a write-back that takes a while admits
//! nothing extra. What Postgres did not take goes back into memory and is
//! tried again; after [`TRIES`] probes that answered, the instance returns
//! to Postgres anyway and keeps writing the rest in the background, so a
//! write-back that keeps failing cannot hold a healthy Postgres out of use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;

use super::FallbackStore;
use crate::storage::{Primary, Store, Unabsorbed};
use crate::telemetry;

/// Smallest budget for a recovery probe, which must open a connection.
const MIN_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Write-backs tried while still degraded.
const TRIES: u32 = 3;
/// At most one warning of a kind per this period.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(10);

impl<P: Primary> FallbackStore<P> {
    /// Runs until Postgres is back and has taken what memory admitted.
    pub(super) async fn recover(self) {
        let budget = self.inner.timeout.max(MIN_PROBE_TIMEOUT);
        let mut tries = 0;
        loop {
            tokio::time::sleep(self.inner.probe_every).await;
            if !matches!(tokio::time::timeout(budget, self.inner.primary.probe()).await, Ok(Ok(()))) {
                continue;
            }
            tries += 1;
            let (written, left) = self.write_back().await;
            if left > 0 && tries < TRIES {
                continue;
            }
            self.inner.degraded.store(false, Ordering::Release);
            telemetry::degraded(false);
            // What memory admitted while the write-back ran, then nothing:
            // the next outage starts from what Postgres holds.
            let (late, left) = self.write_back().await;
            if left == 0 {
                self.inner.memory.clear();
            } else {
                self.flush_later();
            }
            tracing::info!(buckets = written + late, left, "postgres is back: serving from postgres again");
            return;
        }
    }

    /// Hands what memory owes to Postgres; returns how many buckets were
    /// written and how many are still owed.
    async fn write_back(&self) -> (usize, usize) {
        // Releases first: a full bucket's cap then drops none of their slots.
        let unreleased = match self.inner.releases.any() {
            true => self.inner.releases.write_back(&self.inner.primary).await,
            false => 0,
        };
        let (written, left) = self.absorb_memory().await;
        (written, left + unreleased)
    }

    async fn absorb_memory(&self) -> (usize, usize) {
        let owed = self.inner.memory.drain(Utc::now());
        let count = owed.len();
        if count == 0 {
            return (0, 0); // no connection opened for nothing
        }
        match self.inner.primary.absorb(owed).await {
            Ok(()) => (count, 0),
            Err(Unabsorbed { error, left }) => {
                let unwritten = left.len();
                self.inner.memory.restore(left, Utc::now());
                if self.inner.unwritten.ready() {
                    tracing::warn!(%error, unwritten, "writing back what memory admitted failed; retrying");
                }
                (count - unwritten, unwritten)
            }
        }
    }

    /// Writes back in the background until memory owes nothing, unless an
    /// outage's recovery takes over.
    pub(super) fn flush_later(&self) {
        if self.inner.flushing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            while !this.is_degraded() && (this.inner.memory.owes() || this.inner.releases.any()) {
                if this.write_back().await.1 > 0 {
                    tokio::time::sleep(this.inner.probe_every).await;
                }
            }
            this.inner.flushing.store(false, Ordering::Release);
        });
    }
}

/// Lets one event through per [`WARN_EVERY`].
pub(super) struct Throttle {
    epoch: Instant,
    next_ms: AtomicU64,
}

impl Throttle {
    pub fn new() -> Self {
        Self { epoch: Instant::now(), next_ms: AtomicU64::new(0) }
    }

    pub fn ready(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Acquire);
        let period = WARN_EVERY.as_millis() as u64;
        now >= next
            && self.next_ms.compare_exchange(next, now + period, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }
}
