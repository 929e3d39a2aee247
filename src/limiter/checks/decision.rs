//! What a check answers: allowed or denied, with the figures behind it.

use std::time::Duration;

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use serde::{Serialize, Serializer};

use super::plan::{Applied, Matched};
use crate::algorithm::Algorithm;
use crate::storage::{Answer, BucketAnswer, BucketSpec, CallTiming, Key, StoreKind};

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
    /// In shadow mode the check is answered as allowed whatever the buckets
    /// say; `would_allow` is what enforcing would have answered.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_allow: Option<bool>,
    /// The bucket whose key is blocked (by an operator, or a lockout), when
    /// that is why the check is denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<std::sync::Arc<str>>,
    /// The policy's override entry that matched, if any.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    pub matched: Option<Matched>,
    /// The lease an admitted check of a concurrency bucket holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<Granted>,
    pub buckets: Vec<BucketDecision>,
    /// How long a check with `max_wait` was held (0: answered at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// The deciding store's clock; header durations count from here.
    #[serde(skip)]
    pub now: DateTime<Utc>,
    /// Repeated by the deny cache rather than decided by `store` now.
    #[serde(skip)]
    pub cached: bool,
    /// The store's timing of the check, for the slow-check log.
    #[serde(skip)]
    pub timing: Option<CallTiming>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BucketDecision {
    pub name: std::sync::Arc<str>,
    pub algorithm: Algorithm,
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    /// When the bucket is back to its full limit.
    #[serde(serialize_with = "rfc3339_ms")]
    pub reset_at: DateTime<Utc>,
    /// Denied by a block on its key, whatever its count.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// When denied: the earliest time a check of the same cost could pass.
    #[serde(skip)]
    pub retry_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub window: Duration,
    /// Its key, which waiters on it queue by.
    #[serde(skip)]
    pub key: Key,
}

impl Decision {
    /// Combines the store's answer with the buckets it was asked about. The
    /// top-level figures are those of the denying bucket the caller must wait
    /// for longest, or else of the bucket with the least remaining.
    pub fn new(specs: &[BucketSpec], answer: Answer) -> Self {
        let allowed = answer.allowed();
        let buckets: Vec<BucketDecision> =
            specs.iter().zip(&answer.buckets).map(|(spec, state)| BucketDecision::of(spec, state)).collect();
        let headline = headline(&buckets, allowed);
        let now = answer.now;
        let (limit, remaining, reset_at) =
            headline.map_or((0, 0, now), |b| (b.limit, b.remaining, b.reset_at));
        let retry_at = headline.and_then(|b| b.retry_at).unwrap_or(reset_at);
        let retry_after_s = (!allowed).then(|| seconds_until(now, retry_at).max(1));
        let (store, degraded, cached, timing) = (answer.store, answer.degraded, answer.cached, answer.timing);
        let (shadow, would_allow, matched) = (false, None, None);
        let blocked_by = buckets.iter().find(|b| b.blocked).map(|b| b.name.clone());
        Self {
            allowed,
            limit,
            remaining,
            reset_at,
            retry_after_s,
            store,
            degraded,
            shadow,
            would_allow,
            blocked_by,
            matched,
            lease: None,
            buckets,
            waited_ms: None,
            now,
            cached,
            timing,
        }
    }

    /// Notes the override that decided or shaped this check. A deny list
    /// has no end to wait for, so no `retry_after_s` (nor `Retry-After`).
    pub fn overridden(self, matched: Matched) -> Self {
        let retry_after_s = if matched.action == Applied::Deny { None } else { self.retry_after_s };
        Self { matched: Some(matched), retry_after_s, ..self }
    }

    /// The answer of a shadow policy: allowed, with what enforcing would
    /// have answered beside it; the buckets keep their real figures (and so
    /// do the RateLimit headers), but there is nothing to retry.
    pub fn shadowed(self, shadow: bool) -> Self {
        if !shadow {
            return self;
        }
        let would_allow = Some(self.allowed);
        Self { allowed: true, retry_after_s: None, shadow, would_allow, ..self }
    }

    /// The answer of a check with `max_wait`, held for `waited`.
    pub fn waited(self, waited: Duration) -> Self {
        Self { waited_ms: Some(waited.as_millis() as u64), ..self }
    }

