//! Serve from the primary store; while it is unreachable, from memory.
//!
//! "Unreachable" means a connection-level failure, or no progress: no
//! primary call has completed for `timeout` and Postgres does not answer a
//! ping on a connection kept open for it either ([`detector`]: slow is not
//! gone). The first such failure trips the instance into fallback (one
//! `warn` line) and starts one background probe; until the probe succeeds,
//! checks go straight to memory instead of each waiting out a timeout.
//! When Postgres is back, what memory admitted is written into the shared
//! rows before checks return to Postgres ([`recovery`]); recovery is logged
//! once (`info`).
//!
//! A check that waits longer than `timeout` while other calls *are*
//! completing is queued behind this instance's own load, not facing a dead
//! server, so it keeps waiting (answering it from memory would admit past
//! the shared limit), up to [`longest_wait`]. A check that fails alone (a
//! lock timeout, say) is answered from memory without tripping the
//! instance; it is not written back (its row is the one that failed), so
//! it counts only in this instance's memory. In memory, each bucket
//! enforces the whole limit or this instance's share of it, as the check's
//! [`MemoryFallback`] says.

mod changes;
mod detector;
mod inspect;
mod issued;
mod recovery;
mod releases;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;

use super::{Answer, Check, MemoryFallback, MemoryStore, Primary, Stale, Store, StoreError};
use detector::Detector;
use issued::Issued;
use recovery::Throttle;
use releases::OwedReleases;

use crate::telemetry;

/// How many `timeout`s a check may wait while the primary is making progress.
const OVERLOAD_FACTOR: u32 = 20;

/// The longest a check waits for the primary while it makes progress:
/// server-side limits must end before this, or a statement could commit a
/// count for a check already answered from memory.
pub fn longest_wait(timeout: Duration) -> Duration {
    timeout * OVERLOAD_FACTOR
}

pub struct FallbackStore<P> {
    inner: Arc<Inner<P>>,
}

struct Inner<P> {
    primary: P,
    memory: MemoryStore,
    timeout: Duration,
    probe_every: Duration,
    degraded: AtomicBool,
    detector: Detector,
    /// One background write-back at a time.
    flushing: AtomicBool,
    /// Paces the two warnings that can repeat: a check refused, a write-back failed.
    refused: Throttle,
    unwritten: Throttle,
    /// Releases asked for during an outage, to write back.
    releases: OwedReleases,
    /// The leases this instance knows exist, which bound those releases.
    issued: Issued,
}

