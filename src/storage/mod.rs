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

mod deny_cache;
mod fallback;
mod memory;
mod overrides;
mod postgres;
mod stale;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::algorithm::{Algorithm, Calendar};

pub use deny_cache::DenyCache;
pub use fallback::{longest_wait, FallbackStore};
pub use memory::MemoryStore;
pub use overrides::{AddedOverride, LoadedOverrides, Overrides, StoredOverride, OVERRIDES_POLL_EVERY};
pub use postgres::{
    functions_schema, kept_connections, migrate, Citus, CitusChecks, PgStore, PgStoreOptions, Pooler, Reach,
    ALIVE_FOR, BEAT_EVERY, CONCURRENCY_ON_CITUS,
};
pub use stale::{Stale, MAX_STALE_KEYS};

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
pub struct CheckBatch {
    pub buckets: Vec<BucketSpec>,
    pub cost: u64,
    /// What the memory store may do when Postgres cannot answer.
    pub fallback: MemoryFallback,
    /// The lease an admitted check takes in its concurrency buckets: the
    /// SHA-256 of the id the caller is given ([`crate::limiter`] makes it).
    pub lease: Option<Key>,
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

/// A place that keeps counters and decides checks against them.
pub trait Store: Send + Sync + 'static {
    /// Decides every bucket of `batch` at once, all or nothing.
    fn check(&self, batch: &CheckBatch) -> impl Future<Output = Result<Answer, StoreError>> + Send;

    /// True while checks are answered without Postgres.
    fn is_degraded(&self) -> bool {
        false
    }

    /// How many service instances shared Postgres when it was last heard
    /// from, this one included (at least 1).
    fn instances(&self) -> u64 {
        1
    }

    /// What actions taken anywhere (resets, blocks, unblocks) made stale
    /// since the last call: remembered answers about it must go. Cheap when
    /// nothing happened (one atomic load), as it is asked on every check.
    fn take_stale(&self) -> Option<Stale> {
        None
    }

    /// The generation of the last action this instance has heard of.
    fn actions_heard(&self) -> u64 {
        0
    }

    /// Whether concurrency buckets may be checked here (not in Citus mode,
    /// whose tables are distributed while leases need one node).
    fn keeps_leases(&self) -> bool {
        true
    }
}

/// Changes made to limits by a caller or an operator. They are made in
/// Postgres, in one transaction each, and every instance hears of them (see
/// [`Store::take_stale`]); so they are refused while Postgres is away.
pub trait Actions: Send + Sync {
    /// Puts these buckets back to full (their rows deleted) and lifts their lockouts.
    fn reset(&self, keys: &[Key]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Blocks these keys for `duration` from now; returns when the block ends.
    fn block(
        &self,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
    ) -> impl Future<Output = Result<DateTime<Utc>, StoreError>> + Send;

    /// Lifts every block (an operator's or a lockout) on these keys; returns how many there were.
    fn unblock(&self, keys: &[Key]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Active blocks, the latest-ending first, at most `limit`.
    fn blocks(&self, limit: u32) -> impl Future<Output = Result<Vec<Block>, StoreError>> + Send;
}

/// Leases of concurrency buckets, by the SHA-256 of their id (see
/// `postgres/sql/leases.sql` and `fallback/releases.rs` for outages).
pub trait Leases: Send + Sync {
    /// Frees the lease's slots: `Some(true)` if it held any, `Some(false)`
    /// if it was released already or has ended, `None` if there is no such
    /// lease.
    fn release(&self, id: &Key) -> impl Future<Output = Result<Option<bool>, StoreError>> + Send;

    /// Extends the lease by its lease time from now; answers when it ends,
    /// or `None` if it has ended, was released, or does not exist.
    fn renew(&self, id: &Key) -> impl Future<Output = Result<Option<DateTime<Utc>>, StoreError>> + Send;

    /// The keys whose slots a release frees, as heard from any instance
    /// (this one's included), from now on; `None` where nothing is heard
    /// (behind a transaction pooler, which cannot hold a LISTEN).
    fn releases_heard(&self) -> Option<tokio::sync::broadcast::Receiver<Key>>;
}

/// A key to block, with the names an operator will see it by.
#[derive(Debug, Clone)]
pub struct BlockTarget {
    pub key: Key,
    pub policy: Arc<str>,
    pub bucket: Arc<str>,
}

/// An active block, as listed.
#[derive(Debug, Clone)]
pub struct Block {
    pub key: Key,
    /// `admin` (an operator's) or `lockout` (a bucket with `block_for` denied).
    pub kind: String,
    pub policy: Option<String>,
    pub bucket: Option<String>,
    pub until: DateTime<Utc>,
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// What the fallback needs of the shared store, beyond checks.
pub trait Primary: Store + Leases {
    /// Succeeds if the store answers within `budget`; changes nothing.
    fn ping(&self, budget: Duration) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Succeeds once the store can answer checks again (and prepares it to).
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How long the store has recently taken to answer a ping, at most.
    fn recent_latency(&self) -> Duration;

    /// Adds what this instance admitted from memory during an outage to the
    /// shared state, bucket by bucket (see [`crate::algorithm::absorb`]).
    /// Part may be written before a failure: the error gives back the rest.
    fn absorb(&self, outage: Vec<Held>) -> impl Future<Output = Result<(), Unabsorbed>> + Send;
}

/// What [`Primary::absorb`] did not write, and why.
#[derive(Debug)]
pub struct Unabsorbed {
    pub error: StoreError,
    pub left: Vec<Held>,
}

/// A bucket's state as the memory store holds it, with the parameters it
/// was checked with.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: Key,
    pub params: crate::algorithm::Params,
    pub state: crate::algorithm::State,
}
