//! One bucket explained: its stored state in the algorithm's own terms,
//! and what the model (the rules the SQL is tested against) decides from
//! it for the asked cost, with the reason in a sentence.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use crate::algorithm::{decide, sliding_counts, Algorithm, Params, State};
use crate::limiter::checks::seconds_until;
use crate::storage::{from_us, to_us, Block, BucketSpec, Key, Stored};

/// Hex digits of a key shown: enough to tell keys apart in a listing and
/// to find the row, never the identifiers it was made from.
pub const KEY_PREFIX_HEX: usize = 16;

#[derive(Debug, Clone, Serialize)]
pub struct BucketExplanation {
    pub name: Arc<str>,
    /// The first [`KEY_PREFIX_HEX`] hex digits of the bucket's key.
    pub key: String,
    pub algorithm: Algorithm,
    /// The limit enforced: an override's, and from memory this instance's share.
    pub limit: u64,
    pub window_s: f64,
    /// What is stored, in the algorithm's terms; `None`: nothing in force
    /// (no row, or one that has expired), a full bucket.
    pub state: Option<Value>,
    /// Whether this bucket alone has room for the cost now.
    pub allowed: bool,
    pub remaining: u64,
    #[serde(serialize_with = "super::rfc3339_ms")]
    pub reset_at: DateTime<Utc>,
    pub retry_after_s: Option<u64>,
    pub block: Option<BlockExplained>,
    /// Requests this instance holds waiting (`max_wait`) on this key.
    pub waiters: usize,
    /// The key's denials in the top list (`GET /admin/top`) over its
    /// retention; `None` when the list is off or could not be read.
    pub denials: Option<KeyDenied>,
    pub why: String,
    #[serde(skip)]
    pub full_key: Key,
    #[serde(skip)]
    pub retry_at: Option<DateTime<Utc>>,
}

/// A key's place in the top list: how often it was denied, and when last.
#[derive(Debug, Clone, Serialize)]
pub struct KeyDenied {
    pub count: u64,
    #[serde(serialize_with = "super::some_rfc3339_ms")]
    pub last: Option<DateTime<Utc>>,
    /// Counted since then: the top list's retention.
    #[serde(serialize_with = "super::rfc3339_ms")]
    pub since: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BlockExplained {
    /// `admin` (an operator's) or `lockout` (the bucket's `block_for`).
    pub kind: String,
    pub reason: Option<String>,
    #[serde(serialize_with = "super::rfc3339_ms")]
    pub until: DateTime<Utc>,
    #[serde(serialize_with = "super::rfc3339_ms")]
    pub since: DateTime<Utc>,
}

/// Bucket `spec` as `stored`, checked at `cost` as of `now`, each limit
/// divided by `share` (memory's share of it during an outage).
pub fn explain(
    spec: &BucketSpec,
    stored: Stored,
    cost: u64,
    now: DateTime<Utc>,
    share: u64,
) -> BucketExplanation {
    let params = Params { limit: spec.limit.div_ceil(share.max(1)), ..spec.params() };
    let now_us = to_us(now);
    let verdict = decide(params, stored.state.as_ref(), cost, now_us, false);
    let block = stored.block.map(blocked);
    let allowed = verdict.allowed && block.is_none();
    let retry_at = match &block {
        Some(b) => Some(b.until),
        None => verdict.retry_us.map(from_us),
    };
    let reset_at = from_us(verdict.full_us);
    let mut bucket = BucketExplanation {
        name: spec.name.clone(),
        key: hex::encode(spec.key)[..KEY_PREFIX_HEX].to_owned(),
        algorithm: spec.algorithm,
        limit: params.limit,
        window_s: spec.window.as_secs_f64(),
        state: stored.state.as_ref().and_then(|s| in_force(params, s, now_us)),
        allowed,
        remaining: if block.is_some() { 0 } else { verdict.remaining },
        reset_at,
        retry_after_s: retry_at.filter(|_| !allowed).map(|at| seconds_until(now, at).max(1)),
        block,
        waiters: 0,
        denials: None,
        why: String::new(),
        full_key: spec.key,
        retry_at,
    };
    bucket.why = why(&bucket, cost);
    bucket
}

fn blocked(b: Block) -> BlockExplained {
    BlockExplained { kind: b.kind, reason: b.reason, until: b.until, since: b.created_at }
}

/// The stored state as it counts at `now`, in the algorithm's terms; `None`
/// when nothing stored counts any more.
fn in_force(p: Params, s: &State, now: i64) -> Option<Value> {
    let at = |us: i64| super::at(&from_us(us));
    let window = p.window_us.max(1);
    match p.algorithm {
        Algorithm::FixedWindow => {
            (s.expires_us > now).then(|| json!({ "count": s.count, "window_ends_at": at(s.expires_us) }))
        }
        Algorithm::SlidingWindow => {
            let (start, count, previous) = sliding_counts(window, s, now);
            (count + previous > 0).then(|| {
                json!({ "window_started_at": at(start), "count": count, "previous_window_count": previous })
            })
        }
        Algorithm::SlidingLog => {
            let mut live: Vec<i64> = s.log.iter().copied().filter(|&t| t > now - window).collect();
            live.sort_unstable();
            (!live.is_empty()).then(|| json!({ "entries": live.iter().map(|&t| at(t)).collect::<Vec<_>>() }))
        }
        Algorithm::TokenBucket => {
            (s.tat_us > now).then(|| json!({ "theoretical_arrival_time": at(s.tat_us) }))
        }
        Algorithm::Concurrency => {
            let held: Vec<i64> = s.log.iter().copied().filter(|&t| t > now).collect();
            let earliest = held.iter().min().copied();
            earliest.map(|e| json!({ "slots_held": held.len(), "earliest_lease_end": at(e) }))
        }
    }
}

/// Why this bucket allows or denies, in a sentence.
fn why(b: &BucketExplanation, cost: u64) -> String {
    if let Some(block) = &b.block {
        let until = super::at(&block.until);
        return match (block.kind.as_str(), &block.reason) {
            ("lockout", _) => format!("locked out until {until}: it denied a check, and its block_for holds"),
            (_, Some(reason)) => format!("blocked by an operator until {until}: {reason}"),
            (_, None) => format!("blocked by an operator until {until}"),
        };
    }
    let left = format!("{} of {} left, full again at {}", b.remaining, b.limit, super::at(&b.reset_at));
    match b.retry_at.filter(|_| !b.allowed) {
        None => format!("room for a cost of {cost}: {left}"),
        Some(retry) => {
            format!(
                "no room for a cost of {cost}: {left}; a check of this cost passes at {}",
                super::at(&retry)
            )
        }
    }
}
