//! Where counters live.
//!
//! Every store implements [`Store`]: one call decides all the buckets of a
//! check at once, with the same fixed-window semantics:
//!
//! * a bucket's window starts at its key's first admitted request (not on the
//!   clock minute) and lasts `window`; a window that has reached `reset_at`
//!   counts as empty;
//! * a check is admitted only if every bucket has room for `cost`
//!   (`count + cost <= limit`); then every bucket takes `cost`;
//! * a denied check changes nothing, in any bucket;
//! * `cost == 0` reports the state and changes nothing.
//!
//! [`PgStore`] keeps counters in PostgreSQL and is exact across instances;
//! [`MemoryStore`] keeps them in this process; [`FallbackStore`] serves from
//! the first and falls back to the second while PostgreSQL is unreachable.

mod deny_cache;
mod fallback;
mod memory;
mod postgres;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::algorithm::Algorithm;

pub use deny_cache::DenyCache;
pub use fallback::FallbackStore;
pub use memory::MemoryStore;
pub use postgres::{PgStore, PgStoreOptions};

/// A stored bucket key: HMAC-SHA256 of what identifies the bucket.
pub type Key = [u8; 32];

/// One bucket to check.
#[derive(Debug, Clone)]
pub struct BucketSpec {
    /// Shown to the caller (response body, RateLimit headers); never stored.
    pub name: Arc<str>,
    pub key: Key,
    pub limit: u64,
    pub window: Duration,
    pub algorithm: Algorithm,
}

impl BucketSpec {
    pub fn params(&self) -> crate::algorithm::Params {
        let window_us = i64::try_from(self.window.as_micros()).unwrap_or(i64::MAX);
        crate::algorithm::Params { algorithm: self.algorithm, limit: self.limit, window_us }
    }
}

/// What to do for a check when the primary store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Answer from this instance's memory (fail open, still limited).
    #[default]
    Memory,
    /// Admit the request without counting it.
    Allow,
    /// Refuse with 503 (fail closed).
    Deny,
}

/// All the buckets of one check, decided together.
#[derive(Debug, Clone)]
pub struct CheckBatch {
    pub buckets: Vec<BucketSpec>,
    pub cost: u64,
    pub on_store_error: OnStoreError,
}

/// One bucket's answer to a check. The figures mean the same whatever the
/// algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    /// Whether this bucket alone had room for the cost.
    pub allowed: bool,
    /// What is left after this check (nothing is taken on a denied check).
    pub remaining: u64,
    /// When the bucket is back to its full limit.
    pub reset_at: DateTime<Utc>,
    /// When denied: the earliest time a check of the same cost could pass.
    pub retry_at: Option<DateTime<Utc>>,
}

/// Which store decided a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    Postgres,
    Memory,
    /// Nothing was counted: the primary store failed and the policy says `allow`.
    None,
}

/// The answer of a store: one state per bucket, in the batch's order.
#[derive(Debug, Clone)]
pub struct Checked {
    pub buckets: Vec<BucketState>,
    /// The store's clock when it decided; durations in the answer count from here.
    pub now: DateTime<Utc>,
    pub store: StoreKind,
    /// True while the primary store is not the one answering.
    pub degraded: bool,
}

impl Checked {
    pub fn allowed(&self) -> bool {
        self.buckets.iter().all(|b| b.allowed)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached in time; the whole instance should fall back.
    #[error("store unreachable: {0}")]
    Unreachable(String),
    /// The store answered with an error for this check only (a lock or statement timeout, say).
    #[error("store failed: {0}")]
    Failed(String),
    /// The store is unreachable and the policy fails closed.
    #[error("store unavailable and the policy fails closed")]
    Unavailable,
}

/// When a window of length `window` that starts at `now` ends.
pub(crate) fn window_end(now: DateTime<Utc>, window: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(window)
        .ok()
        .and_then(|w| now.checked_add_signed(w))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Microseconds since the epoch, the algorithms' clock.
pub(crate) fn to_us(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub(crate) fn from_us(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A place that keeps counters and decides checks against them.
pub trait Store: Send + Sync + 'static {
    /// Decides every bucket of `batch` at once, all or nothing.
    fn check(&self, batch: &CheckBatch) -> impl Future<Output = Result<Checked, StoreError>> + Send;

    /// Succeeds once the store can answer checks again (and prepares it to).
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Succeeds if the store answers at all; changes nothing.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}
