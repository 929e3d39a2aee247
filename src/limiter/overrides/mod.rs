//! Overrides set through the API at runtime: validated as the policy
//! file's overrides are (`requests.rs`), stored in Postgres, and reloaded
//! whole on every instance whenever they change (`in_force.rs` compiles
//! them for checks).
//!
//! The file's own `[[overrides]]`, the patterns both kinds share and which
//! entry of a policy applies live in `policy/overrides/`: the policy layer
//! reads the file, but knows neither the store nor the key secret that the
//! API's overrides need, so these sit a layer up, in the limiter.

pub(super) mod in_force;
mod requests;

use std::sync::{Arc, Weak};
use std::time::Duration;

use in_force::ApiOverrides;
pub use requests::{OverrideError, OverrideRequest};

use super::shared::Shared;
use crate::policy::Policies;
use crate::storage::{
    self, audit_time, Acting, AddedOverride, AuditAction, AuditEntry, Store, StoreError, StoredOverride,
};

/// After the store fails to load overrides, how long before it is asked again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How often the reload task wakes with nothing heard, to end once its
/// service is gone.
const ALIVE_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Sets, lists and removes API overrides, and keeps this instance's copy
/// of them (in [`Shared`], where checks read it) current.
pub struct Overrides<S> {
    shared: Arc<Shared<S>>,
    /// Held while loading them (see [`Overrides::refresh`]).
    refreshing: tokio::sync::Mutex<()>,
}

impl<S: Store + storage::OverrideStore> Overrides<S> {
    pub fn new(shared: Arc<Shared<S>>) -> Self {
        Self { shared, refreshing: tokio::sync::Mutex::new(()) }
    }

    /// Validates and stores `request`, in place of the policy's overrides
    /// with the same `when`; this instance applies it before answering, the
    /// others when they hear of it. The act is audited as `by`'s.
    pub async fn add(&self, request: &OverrideRequest, by: &Acting) -> Result<AddedOverride, OverrideError> {
        let new = requests::validate(request, &self.shared.policies(), &self.shared.secret)?;
        let added = self.shared.store.add_override(&new, &audited(by, &new)).await.map_err(unavailable)?;
        self.refresh_logged().await;
        Ok(added)
    }

    /// Removes one; `false` if there is none with that id (and nothing is audited).
    pub async fn remove(&self, id: &str, by: &Acting) -> Result<bool, OverrideError> {
        let audit = AuditEntry::new(by, AuditAction::OverrideRemoved, id);
        let removed = self.shared.store.remove_override(id, &audit).await.map_err(unavailable)?;
        self.refresh_logged().await;
        Ok(removed)
    }

    /// Those not expired, of `policy` (or all), the newest first, at most `limit`.
    pub async fn list(&self, policy: Option<&str>, limit: u32) -> Result<Vec<StoredOverride>, OverrideError> {
        self.shared.store.list_overrides(policy, limit).await.map_err(unavailable)
    }

    /// The policies in force, which an override names.
    pub fn policies(&self) -> Arc<Policies> {
        self.shared.policies()
    }

    /// Loads the overrides if they changed since the last load. Loads
    /// take turns, so an older one never replaces a newer.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let _turn = self.refreshing.lock().await;
        let loaded = self.shared.api_overrides.load().generation;
        if let Some(fresh) = self.shared.store.load_overrides(loaded).await? {
            let (generation, count) = (fresh.generation, fresh.overrides.len());
            self.shared.api_overrides.store(Arc::new(ApiOverrides::new(fresh)));
            tracing::debug!(generation, count, "API overrides loaded");
        }
        Ok(())
    }

    async fn refresh_logged(&self) {
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "API overrides could not be reloaded; they will be on the next change heard");
        }
    }

    /// Loads the overrides now, then again whenever they may have changed,
    /// for as long as `self` lives.
    pub async fn watch(self: &Arc<Self>) {
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "API overrides could not be loaded at start-up; retrying");
        }
        let overrides: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            // A failed load (Postgres away) is retried, each turn holding the
            // service only for its while, so that the task ends with it.
            let mut failed = false;
            loop {
                let Some(live) = overrides.upgrade() else { return };
                let heard = failed
                    || tokio::select! {
                        () = live.shared.store.overrides_may_have_changed() => true,
                        () = tokio::time::sleep(ALIVE_CHECK_EVERY) => false,
                    };
                if heard {
                    failed = live.refresh().await.is_err();
                }
                drop(live);
                if failed {
                    tokio::time::sleep(RETRY_EVERY).await;
                }
            }
        });
    }
}

/// The audit row of setting `new`: what it matches (exact values only by
/// their keyed hash, as stored) and what it does.
fn audited(by: &Acting, new: &StoredOverride) -> AuditEntry {
    let limits = (new.action == "limits").then(|| serde_json::json!(new.limits));
    AuditEntry::new(by, AuditAction::OverrideSet, new.id.clone())
        .with("policy", new.policy.clone())
        .with("when", serde_json::json!(new.when))
        .with("action", new.action.clone())
        .with("limits", limits)
        .with("until", new.until.as_ref().map(audit_time))
        .with("note", new.note.clone())
}

fn unavailable(e: StoreError) -> OverrideError {
    if !matches!(e, StoreError::Unavailable) {
        tracing::warn!(error = %e, "a change to API overrides failed");
    }
    OverrideError::Unavailable
}