    /// Which store answered, as metrics label it: one of `StoreKind`'s, or
    /// `deny_cache` for a remembered denial.
    pub fn store_label(&self) -> &'static str {
        if self.cached {
            "deny_cache"
        } else {
            self.store.as_str()
        }
    }

    /// `allowed`, `denied`, `shadow_denied` or `error`, as metrics count it.
    /// A shadow check that enforcing would have refused for an outage (no
    /// store decided it) is an `error`, not a would-be denial by a limit;
    /// one a deny list would have refused (no store asked either) is a
    /// would-be denial, as its enforced twin is a denial.
    pub fn outcome(&self) -> &'static str {
        let deny_listed = self.matched.as_ref().is_some_and(|m| m.action == Applied::Deny);
        match (self.allowed, self.would_allow) {
            (true, Some(false)) if self.store == StoreKind::None && !deny_listed => "error",
            (true, Some(false)) => "shadow_denied",
            (true, _) => "allowed",
            (false, _) => "denied",
        }
    }
}

/// A lease as an admitted check answers it.
#[derive(Debug, Clone, Serialize)]
pub struct Granted {
    pub id: String,
    /// When the lease ends unless released or renewed (the earliest of its
    /// buckets', when a check has several).
    #[serde(serialize_with = "rfc3339_ms")]
    pub expires_at: DateTime<Utc>,
}

impl BucketDecision {
    /// The store's `state` of the bucket `spec` described.
    fn of(spec: &BucketSpec, state: &BucketAnswer) -> Self {
        BucketDecision {
            name: spec.name.clone(),
            algorithm: spec.algorithm,
            allowed: state.allowed,
            limit: spec.limit,
            remaining: state.remaining,
            reset_at: state.reset_at,
            blocked: state.blocked,
            retry_at: state.retry_at,
            window: spec.window,
            key: spec.key,
        }
    }
}

/// The bucket whose figures head the answer: of the denying ones, the one
/// the caller must wait for longest; if none denied, the one with the least
/// remaining (the later reset on a tie).
fn headline(buckets: &[BucketDecision], allowed: bool) -> Option<&BucketDecision> {
    if allowed {
        buckets.iter().min_by_key(|b| (b.remaining, std::cmp::Reverse(b.reset_at)))
    } else {
        buckets.iter().filter(|b| !b.allowed).max_by_key(|b| b.retry_at.unwrap_or(b.reset_at))
    }
}

/// Whole seconds from `now` to `then`, rounded up, never negative.
pub fn seconds_until(now: DateTime<Utc>, then: DateTime<Utc>) -> u64 {
    let ms = (then - now).num_milliseconds().max(0) as u64;
    ms.div_ceil(1000)
}

fn rfc3339_ms<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    match rfc3339_ms_fast(at) {
        Some(text) => s.serialize_str(std::str::from_utf8(&text).unwrap_or_default()),
        None => s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Millis, true)),
    }
}

/// `2026-11-29T15:17:53.942Z` without chrono's formatting machinery, which
/// cost a measurable share of a denial answered from memory; `None` (so
/// chrono formats it) for a year outside 0 to 9999 or a leap second.
fn rfc3339_ms_fast(at: &DateTime<Utc>) -> Option<[u8; 24]> {
    if !(0..=9999).contains(&at.year()) || at.nanosecond() >= 1_000_000_000 {
        return None;
    }
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let year = at.year() as u32;
    let fields = [(0, year / 100), (2, year % 100), (5, at.month()), (8, at.day()), (11, at.hour())];
    let time = [(14, at.minute()), (17, at.second()), (20, at.nanosecond() / 10_000_000)];
    for (pos, value) in fields.into_iter().chain(time) {
        out[pos] = b'0' + (value / 10) as u8;
        out[pos + 1] = b'0' + (value % 10) as u8;
    }
    out[22] = b'0' + (at.nanosecond() / 1_000_000 % 10) as u8;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_chrono_writes_them() {
        let mut us: i64 = -62_167_219_200_000_000; // 0000-01-01
        while us < 253_402_300_800_000_000 {
            let at = DateTime::from_timestamp_micros(us).expect("in range");
            let fast = rfc3339_ms_fast(&at).expect("a year of four digits");
            assert_eq!(
                std::str::from_utf8(&fast),
                Ok(at.to_rfc3339_opts(SecondsFormat::Millis, true).as_str())
            );
            us += 3_141_592_653_589 + us.rem_euclid(999_983);
        }
        assert_eq!(rfc3339_ms_fast(&DateTime::<Utc>::MAX_UTC), None);
    }
}