impl<P> Clone for FallbackStore<P> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<P: Primary> FallbackStore<P> {
    /// `timeout` is how long the primary may go without answering anything
    /// before the instance falls back; `probe_every` paces recovery probes.
    pub fn new(primary: P, memory: MemoryStore, timeout: Duration, probe_every: Duration) -> Self {
        let inner = Inner {
            primary,
            memory,
            timeout,
            probe_every,
            degraded: AtomicBool::new(false),
            detector: Detector::new(timeout),
            flushing: AtomicBool::new(false),
            refused: Throttle::new(),
            unwritten: Throttle::new(),
            releases: OwedReleases::default(),
            issued: Issued::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    async fn try_primary(&self, check: &Check) -> Result<Answer, StoreError> {
        let call = self.inner.primary.check(check);
        tokio::pin!(call);
        let (timeout, detector) = (self.inner.timeout, &self.inner.detector);
        let give_up = Instant::now() + longest_wait(timeout);
        loop {
            let (since, round) = (detector.now_ms(), Instant::now());
            if let Ok(result) = tokio::time::timeout(timeout, &mut call).await {
                return self.heard(result);
            }
            // How late the timer fired: this process's own stall, not Postgres's.
            let lag = round.elapsed().saturating_sub(timeout);
            if !self.is_degraded() && !detector.progressed_since(since) {
                // The check's own answer may come while the ping is out.
                tokio::select! {
                    result = &mut call => return self.heard(result),
                    alive = self.answers_a_ping(lag) => {
                        if !alive && !detector.progressed_since(since) {
                            return Err(unreachable(timeout));
                        }
                    }
                }
            }
            if self.is_degraded() {
                return Err(unreachable(timeout));
            }
            if Instant::now() >= give_up {
                return Err(StoreError::Failed(
                    "overloaded: this instance's queue to postgres is too long".into(),
                ));
            }
        }
    }

    fn heard(&self, result: Result<Answer, StoreError>) -> Result<Answer, StoreError> {
        if result.is_ok() {
            self.inner.detector.progressed();
        }
        result
    }

    /// Nothing has completed for a whole timeout: on a quiet instance that
    /// may be one call waiting for a row another instance holds, not an
    /// outage. One waiting check asks Postgres directly; a success counts as
    /// progress for every waiting check. The others keep waiting meanwhile.
    async fn answers_a_ping(&self, lag: Duration) -> bool {
        let detector = &self.inner.detector;
        let Some(_asking) = detector.start_ping() else {
            return true; // someone is asking; decide on the next round
        };
        let budget = detector.ping_budget(self.inner.primary.recent_latency(), lag);
        let alive = self.inner.primary.ping(budget).await.is_ok();
        if alive {
            detector.progressed();
        }
        alive
    }

    fn trip(&self, error: &StoreError) {
        if self.inner.degraded.swap(true, Ordering::AcqRel) {
            return;
        }
        telemetry::degraded(true);
        let instances = self.instances();
        tracing::warn!(%error, instances, "postgres unreachable: answering as each policy says (memory by default, at this instance's share) until it returns");
        tokio::spawn(self.clone().recover());
    }

    fn fall_back(&self, check: &Check) -> Result<Answer, StoreError> {
        let share = match check.fallback {
            MemoryFallback::Refuse => return Err(StoreError::Unavailable),
            MemoryFallback::Full => 1,
            MemoryFallback::Split => self.instances(),
        };
        let mut answer = self.inner.memory.check_at(check, Utc::now(), share);
        answer.degraded = true;
        Ok(answer)
    }
}

impl<P: Primary> FallbackStore<P> {
    fn refuse_if_degraded(&self) -> Result<(), StoreError> {
        if self.is_degraded() {
            return Err(StoreError::Unavailable);
        }
        Ok(())
    }
}

fn unreachable(timeout: Duration) -> StoreError {
    StoreError::Unreachable(format!("no answer from postgres for {timeout:?}"))
}

impl<P: Primary> Store for FallbackStore<P> {
    async fn check(&self, check: &Check) -> Result<Answer, StoreError> {
        if self.is_degraded() {
            return self.fall_back(check);
        }
        match self.try_primary(check).await {
            Ok(answer) => {
                self.inner.issued.granted(check, &answer);
                Ok(answer)
            }
            Err(error @ StoreError::Unreachable(_)) => {
                self.trip(&error);
                self.fall_back(check)
            }
            Err(error) => {
                telemetry::postgres_refused();
                if self.inner.refused.ready() {
                    tracing::warn!(%error, "postgres refused a check: answered as its policy says for an unreachable store (at most one such line per {:?})", recovery::WARN_EVERY);
                }
                self.fall_back(check)
            }
        }
    }

    fn is_degraded(&self) -> bool {
        self.inner.degraded.load(Ordering::Acquire)
    }

    fn instances(&self) -> u64 {
        self.inner.primary.instances()
    }

    fn take_stale(&self) -> Option<Stale> {
        self.inner.primary.take_stale()
    }

    fn actions_heard(&self) -> u64 {
        self.inner.primary.actions_heard()
    }

    fn keeps_leases(&self) -> bool {
        self.inner.primary.keeps_leases()
    }

    /// As the server last seen says, during an outage too: what memory
    /// admits must be what Postgres can take back.
    fn knows_zone(&self, zone: &str) -> bool {
        self.inner.primary.knows_zone(zone)
    }
}
