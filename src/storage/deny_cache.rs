//! Repeated denials answered from memory, without a database round trip.
//!
//! A denied check carries the earliest time a check of the same cost could
//! pass (`retry_at`); under every algorithm nothing makes that time come
//! sooner (other checks only consume, nothing refunds), so until then the
//! same check is certain to be denied again. This store remembers such
//! denials, per exact check (every bucket's key, limit, window and algorithm,
//! and the cost), and answers repeats itself: a flood on a key that is over
//! its limit costs no statement at all.
//!
//! Staleness, stated: a cached answer repeats the figures of the denial it
//! remembers (`remaining` may have dropped since through other checks), and
//! its durations are recomputed from this host's clock. If rows are deleted
//! or limits raised by hand, instances keep denying from memory until the
//! remembered retry time at the latest. Peeks (cost 0) always go through.
//! Only Postgres decisions are remembered, never the fallback's.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::{CheckBatch, Checked, Store, StoreError, StoreKind};

pub struct DenyCache<S> {
    inner: S,
    entries: Mutex<HashMap<u64, Remembered>>,
    capacity: usize,
}

struct Remembered {
    until: DateTime<Utc>,
    checked: Checked,
}

impl<S: Store> DenyCache<S> {
    /// Remembers at most `capacity` denials.
    pub fn new(inner: S, capacity: usize) -> Self {
        Self { inner, entries: Mutex::new(HashMap::new()), capacity }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn recall(&self, fingerprint: u64, now: DateTime<Utc>) -> Option<Checked> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let remembered = entries.get(&fingerprint).filter(|r| now < r.until)?;
        Some(Checked { now, ..remembered.checked.clone() })
    }

    fn remember(&self, fingerprint: u64, checked: &Checked) {
        let denying = checked.buckets.iter().filter(|b| !b.allowed);
        let Some(until) = denying.map(|b| b.retry_at.unwrap_or(b.reset_at)).max() else { return };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= self.capacity {
            let now = Utc::now();
            entries.retain(|_, r| now < r.until);
            if entries.len() >= self.capacity {
                return;
            }
        }
        entries.insert(fingerprint, Remembered { until, checked: checked.clone() });
    }
}

impl<S: Store> Store for DenyCache<S> {
    async fn check(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        if batch.cost == 0 {
            return self.inner.check(batch).await;
        }
        let fingerprint = fingerprint(batch);
        if let Some(checked) = self.recall(fingerprint, Utc::now()) {
            return Ok(checked);
        }
        let checked = self.inner.check(batch).await?;
        if !checked.allowed() && checked.store == StoreKind::Postgres && !checked.degraded {
            self.remember(fingerprint, &checked);
        }
        Ok(checked)
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.probe().await
    }
}

/// Identifies a check exactly: the same fingerprint means the same buckets,
/// parameters and cost, so the same answer until the remembered time.
fn fingerprint(batch: &CheckBatch) -> u64 {
    let mut hasher = DefaultHasher::new();
    batch.cost.hash(&mut hasher);
    for b in &batch.buckets {
        (b.key, b.limit, b.window, b.algorithm).hash(&mut hasher);
    }
    hasher.finish()
}
