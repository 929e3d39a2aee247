//! Repeated denials answered from memory, without a database round trip.
//!
//! A denied check carries the earliest time a check of the same cost could
//! pass (`retry_at`). Other checks only consume, so until then the same
//! check is denied again, but for two things that give room back early:
//! a release frees a concurrency bucket's slots (so a check with a
//! concurrency bucket is never remembered), and in Citus mode a check split
//! across workers gives back what one part took when another part was
//! denied (a refund, docs/scaling.md). A denial remembered while such a
//! refund was pending may outlast the room it saw until its retry time;
//! it never admits too much. Actions (resets, unblocks) are heard and
//! forget what they made stale. This store remembers such denials, per
//! exact check (every bucket's key, limit, window and algorithm,
//! and the cost), and answers repeats itself: a flood on a key that is over
//! its limit costs no statement at all.
//!
//! Staleness, stated: a cached answer repeats the figures of the denial it
//! remembers (`remaining` may have dropped since through other checks); its
//! durations count down on this host's monotonic clock from the moment the
//! denial was heard, so a clock difference between hosts does not matter. If rows are deleted
//! or limits raised by hand, instances keep denying from memory until the
//! remembered retry time at the latest. Peeks (cost 0) always go through.
//! Only Postgres decisions are remembered, never the fallback's.

mod entries;
mod inspect;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{
    ActionStore, Answer, Block, BlockTarget, Check, Freed, Key, LeaseStore, Stale, Store, StoreError,
    StoreKind,
};
use super::{AddedOverride, LoadedOverrides, OverrideStore, Renewal, StoredOverride};
use super::{AuditEntry, AuditQuery, AuditRow, AuditStore};
use super::{CompiledPolicies, PolicyStore};
use entries::{Entries, Remembered};

pub struct DenyCache<S> {
    inner: S,
    cache: Mutex<Cache>,
    capacity: usize,
}

struct Cache {
    entries: Entries,
    /// When full, expired entries are swept at most once per [`SWEEP_EVERY`],
    /// so a full cache does not scan itself on every denial.
    last_sweep: Instant,
}

