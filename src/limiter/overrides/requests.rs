//! Setting, listing and removing API overrides, and keeping every
//! instance's copy of them current: validated here as the policy file's
//! overrides are, stored in Postgres, reloaded whole on every change.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::actions::MAX_REASON_LEN;
use super::api_overrides::{stored_form, ApiOverrides};
use super::Limiter;
use crate::policy::{Pattern, Policy};
use crate::storage::{AddedOverride, Overrides, Store, StoreError, StoredOverride};

/// An override as `POST /admin/overrides` gives it: `when`, exactly one of
/// the three actions, and optionally `until` (RFC 3339) and `note`.
#[derive(Debug, Clone, Default)]
pub struct OverrideRequest {
    pub policy: String,
    pub when: BTreeMap<String, String>,
    pub limits: Option<BTreeMap<String, u64>>,
    pub unlimited: Option<bool>,
    pub deny: Option<bool>,
    pub until: Option<String>,
    pub note: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    #[error("no policy named {0:?} is configured")]
    UnknownPolicy(String),
    #[error("{detail}")]
    Invalid { field: String, detail: String },
    #[error("the counter store is unavailable")]
    Unavailable,
}

fn invalid(field: impl Into<String>, detail: impl Into<String>) -> OverrideError {
    OverrideError::Invalid { field: field.into(), detail: detail.into() }
}

/// After the store fails to load overrides, how long before it is asked again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How often the reload task wakes with nothing heard, to end once its
/// limiter is gone.
const ALIVE_CHECK_EVERY: Duration = Duration::from_secs(5);

impl<S: Store + Overrides> Limiter<S> {
    /// Validates and stores `request`, in place of the policy's overrides
    /// with the same `when`; this instance applies it before answering, the
    /// others when they hear of it.
    pub async fn add_override(&self, request: &OverrideRequest) -> Result<AddedOverride, OverrideError> {
        let policies = self.policies();
        let policy = policies
            .get(&request.policy)
            .ok_or_else(|| OverrideError::UnknownPolicy(request.policy.clone()))?;
        let new = StoredOverride {
            id: format!("ovr_{}", hex::encode(rand::random::<[u8; 12]>())),
            policy: request.policy.clone(),
            when: self.validate_when(policy, &request.when)?,
            action: action(request)?.to_owned(),
            limits: validate_limits(policy, request.limits.as_ref())?,
            until: validate_until(request.until.as_deref())?,
            note: validate_note(request.note.as_deref())?,
            created_at: Utc::now(),
        };
        let added = self.store.add_override(&new).await.map_err(unavailable)?;
        self.refresh_logged().await;
        Ok(added)
    }

    /// Removes one; `false` if there is none with that id.
    pub async fn remove_override(&self, id: &str) -> Result<bool, OverrideError> {
        let removed = self.store.remove_override(id).await.map_err(unavailable)?;
        self.refresh_logged().await;
        Ok(removed)
    }

