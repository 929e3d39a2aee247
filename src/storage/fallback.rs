//! Serve from the primary store; while it is unreachable, from memory.
//!
//! "Unreachable" means a connection-level failure, or no progress: no
//! primary call has completed for `timeout` and Postgres does not answer a
//! ping on a fresh connection either. The first such failure trips
//! the instance into fallback (one `warn` line) and starts one background
//! probe; until the probe succeeds, checks go straight to the fallback
//! instead of each waiting out a timeout. Recovery is logged once (`info`).
//!
//! A check that waits longer than `timeout` while other calls *are*
//! completing is queued behind this instance's own load, not facing a dead
//! server, so it keeps waiting (answering it from memory would admit past
//! the shared limit), up to [`OVERLOAD_FACTOR`] × `timeout`. A check that
//! fails alone (a lock timeout, say) is answered by the fallback without
//! tripping the instance. What a check gets from the fallback is its
//! policy's [`OnStoreError`] choice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Answer, CheckBatch, Store, StoreError};

/// How many `timeout`s a check may wait while the primary is making progress.
const OVERLOAD_FACTOR: u32 = 20;

/// The longest a check waits for the primary while it makes progress:
/// server-side limits must end before this, or a statement could commit a
/// count for a check already answered from memory.
pub fn longest_wait(timeout: Duration) -> Duration {
    timeout * OVERLOAD_FACTOR
}
/// Smallest budget for a recovery probe, which must open a connection.
const MIN_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// At most one "refused one check" warning per this period.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub struct FallbackStore<P, M> {
    inner: Arc<Inner<P, M>>,
}

struct Inner<P, M> {
    primary: P,
    memory: M,
    timeout: Duration,
    probe_every: Duration,
    degraded: AtomicBool,
    /// One liveness ping at a time, however many checks are waiting.
    pinging: AtomicBool,
    epoch: Instant,
    /// Milliseconds since `epoch` when a primary call last completed.
    last_progress_ms: AtomicU64,
    next_warn_ms: AtomicU64,
}

impl<P, M> Clone for FallbackStore<P, M> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<P: Store, M: Store> FallbackStore<P, M> {
    /// `timeout` is how long the primary may go without answering anything
    /// before the instance falls back; `probe_every` paces recovery probes.
    pub fn new(primary: P, memory: M, timeout: Duration, probe_every: Duration) -> Self {
        let inner = Inner {
            primary,
            memory,
            timeout,
            probe_every,
            degraded: AtomicBool::new(false),
            pinging: AtomicBool::new(false),
            epoch: Instant::now(),
            last_progress_ms: AtomicU64::new(0),
            next_warn_ms: AtomicU64::new(0),
        };
        Self { inner: Arc::new(inner) }
    }

    fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    async fn try_primary(&self, batch: &CheckBatch) -> Result<Answer, StoreError> {
        let call = self.inner.primary.check(batch);
        tokio::pin!(call);
        let give_up = Instant::now() + longest_wait(self.inner.timeout);
        loop {
            let waiting_since = self.now_ms();
            let Ok(result) = tokio::time::timeout(self.inner.timeout, &mut call).await else {
                let progressing = self.inner.last_progress_ms.load(Ordering::Acquire) >= waiting_since;
                if self.is_degraded() || (!progressing && !self.answers_a_ping().await) {
                    return Err(StoreError::Unreachable(format!(
                        "no answer from postgres for {:?}",
                        self.inner.timeout
                    )));
                }
                if Instant::now() >= give_up {
                    return Err(StoreError::Failed(
                        "overloaded: this instance's queue to postgres is too long".into(),
                    ));
                }
                continue;
            };
            if result.is_ok() {
                self.inner.last_progress_ms.fetch_max(self.now_ms(), Ordering::AcqRel);
            }
            return result;
        }
    }

    /// Nothing has completed for a whole timeout: on a quiet instance that
    /// may be one call waiting for a row another instance holds, not an
    /// outage. One waiting check asks Postgres directly; a success counts as
    /// progress for every waiting check. The others keep waiting meanwhile.
    async fn answers_a_ping(&self) -> bool {
        if self.inner.pinging.swap(true, Ordering::AcqRel) {
            return true; // someone is asking; decide on the next round
        }
        let alive =
            matches!(tokio::time::timeout(self.inner.timeout, self.inner.primary.ping()).await, Ok(Ok(())));
        if alive {
            self.inner.last_progress_ms.fetch_max(self.now_ms(), Ordering::AcqRel);
        }
        self.inner.pinging.store(false, Ordering::Release);
        alive
    }

    fn trip(&self, error: &StoreError) {
        if self.inner.degraded.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(%error, "postgres unreachable: serving from per-instance memory until it returns");
        let this = self.clone();
        tokio::spawn(async move { this.probe_until_back().await });
    }

    async fn probe_until_back(self) {
        let budget = self.inner.timeout.max(MIN_PROBE_TIMEOUT);
        loop {
            tokio::time::sleep(self.inner.probe_every).await;
            if let Ok(Ok(())) = tokio::time::timeout(budget, self.inner.primary.probe()).await {
                self.inner.last_progress_ms.fetch_max(self.now_ms(), Ordering::AcqRel);
                self.inner.degraded.store(false, Ordering::Release);
                tracing::info!("postgres is back: serving from postgres again");
                return;
            }
        }
    }

    /// Warns about a check the primary refused, at most once per [`WARN_EVERY`].
    fn warn_refused(&self, error: &StoreError) {
        let now = self.now_ms();
        let next = self.inner.next_warn_ms.load(Ordering::Acquire);
        let period = WARN_EVERY.as_millis() as u64;
        if now >= next
            && self
                .inner
                .next_warn_ms
                .compare_exchange(next, now + period, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(%error, "postgres refused a check: answered by the fallback (at most one such line per 10 s)");
        }
    }

    async fn fall_back(&self, batch: &CheckBatch) -> Result<Answer, StoreError> {
        if !batch.memory_fallback {
            return Err(StoreError::Unavailable);
        }
        let mut answer = self.inner.memory.check(batch).await?;
        answer.degraded = true;
        Ok(answer)
    }
}

impl<P: Store, M: Store> Store for FallbackStore<P, M> {
    async fn check(&self, batch: &CheckBatch) -> Result<Answer, StoreError> {
        if !self.is_degraded() {
            match self.try_primary(batch).await {
                Ok(checked) => return Ok(checked),
                Err(error @ StoreError::Unreachable(_)) => self.trip(&error),
                Err(error) => self.warn_refused(&error),
            }
        }
        self.fall_back(batch).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.primary.probe().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.primary.ping().await
    }

    fn is_degraded(&self) -> bool {
        self.inner.degraded.load(Ordering::Acquire)
    }
}
