//! Where counters live.
//!
//! Every store implements [`Store`]: one call decides all the buckets of a
//! check at once, by the rules of [`crate::algorithm`]: admitted only if
//! every bucket has room for the cost, then every bucket takes it; a denied
//! check or a peek (`cost == 0`) changes nothing.
//!
//! [`PgStore`] keeps counters in PostgreSQL and is exact across instances;
//! [`MemoryStore`] keeps them in this process; [`FallbackStore`] serves from
//! the first and falls back to the second while PostgreSQL is unreachable;
//! [`DenyCache`] answers repeated denials without asking either.
//! [`DenialStore`] keeps the denials the limiter counted, for the top list.

mod audit;
mod denials;
mod deny_cache;
mod fallback;
mod inspect;
mod memory;
mod overrides;
mod policies;
mod postgres;
mod stale;
mod traits;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::algorithm::{Algorithm, Calendar};

pub use audit::{audit_time, key_prefix, Acting, AuditAction, AuditEntry, AuditQuery, AuditRow, AuditStore};
pub use denials::{DenialStore, KeyDenials, MinuteDenials, TopKey, TopList, TopQuery};
pub use deny_cache::DenyCache;
pub use fallback::{longest_wait, FallbackStore};
pub use inspect::{InspectStore, Inspection, Stored};
pub use memory::MemoryStore;
pub use overrides::{AddedOverride, LoadedOverrides, OverrideStore, StoredOverride, OVERRIDES_POLL_EVERY};
pub use policies::{CompiledPolicies, PolicyStore};
pub use postgres::{
    functions_schema, kept_connections, migrate, push_policies, single_node_statement, Citus, CitusChecks,
    PgStore, PgStoreOptions, Pooler, Reach, ALIVE_FOR, BEAT_EVERY, CONCURRENCY_ON_CITUS,
};
pub use stale::{Stale, MAX_STALE_KEYS};
pub use traits::{
    ActionStore, Block, BlockTarget, Freed, Held, LeaseStore, Primary, Renewal, Store, Unabsorbed,
};

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
    pub lockout: Option<Lockout>,
    /// A fixed window's calendar window (`window` is then its nominal length).
    pub calendar: Option<Calendar>,
}

/// A bucket's lockout: once it denies a check, its key is blocked this long.
#[derive(Debug, Clone)]
pub struct Lockout {
    pub duration: Duration,
    /// `policy/bucket`, kept with the block so that listings can name it.
    pub name: Arc<str>,
}

impl BucketSpec {
    pub fn params(&self) -> crate::algorithm::Params {
        let window_us = i64::try_from(self.window.as_micros()).unwrap_or(i64::MAX);
        crate::algorithm::Params {
            algorithm: self.algorithm,
            limit: self.limit,
            window_us,
            calendar: self.calendar,
        }
    }
}

/// All the buckets of one check, decided together.
#[derive(Debug, Clone)]
pub struct Check {
    pub buckets: Vec<BucketSpec>,
    pub cost: u64,
    /// What the memory store may do when Postgres cannot answer.
    pub fallback: MemoryFallback,
    /// The lease an admitted check takes in its concurrency buckets.
    pub lease: Option<NewLease>,
}

/// A lease a check takes if admitted ([`crate::limiter`] makes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewLease {
    /// The SHA-256 of the id the caller is given.
    pub id: Key,
    /// How long renewals may keep it, from when it is taken: its policy's
    /// `max_lease_life`.
    pub max_life: Duration,
}

/// Whether, and how, a check may be answered from memory while Postgres is
/// unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryFallback {
    /// Not at all: the check fails with [`StoreError::Unavailable`] and the
    /// caller decides.
    Refuse,
    /// Each instance enforces the whole limit: N instances admit up to N × it.
    Full,
    /// Each of the N instances that shared the database enforces
    /// `ceil(limit / N)`, so together they admit about the limit.
    Split,
}

/// One bucket's answer to a check. The figures mean the same whatever the
/// algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAnswer {
    /// Whether this bucket alone had room for the cost.
    pub allowed: bool,
    /// What is left after this check (nothing is taken on a denied check).
    pub remaining: u64,
    /// When the bucket is back to its full limit.
    pub reset_at: DateTime<Utc>,
    /// When denied: the earliest time a check of the same cost could pass.
    pub retry_at: Option<DateTime<Utc>>,
    /// Denied by a block (an operator's, or a lockout), whatever its count.
    pub blocked: bool,
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

impl StoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Memory => "memory",
            Self::None => "none",
        }
    }
}

/// The answer of a store: one state per bucket, in the batch's order.
#[derive(Debug, Clone)]
pub struct Answer {
    pub buckets: Vec<BucketAnswer>,
    /// The store's clock when it decided; durations in the answer count from here.
    pub now: DateTime<Utc>,
    pub store: StoreKind,
    /// True while the primary store is not the one answering.
    pub degraded: bool,
    /// Repeated from an earlier denial by the [`DenyCache`], without asking
    /// `store` again.
    pub cached: bool,
    /// The check's time in Postgres' lane; `None` when no call decided it.
    pub timing: Option<CallTiming>,
}

/// A check's time in the lane, carried with its answer so that the layer
/// that knows the whole time can tell the phases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTiming {
    /// Queued in this instance before its call was sent.
    pub queued: Duration,
    /// The call: statement, commit and round trip.
    pub call: Duration,
    /// Checks decided by that call, this one included.
    pub checks: u32,
}

impl Answer {
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
    /// Postgres cannot answer and the check may not fall back to memory.
    #[error("store unavailable and the check may not fall back to memory")]
    Unavailable,
}

/// Microseconds since the epoch, the algorithms' clock.
pub(crate) fn to_us(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub(crate) fn from_us(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MAX_UTC)
}
