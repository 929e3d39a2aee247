//! What the fallback does with changes to limits, the calls other than
//! checks: releases are kept while degraded, everything else that must
//! reach every instance is refused until Postgres is back.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::FallbackStore;
use crate::storage::{
    ActionStore, AddedOverride, AuditEntry, AuditQuery, AuditRow, AuditStore, Block, BlockTarget,
    CompiledPolicies, Freed, Key, LeaseStore, LoadedOverrides, OverrideStore, PolicyStore, Primary, Renewal,
    Store, StoreError, StoredOverride,
};

/// Leases are in Postgres: while this instance is degraded, a release is
/// kept and written back when Postgres returns, within the bound
/// `releases.rs` explains (the leases this instance knows of, `issued.rs`),
/// and a renewal is refused (the lease then ends by itself).
impl<P: Primary> LeaseStore for FallbackStore<P> {
    async fn release(&self, id: &Key) -> Result<Option<bool>, StoreError> {
        if !self.is_degraded() {
            match self.inner.primary.release(id).await {
                Err(error @ StoreError::Unreachable(_)) => self.trip(&error),
                answer => {
                    if answer.is_ok() {
                        self.inner.issued.forget(id);
                    }
                    return answer;
                }
            }
        }
        let kept = self.inner.releases.keep(id, &self.inner.issued, self.instances())?;
        if !self.is_degraded() {
            self.flush_later(); // Postgres returned meanwhile: not left for the next outage
        }
        Ok(kept)
    }

    async fn renew(&self, id: &Key) -> Result<Renewal, StoreError> {
        self.refuse_if_degraded()?;
        let renewal = self.inner.primary.renew(id).await?;
        if let Renewal::Renewed(ends) = renewal {
            self.inner.issued.note(*id, ends, Utc::now());
        }
        Ok(renewal)
    }

    fn releases_heard(&self) -> Option<tokio::sync::broadcast::Receiver<Freed>> {
        self.inner.primary.releases_heard()
    }
}

/// Actions must reach every instance, which only Postgres can do: while
/// this instance is degraded they are refused, not kept in memory.
impl<P: Primary + ActionStore> ActionStore for FallbackStore<P> {
    async fn reset(&self, keys: &[Key], audit: Option<&AuditEntry>) -> Result<(), StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.reset(keys, audit).await
    }

    async fn block(
        &self,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
        audit: &AuditEntry,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.block(targets, duration, reason, audit).await
    }

    async fn unblock(&self, keys: &[Key], audit: &AuditEntry) -> Result<u64, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.unblock(keys, audit).await
    }

    async fn blocks(&self, limit: u32) -> Result<Vec<Block>, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.blocks(limit).await
    }
}

/// Overrides are written and read in Postgres only: while degraded they are
/// refused, and each instance keeps applying those it holds in memory.
impl<P: Primary + OverrideStore> OverrideStore for FallbackStore<P> {
    async fn add_override(
        &self,
        new: &StoredOverride,
        audit: &AuditEntry,
    ) -> Result<AddedOverride, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.add_override(new, audit).await
    }

    async fn remove_override(&self, id: &str, audit: &AuditEntry) -> Result<bool, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.remove_override(id, audit).await
    }

    async fn list_overrides(
        &self,
        policy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredOverride>, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.list_overrides(policy, limit).await
    }

    async fn load_overrides(&self, loaded: Option<u64>) -> Result<Option<LoadedOverrides>, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.load_overrides(loaded).await
    }

    async fn overrides_may_have_changed(&self) {
        self.inner.primary.overrides_may_have_changed().await;
    }
}

/// The audit log is in Postgres only: while degraded it is neither written
/// nor read (a reload's row is then logged as lost, see `reload.rs`).
impl<P: Primary + AuditStore> AuditStore for FallbackStore<P> {
    async fn record(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.record(entry).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.audit(query).await
    }
}

/// The compiled policies are in Postgres only: while degraded they are not
/// written, and the SQL functions, which need Postgres too, keep the last.
impl<P: Primary + PolicyStore> PolicyStore for FallbackStore<P> {
    async fn publish(&self, compiled: &CompiledPolicies) -> Result<(), StoreError> {
        self.refuse_if_degraded()?;
        self.inner.primary.publish(compiled).await
    }
}