const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl<S: Store> DenyCache<S> {
    /// Remembers at most `capacity` denials.
    pub fn new(inner: S, capacity: usize) -> Self {
        let cache = Cache { entries: Entries::default(), last_sweep: Instant::now() };
        Self { inner, cache: Mutex::new(cache), capacity }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recall(&self, fingerprint: u64) -> Option<Answer> {
        let cache = self.lock();
        let now = Instant::now();
        let remembered = cache.entries.get(fingerprint).filter(|r| now < r.until)?;
        // Set the answer's clock so that its durations are what is left now.
        let left = remembered.until.saturating_duration_since(now);
        let now = remembered.retry - chrono::TimeDelta::from_std(left).unwrap_or_default();
        Some(Answer { now, cached: true, timing: None, ..remembered.checked.clone() })
    }

    /// Forgets every denial involving a stale key.
    fn forget(&self, stale: &Stale) {
        self.lock().entries.forget(stale);
    }

    fn remember(&self, fingerprint: u64, checked: &Answer, check: &Check) {
        // A release frees a concurrency slot before its retry time.
        if check.buckets.iter().any(|b| b.algorithm == crate::algorithm::Algorithm::Concurrency) {
            return;
        }
        let Some(retry) = latest_retry(checked) else { return };
        let Ok(wait) = (retry - checked.now).to_std() else { return };
        let until = Instant::now() + wait;
        let mut cache = self.lock();
        if cache.entries.len() >= self.capacity {
            if cache.last_sweep.elapsed() < SWEEP_EVERY {
                return;
            }
            let now = Instant::now();
            cache.entries.sweep(now);
            cache.last_sweep = now;
            if cache.entries.len() >= self.capacity {
                return;
            }
        }
        let keys = check.buckets.iter().map(|b| b.key).collect();
        cache.entries.insert(fingerprint, Remembered { until, retry, checked: checked.clone(), keys });
    }
}

/// The latest retry time among the denying buckets: the check cannot pass
/// before it, whatever else happens.
fn latest_retry(checked: &Answer) -> Option<DateTime<Utc>> {
    checked.buckets.iter().filter(|b| !b.allowed).map(|b| b.retry_at.unwrap_or(b.reset_at)).max()
}

impl<S: Store> Store for DenyCache<S> {
    async fn check(&self, check: &Check) -> Result<Answer, StoreError> {
        if check.cost == 0 {
            return self.inner.check(check).await;
        }
        if let Some(stale) = self.inner.take_stale() {
            self.forget(&stale);
        }
        let fingerprint = fingerprint(check);
        if let Some(checked) = self.recall(fingerprint) {
            return Ok(checked);
        }
        let checked = self.inner.check(check).await?;
        if !checked.allowed() && checked.store == StoreKind::Postgres && !checked.degraded {
            self.remember(fingerprint, &checked, check);
        }
        Ok(checked)
    }

    fn is_degraded(&self) -> bool {
        self.inner.is_degraded()
    }

    fn instances(&self) -> u64 {
        self.inner.instances()
    }

    fn take_stale(&self) -> Option<Stale> {
        self.inner.take_stale()
    }

    fn actions_heard(&self) -> u64 {
        self.inner.actions_heard()
    }

    fn knows_zone(&self, zone: &str) -> bool {
        self.inner.knows_zone(zone)
    }

    fn keeps_leases(&self) -> bool {
        self.inner.keeps_leases()
    }
}

/// Actions go through, and what they change is forgotten here at once (the
/// other instances forget it when they hear of it).
impl<S: Store + ActionStore> ActionStore for DenyCache<S> {
    async fn reset(&self, keys: &[Key], audit: Option<&AuditEntry>) -> Result<(), StoreError> {
        self.inner.reset(keys, audit).await?;
        self.forget(&Stale::of(keys.iter().copied()));
        Ok(())
    }

    async fn block(
        &self,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
        audit: &AuditEntry,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.inner.block(targets, duration, reason, audit).await
    }

    async fn unblock(&self, keys: &[Key], audit: &AuditEntry) -> Result<u64, StoreError> {
        let lifted = self.inner.unblock(keys, audit).await?;
        self.forget(&Stale::of(keys.iter().copied()));
        Ok(lifted)
    }

    async fn blocks(&self, limit: u32) -> Result<Vec<Block>, StoreError> {
        self.inner.blocks(limit).await
    }
}

/// Compiled policies change no limit this instance decides: nothing to forget.
impl<S: PolicyStore + Sync> PolicyStore for DenyCache<S> {
    async fn publish(&self, compiled: &CompiledPolicies) -> Result<(), StoreError> {
        self.inner.publish(compiled).await
    }
}

/// The audit log changes no limit: nothing to forget.
impl<S: AuditStore> AuditStore for DenyCache<S> {
    async fn record(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.inner.record(entry).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        self.inner.audit(query).await
    }
}

/// Overrides change limits, which are part of a check's fingerprint: no
/// remembered denial needs forgetting.
impl<S: OverrideStore> OverrideStore for DenyCache<S> {
    async fn add_override(
        &self,
        new: &StoredOverride,
        audit: &AuditEntry,
    ) -> Result<AddedOverride, StoreError> {
        self.inner.add_override(new, audit).await
    }

    async fn remove_override(&self, id: &str, audit: &AuditEntry) -> Result<bool, StoreError> {
        self.inner.remove_override(id, audit).await
    }

    async fn list_overrides(
        &self,
        policy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredOverride>, StoreError> {
        self.inner.list_overrides(policy, limit).await
    }

    async fn load_overrides(&self, loaded: Option<u64>) -> Result<Option<LoadedOverrides>, StoreError> {
        self.inner.load_overrides(loaded).await
    }

    async fn overrides_may_have_changed(&self) {
        self.inner.overrides_may_have_changed().await;
    }
}

/// Releases free slots, so a concurrency bucket's denial is never
/// remembered (see `remember`); these only pass through.
impl<S: Store + LeaseStore> LeaseStore for DenyCache<S> {
    async fn release(&self, id: &Key) -> Result<Option<bool>, StoreError> {
        self.inner.release(id).await
    }

    async fn renew(&self, id: &Key) -> Result<Renewal, StoreError> {
        self.inner.renew(id).await
    }

    fn releases_heard(&self) -> Option<tokio::sync::broadcast::Receiver<Freed>> {
        self.inner.releases_heard()
    }
}

/// Identifies a check exactly: the same fingerprint means the same buckets,
/// parameters and cost, so the same answer until the remembered time.
fn fingerprint(check: &Check) -> u64 {
    let mut hasher = DefaultHasher::new();
    check.cost.hash(&mut hasher);
    for b in &check.buckets {
        (b.key, b.limit, b.window, b.algorithm, b.calendar).hash(&mut hasher);
    }
    hasher.finish()
}
