//! Denials kept for the top list (`GET /admin/top`): what the limiter
//! counted in memory, written as one row per key and minute
//! ([`DenialStore::add_denials`]), and read back summed over instances.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Key, StoreError};

/// Denials of one bucket key in one minute, counted by one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteDenials {
    /// The start of the minute.
    pub minute: DateTime<Utc>,
    pub key: Key,
    /// The policy's name, or `_adhoc`.
    pub policy: Arc<str>,
    /// The bucket that denied.
    pub bucket: Arc<str>,
    /// A JSON object of the identifiers its policy shows; `None`: none.
    pub shown: Option<Arc<str>>,
    pub count: u64,
}

/// Which denials the top list sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopQuery {
    pub policy: Option<String>,
    pub bucket: Option<String>,
    /// From this long before the database's `now()`.
    pub since: Duration,
    pub limit: u32,
}

/// One key of the top list, summed over every instance's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct TopKey {
    pub policy: String,
    pub bucket: String,
    pub key: Key,
    /// The shown identifiers, a JSON object; `None`: only the key is kept.
    pub shown: Option<serde_json::Value>,
    pub denials: u64,
    /// The first and the last minute with a denial.
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
}

/// The top list, with the database's clock: from `since` to `until`.
#[derive(Debug, Clone, PartialEq)]
pub struct TopList {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub keys: Vec<TopKey>,
}

/// What the table holds of one key since a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDenials {
    pub key: Key,
    pub denials: u64,
    /// The last minute with a denial; `None`: none.
    pub last: Option<DateTime<Utc>>,
}

/// Where the counted denials are kept and summed.
pub trait DenialStore: Send + Sync + 'static {
    /// Adds each row's count to what its key and minute hold, in one statement.
    fn add_denials(&self, rows: &[MinuteDenials]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The most-denied keys of `query`, most denied first.
    fn top(&self, query: &TopQuery) -> impl Future<Output = Result<TopList, StoreError>> + Send;

    /// Each of `keys`' denials from `since` ago, in the order given.
    fn denials_of(
        &self,
        keys: &[Key],
        since: Duration,
    ) -> impl Future<Output = Result<Vec<KeyDenials>, StoreError>> + Send;

    /// How long old minutes are kept before the cleanup deletes them.
    fn keep_denials_for(&self, retention: Duration);
}