    pub async fn overrides(
        &self,
        policy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredOverride>, OverrideError> {
        self.store.list_overrides(policy, limit).await.map_err(unavailable)
    }

    /// Loads the overrides if they changed since the last load. Loads
    /// take turns, so an older one never replaces a newer.
    pub async fn refresh_overrides(&self) -> Result<(), StoreError> {
        let _turn = self.refreshing.lock().await;
        let loaded = self.api_overrides.load().generation;
        if let Some(fresh) = self.store.load_overrides(loaded).await? {
            let (generation, count) = (fresh.generation, fresh.overrides.len());
            self.api_overrides.store(Arc::new(ApiOverrides::new(fresh)));
            tracing::debug!(generation, count, "API overrides loaded");
        }
        Ok(())
    }

    async fn refresh_logged(&self) {
        if let Err(e) = self.refresh_overrides().await {
            tracing::warn!(error = %e, "API overrides could not be reloaded; they will be on the next change heard");
        }
    }

    fn validate_when(
        &self,
        policy: &Policy,
        when: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, OverrideError> {
        if when.is_empty() {
            return Err(invalid("when", "list at least one identifier and the pattern it must match"));
        }
        let mut stored = BTreeMap::new();
        for (name, text) in when {
            let Some(&kind) = policy.identifiers.get(name) else {
                return Err(invalid("when", format!("{name:?} is not one of this policy's identifiers")));
            };
            let pattern = Pattern::parse(kind, text).map_err(|e| invalid(format!("when.{name}"), e))?;
            stored.insert(name.clone(), stored_form(&self.secret, &policy.name, name, &pattern));
        }
        Ok(stored)
    }
}

/// Loads the overrides now, then again whenever they may have changed,
/// for as long as `limiter` lives.
pub async fn watch_overrides<S: Store + Overrides>(limiter: &Arc<Limiter<S>>) {
    if let Err(e) = limiter.refresh_overrides().await {
        tracing::warn!(error = %e, "API overrides could not be loaded at start-up; retrying");
    }
    let limiter: Weak<Limiter<S>> = Arc::downgrade(limiter);
    tokio::spawn(async move {
        // A failed load (Postgres away) is retried, each turn holding the
        // limiter only for its while, so that the task ends with it.
        let mut failed = false;
        loop {
            let Some(live) = limiter.upgrade() else { return };
            let heard = failed
                || tokio::select! {
                    () = live.store.overrides_may_have_changed() => true,
                    () = tokio::time::sleep(ALIVE_CHECK_EVERY) => false,
                };
            if heard {
                failed = live.refresh_overrides().await.is_err();
            }
            drop(live);
            if failed {
                tokio::time::sleep(RETRY_EVERY).await;
            }
        }
    });
}

/// Exactly one of `limits`, `unlimited: true` and `deny: true`, as in the file.
fn action(request: &OverrideRequest) -> Result<&'static str, OverrideError> {
    for (flag, field) in [(request.unlimited, "unlimited"), (request.deny, "deny")] {
        if flag == Some(false) {
            return Err(invalid(field, format!("write \"{field}\": true, or leave it out")));
        }
    }
    let given: Vec<&'static str> = [
        ("limits", request.limits.is_some()),
        ("unlimited", request.unlimited.is_some()),
        ("deny", request.deny.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, given)| given.then_some(name))
    .collect();
    match given.as_slice() {
        [one] => Ok(one),
        [] => Err(invalid(
            "limits",
            "give one action: \"limits\": {...}, \"unlimited\": true or \"deny\": true",
        )),
        several => Err(invalid(
            several[1],
            format!("give only one of limits, unlimited and deny, not {}", several.join(" and ")),
        )),
    }
}

/// Each bucket must be the policy's, and its limit valid for its algorithm.
fn validate_limits(
    policy: &Policy,
    limits: Option<&BTreeMap<String, u64>>,
) -> Result<BTreeMap<String, u64>, OverrideError> {
    let Some(limits) = limits else { return Ok(BTreeMap::new()) };
    if limits.is_empty() {
        return Err(invalid("limits", "list at least one bucket and its limit"));
    }
    for (name, &limit) in limits {
        let field = format!("limits.{name}");
        let Some(bucket) = policy.buckets.iter().find(|b| *b.name == **name) else {
            let detail = format!("{name:?} is not one of policy {:?}'s buckets", &*policy.name);
            return Err(invalid(field, detail));
        };
        bucket.algorithm.check_limit(limit).map_err(|e| invalid(&field, format!("{field}: {e}")))?;
    }
    Ok(limits.clone())
}

fn validate_until(until: Option<&str>) -> Result<Option<DateTime<Utc>>, OverrideError> {
    let Some(text) = until else { return Ok(None) };
    let at = DateTime::parse_from_rfc3339(text)
        .map_err(|e| {
            invalid("until", format!("until is not an RFC 3339 time such as 2027-06-01T00:00:00Z: {e}"))
        })?
        .with_timezone(&Utc);
    if at <= Utc::now() {
        return Err(invalid("until", "until is in the past: the override would never apply"));
    }
    Ok(Some(at))
}

fn validate_note(note: Option<&str>) -> Result<Option<String>, OverrideError> {
    match note {
        Some(note) if note.len() > MAX_REASON_LEN => {
            Err(invalid("note", format!("note is longer than {MAX_REASON_LEN} bytes")))
        }
        note => Ok(note.map(str::to_owned)),
    }
}

fn unavailable(e: StoreError) -> OverrideError {
    if !matches!(e, StoreError::Unavailable) {
        tracing::warn!(error = %e, "a change to API overrides failed");
    }
    OverrideError::Unavailable
}
