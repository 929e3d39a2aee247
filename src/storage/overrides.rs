//! Overrides set through the API, as stored: Postgres keeps them and tells
//! every instance when they change, so that each holds them in memory and
//! no check ever reads them from the database.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{AuditEntry, StoreError};

/// How often an instance that cannot LISTEN (behind a transaction pooler)
/// asks whether the overrides changed. With LISTEN a change is heard at
/// once; this is then only the bound behind a pooler.
pub const OVERRIDES_POLL_EVERY: Duration = Duration::from_millis(500);

/// One override as stored, validated by the limiter before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOverride {
    pub id: String,
    pub policy: String,
    /// Identifier name to pattern: `hmac:<hex>` for an exact value (never
    /// the value), else the `*@domain` or CIDR pattern as normalised.
    pub when: BTreeMap<String, String>,
    /// `limits`, `unlimited` or `deny`.
    pub action: String,
    /// Bucket name to limit, for `limits`; empty otherwise.
    pub limits: BTreeMap<String, u64>,
    pub until: Option<DateTime<Utc>>,
    pub note: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// An override as stored, and the ids of those it replaced: the policy's
/// overrides with the same `when`, so that setting a customer's plan
/// again (a retried signup, an upgrade) leaves one override, not two.
#[derive(Debug, Clone)]
pub struct AddedOverride {
    pub stored: StoredOverride,
    pub replaced: Vec<String>,
}

/// Every override in force, as of one overrides generation.
#[derive(Debug, Clone, Default)]
pub struct LoadedOverrides {
    pub generation: u64,
    /// Newest first: the first that matches applies.
    pub overrides: Vec<StoredOverride>,
}

/// Changes to API overrides, made in Postgres in one transaction each and
/// announced to every instance, with its audit row; refused while
/// Postgres is away.
pub trait OverrideStore: Send + Sync {
    /// Stores `new` (its `created_at` is set by the database) in place of
    /// the policy's overrides with the same `when`; the audit row's detail
    /// gets the ids replaced as `replaced`.
    fn add_override(
        &self,
        new: &StoredOverride,
        audit: &AuditEntry,
    ) -> impl Future<Output = Result<AddedOverride, StoreError>> + Send;

    /// Deletes one; `false` if there was none with that id, and then no
    /// audit row is written. The row's detail gets the override's `policy`.
    fn remove_override(
        &self,
        id: &str,
        audit: &AuditEntry,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Those not expired, of `policy` (or all), the newest first, at most `limit`.
    fn list_overrides(
        &self,
        policy: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredOverride>, StoreError>> + Send;

    /// Every override in force, unless the overrides generation is still
    /// `loaded` (`None`: nothing changed since).
    fn load_overrides(
        &self,
        loaded: Option<u64>,
    ) -> impl Future<Output = Result<Option<LoadedOverrides>, StoreError>> + Send;

    /// Completes when the overrides may have changed: a notification, a
    /// missed one, or (without LISTEN) the next poll.
    fn overrides_may_have_changed(&self) -> impl Future<Output = ()> + Send;
}
