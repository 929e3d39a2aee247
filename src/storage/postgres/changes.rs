//! Changes to limits through this store: actions (resets, blocks), API
//! overrides and leases, each a transaction on the connection the actions
//! share ([`ActionConn`](super::actions::ActionConn)), heard by every
//! instance through the listener.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::PgStore;
use crate::storage::{
    ActionStore, AddedOverride, AuditEntry, AuditQuery, AuditRow, AuditStore, Block, BlockTarget, Freed, Key,
    LeaseStore, LoadedOverrides, OverrideStore, Renewal, StoreError, StoredOverride, OVERRIDES_POLL_EVERY,
};

impl ActionStore for PgStore {
    async fn reset(&self, keys: &[Key], audit: Option<&AuditEntry>) -> Result<(), StoreError> {
        self.actions.reset(&self.session, keys, audit).await
    }

    async fn block(
        &self,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
        audit: &AuditEntry,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.actions.block(&self.session, targets, duration, reason, audit).await
    }

    async fn unblock(&self, keys: &[Key], audit: &AuditEntry) -> Result<u64, StoreError> {
        self.actions.unblock(&self.session, keys, audit).await
    }

    async fn blocks(&self, limit: u32) -> Result<Vec<Block>, StoreError> {
        self.actions.list(&self.session, limit).await
    }
}

impl OverrideStore for PgStore {
    async fn add_override(
        &self,
        new: &StoredOverride,
        audit: &AuditEntry,
    ) -> Result<AddedOverride, StoreError> {
        self.actions.add_override(&self.session, new, audit).await
    }

    async fn remove_override(&self, id: &str, audit: &AuditEntry) -> Result<bool, StoreError> {
        self.actions.remove_override(&self.session, id, audit).await
    }

    async fn list_overrides(
        &self,
        policy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredOverride>, StoreError> {
        self.actions.list_overrides(&self.session, policy, limit).await
    }

    async fn load_overrides(&self, loaded: Option<u64>) -> Result<Option<LoadedOverrides>, StoreError> {
        self.actions.load_overrides(&self.session, loaded).await
    }

    /// Without LISTEN nothing is heard but the heartbeat's generation, every
    /// 2 s: a poll every [`OVERRIDES_POLL_EVERY`] keeps the bound.
    async fn overrides_may_have_changed(&self) {
        if self.listening {
            return self.heard.overrides_may_have_changed().await;
        }
        tokio::select! {
            () = self.heard.overrides_may_have_changed() => {}
            () = tokio::time::sleep(OVERRIDES_POLL_EVERY) => {}
        }
    }
}

impl AuditStore for PgStore {
    async fn record(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.actions.record(&self.session, entry).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        self.actions.audit(&self.session, query).await
    }
}

impl LeaseStore for PgStore {
    async fn release(&self, id: &Key) -> Result<Option<bool>, StoreError> {
        self.actions.release(&self.session, id).await
    }

    async fn renew(&self, id: &Key) -> Result<Renewal, StoreError> {
        self.actions.renew(&self.session, id).await
    }

    fn releases_heard(&self) -> Option<tokio::sync::broadcast::Receiver<Freed>> {
        self.listening.then(|| self.heard.releases())
    }
}
