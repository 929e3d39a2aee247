//! Serve from the primary store; while it is unreachable, from memory.
//!
//! The first failure trips the instance into fallback (one `warn` line) and
//! starts one background probe; until the probe succeeds, checks go straight
//! to the fallback instead of each waiting out a timeout. Recovery is logged
//! once (`info`). What a check gets during the outage is its policy's
//! [`OnStoreError`] choice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::{
    window_end, BucketState, CheckBatch, Checked, OnStoreError, Store, StoreError, StoreKind,
};

pub struct FallbackStore<P, M> {
    inner: Arc<Inner<P, M>>,
}

struct Inner<P, M> {
    primary: P,
    memory: M,
    timeout: Duration,
    probe_every: Duration,
    degraded: AtomicBool,
}

impl<P, M> Clone for FallbackStore<P, M> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Store, M: Store> FallbackStore<P, M> {
    /// `timeout` bounds each primary call; `probe_every` paces recovery probes.
    pub fn new(primary: P, memory: M, timeout: Duration, probe_every: Duration) -> Self {
        let inner = Inner {
            primary,
            memory,
            timeout,
            probe_every,
            degraded: AtomicBool::new(false),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// True while checks are answered without the primary store.
    pub fn is_degraded(&self) -> bool {
        self.inner.degraded.load(Ordering::Acquire)
    }

    pub fn primary(&self) -> &P {
        &self.inner.primary
    }

    async fn try_primary(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        match tokio::time::timeout(self.inner.timeout, self.inner.primary.check(batch)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unreachable(format!(
                "no answer within {:?}",
                self.inner.timeout
            ))),
        }
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
        loop {
            tokio::time::sleep(self.inner.probe_every).await;
            let probe = tokio::time::timeout(self.inner.timeout, self.inner.primary.probe()).await;
            if let Ok(Ok(())) = probe {
                self.inner.degraded.store(false, Ordering::Release);
                tracing::info!("postgres is back: serving from postgres again");
                return;
            }
        }
    }

    async fn fall_back(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        let mut checked = match batch.on_store_error {
            OnStoreError::Memory => self.inner.memory.check(batch).await?,
            OnStoreError::Allow => admit_uncounted(batch),
            OnStoreError::Deny => return Err(StoreError::Unavailable),
        };
        checked.degraded = true;
        Ok(checked)
    }
}

impl<P: Store, M: Store> Store for FallbackStore<P, M> {
    async fn check(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        if !self.is_degraded() {
            match self.try_primary(batch).await {
                Ok(checked) => return Ok(checked),
                Err(error @ StoreError::Unreachable(_)) => self.trip(&error),
                Err(error) => {
                    tracing::warn!(%error, "postgres refused one check: answering it from the fallback")
                }
            }
        }
        self.fall_back(batch).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.primary.probe().await
    }
}

/// The answer for `on_store_error = "allow"`: admitted, nothing counted.
fn admit_uncounted(batch: &CheckBatch) -> Checked {
    let now = Utc::now();
    let buckets = batch
        .buckets
        .iter()
        .map(|b| BucketState {
            allowed: true,
            count: 0,
            reset_at: window_end(now, b.window),
        })
        .collect();
    Checked {
        buckets,
        now,
        store: StoreKind::None,
        degraded: true,
    }
}
