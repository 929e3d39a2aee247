//! What a store offers: deciding checks ([`Store`]), the operator's actions
//! on buckets ([`ActionStore`]), leases ([`LeaseStore`]), and what the primary
//! store adds for the fallback ([`Primary`]). The API's overrides have
//! their own trait, `OverrideStore`, in `storage/overrides.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Answer, AuditEntry, Check, Key, Stale, StoreError};

/// A place that keeps counters and decides checks against them.
pub trait Store: Send + Sync + 'static {
    /// Decides every bucket of `check` at once, all or nothing.
    fn check(&self, check: &Check) -> impl Future<Output = Result<Answer, StoreError>> + Send;

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

    /// Whether calendar windows in the IANA zone `zone` may be checked
    /// here: with Postgres, only a zone its server lists, as one it lacks
    /// fails every check batched with it; memory knows every zone.
    fn knows_zone(&self, _zone: &str) -> bool {
        true
    }
}

/// Changes made to limits by a caller or an operator. They are made in
/// Postgres, in one transaction each, and every instance hears of them (see
/// [`Store::take_stale`]); so they are refused while Postgres is away.
/// Each writes its audit row, if it has one, in the same transaction.
pub trait ActionStore: Send + Sync {
    /// Puts these buckets back to full (their rows deleted) and lifts their lockouts.
    fn reset(
        &self,
        keys: &[Key],
        audit: Option<&AuditEntry>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Blocks these keys for `duration` from now; returns when the block
    /// ends, which the audit row's detail gets as `until`.
    fn block(
        &self,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
        audit: &AuditEntry,
    ) -> impl Future<Output = Result<DateTime<Utc>, StoreError>> + Send;

    /// Lifts every block (an operator's or a lockout) on these keys; returns
    /// how many there were, which the audit row's detail gets as `lifted`.
    fn unblock(
        &self,
        keys: &[Key],
        audit: &AuditEntry,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Active blocks, the latest-ending first, at most `limit`.
    fn blocks(&self, limit: u32) -> impl Future<Output = Result<Vec<Block>, StoreError>> + Send;
}

/// Leases of concurrency buckets, by the SHA-256 of their id (see
/// `postgres/sql/leases.sql` and `fallback/releases.rs` for outages).
pub trait LeaseStore: Send + Sync {
    /// Frees the lease's slots: `Some(true)` if it held any, `Some(false)`
    /// if it was released already or has ended, `None` if there is no such
    /// lease.
    fn release(&self, id: &Key) -> impl Future<Output = Result<Option<bool>, StoreError>> + Send;

    /// Extends the lease by its lease time from now, unless that would take
    /// it past its `max_lease_life`.
    fn renew(&self, id: &Key) -> impl Future<Output = Result<Renewal, StoreError>> + Send;

    /// The slots releases free, as heard from any instance (this one's
    /// included), from now on; `None` where nothing is heard (behind a
    /// transaction pooler, which cannot hold a LISTEN).
    fn releases_heard(&self) -> Option<tokio::sync::broadcast::Receiver<Freed>>;
}

/// What a renewal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Extended: it now ends then.
    Renewed(DateTime<Utc>),
    /// Refused, nothing changed: it would outlive its `max_lease_life`,
    /// which lets it be held until `ends_by` at most; it still ends at `ends`.
    PastMaxLife { ends: DateTime<Utc>, ends_by: DateTime<Utc> },
    /// It has ended, was released, or does not exist.
    Unknown,
}

/// What a release heard of frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    /// The slots of this key.
    Slots(Key),
    /// Maybe any: releases may have gone unheard (the listener was not
    /// connected when they were sent).
    Any,
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
pub trait Primary: Store + LeaseStore {
    /// Succeeds if the store answers within `budget`; changes nothing.
    fn ping(&self, budget: Duration) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Succeeds once the store can answer checks again (and prepares it to).
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How long the store has recently taken to answer a ping, at most.
    fn recent_latency(&self) -> Duration;

    /// Adds what this instance admitted from memory during an outage to the
    /// shared state, bucket by bucket (see [`crate::algorithm::absorb`]).
    /// WorkerCheck may be written before a failure: the error gives back the rest.
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
