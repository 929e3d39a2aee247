//! What a check answers: allowed or denied, with the figures behind it.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

use crate::storage::{BucketSpec, Checked, StoreKind};

/// The outcome of a check. A denial is a normal outcome, not an error.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    #[serde(serialize_with = "rfc3339_ms")]
    pub reset_at: DateTime<Utc>,
    /// Whole seconds to wait before retrying; `None` when allowed.
    pub retry_after_s: Option<u64>,
    pub store: StoreKind,
    pub degraded: bool,
    pub buckets: Vec<BucketDecision>,
    /// The deciding store's clock; header durations count from here.
    #[serde(skip)]
    pub now: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BucketDecision {
    pub name: std::sync::Arc<str>,
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    #[serde(serialize_with = "rfc3339_ms")]
    pub reset_at: DateTime<Utc>,
    #[serde(skip)]
    pub window: Duration,
}

impl Decision {
    /// Combines the store's answer with the buckets it was asked about. The
    /// top-level figures are those of the denying bucket that resets last
    /// (the caller must wait for it anyway), or else of the bucket with the
    /// least remaining.
    pub fn new(specs: &[BucketSpec], checked: Checked) -> Self {
        let allowed = checked.allowed();
        let buckets: Vec<BucketDecision> = specs
            .iter()
            .zip(&checked.buckets)
            .map(|(spec, state)| BucketDecision {
                name: spec.name.clone(),
                allowed: state.allowed,
                limit: spec.limit,
                remaining: spec.limit.saturating_sub(state.count),
                reset_at: state.reset_at,
                window: spec.window,
            })
            .collect();
        let headline = if allowed {
            buckets.iter().min_by_key(|b| (b.remaining, std::cmp::Reverse(b.reset_at)))
        } else {
            buckets.iter().filter(|b| !b.allowed).max_by_key(|b| b.reset_at)
        };
        let (limit, remaining, reset_at) =
            headline.map_or((0, 0, checked.now), |b| (b.limit, b.remaining, b.reset_at));
        let retry_after_s = (!allowed).then(|| seconds_until(checked.now, reset_at).max(1));
        Self {
            allowed,
            limit,
            remaining,
            reset_at,
            retry_after_s,
            store: checked.store,
            degraded: checked.degraded,
            buckets,
            now: checked.now,
        }
    }
}

/// Whole seconds from `now` to `then`, rounded up, never negative.
pub fn seconds_until(now: DateTime<Utc>, then: DateTime<Utc>) -> u64 {
    let ms = (then - now).num_milliseconds().max(0) as u64;
    ms.div_ceil(1000)
}

fn rfc3339_ms<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Millis, true))
}
