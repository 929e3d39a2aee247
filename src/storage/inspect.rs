//! Reading a check's buckets without deciding anything: what
//! `POST /admin/explain` shows an operator. Every store answers with the
//! stored state the algorithms decide from (see [`crate::algorithm::State`]),
//! so that the limiter can say what a check would answer, and why, with
//! the same model that the SQL is tested against.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::{Block, Check, StoreError, StoreKind};
use crate::algorithm::State;

/// A store whose buckets can be read as they stand.
pub trait InspectStore: Send + Sync {
    /// The state of each bucket of `check`, in its order; changes nothing
    /// (no row is created, no window started, no denial remembered).
    fn inspect(&self, check: &Check) -> impl Future<Output = Result<Inspection, StoreError>> + Send;
}

/// What a store holds for a check's buckets.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The store's clock when it read them.
    pub now: DateTime<Utc>,
    /// `Postgres`, or `Memory` while Postgres is away.
    pub store: StoreKind,
    /// True while checks are answered without Postgres.
    pub degraded: bool,
    /// From memory, each bucket enforces `ceil(limit / share)`: this
    /// instance's share of the limit (1: the whole limit).
    pub share: u64,
    /// One per bucket, in the check's order.
    pub buckets: Vec<Stored>,
    /// Blocks are kept in Postgres only: `false` when read from memory.
    pub blocks_known: bool,
    /// This instance repeats a remembered denial of this exact check
    /// (the deny cache) until then, without asking the store.
    pub remembered_until: Option<DateTime<Utc>>,
}

/// One bucket as stored.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// `None`: no row (or one that has expired, which counts for nothing).
    pub state: Option<State>,
    /// The block on its key in force, an operator's or a lockout.
    pub block: Option<Block>,
}
