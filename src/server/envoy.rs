//! Envoy's rate limit protocol in pglimit's terms: a `RateLimitRequest`
//! becomes one policy check, and a [`Decision`] becomes the response Envoy
//! expects (one status per descriptor, in order).
//!
//! The domain names the policy; every descriptor entry gives an identifier
//! (entry key = identifier name), gathered from all descriptors into one
//! check, so that all of a request's descriptors are decided together, all
//! or nothing. Each descriptor's status is that of the policy buckets it
//! describes: those counting over exactly its entries' keys, else those
//! counting over some of them, else all of them.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::Status;

use super::headers::rate_limit_headers;
use crate::limiter::{BucketDecision, CheckRequest, Decision};
use crate::policy::Policy;

/// Descriptors per request. Envoy sends one per matching `rate_limits`
/// entry of the route, a handful; each costs a status in the answer.
const MAX_DESCRIPTORS: usize = 32;

/// Entries per descriptor: one per identifier the descriptor's bucket
/// counts over, a handful (more than the policy declares are refused).
const MAX_ENTRIES: usize = 32;

/// How much of a name the request chose an error repeats: as long as a
/// policy or identifier name can be (`policy::is_valid_name`), so a name
/// that could be right is shown whole and a long one stays short.
const ECHOED_BYTES: usize = 64;

/// The check a request asks for, and the identifier names each of its
/// descriptors carries.
pub struct Asked {
    pub check: CheckRequest,
    pub descriptors: Vec<BTreeSet<String>>,
}

/// Reads a request; a mistake is INVALID_ARGUMENT naming what is wrong.
pub fn read(request: RateLimitRequest) -> Result<Asked, Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("domain is empty: it names the pglimit policy"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument("descriptors is empty: nothing to check"));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        let given = request.descriptors.len();
        let message = format!("descriptors: {given} given, at most {MAX_DESCRIPTORS} are accepted");
        return Err(Status::invalid_argument(message));
    }
    let cost = cost(&request)?;
    let mut identifiers = BTreeMap::new();
    let mut descriptors = Vec::with_capacity(request.descriptors.len());
    for (i, descriptor) in request.descriptors.into_iter().enumerate() {
        descriptors.push(gather(i, descriptor, &mut identifiers)?);
    }
    Ok(Asked { check: CheckRequest::Policy { policy: request.domain, identifiers, cost }, descriptors })
}

/// Adds a descriptor's entries to the check's identifiers; returns its keys.
fn gather(
    i: usize,
    descriptor: RateLimitDescriptor,
    identifiers: &mut BTreeMap<String, String>,
) -> Result<BTreeSet<String>, Status> {
    if descriptor.limit.is_some() {
        let message = format!("descriptors[{i}]: limit overrides are not accepted: the policy sets limits");
        return Err(Status::invalid_argument(message));
    }
    if descriptor.is_negative_hits {
        return Err(Status::invalid_argument(format!("descriptors[{i}]: negative hits are not supported")));
    }
    if descriptor.entries.len() > MAX_ENTRIES {
        let given = descriptor.entries.len();
        let message = format!("descriptors[{i}].entries: {given} given, at most {MAX_ENTRIES} are accepted");
        return Err(Status::invalid_argument(message));
    }
    let mut keys = BTreeSet::new();
    for entry in descriptor.entries {
        if identifiers.get(&entry.key).is_some_and(|seen| *seen != entry.value) {
            let message = format!(
                "descriptors[{i}]: entry {:?} differs from an earlier descriptor's; one check has one value per identifier",
                shown(&entry.key)
            );
            return Err(Status::invalid_argument(message));
        }
        keys.insert(entry.key.clone());
        identifiers.insert(entry.key, entry.value);
    }
    Ok(keys)
}

/// A name from the request as an error shows it: its first
/// [`ECHOED_BYTES`] bytes (to a character), and `…` when cut.
pub fn shown(name: &str) -> Cow<'_, str> {
    if name.len() <= ECHOED_BYTES {
        return Cow::Borrowed(name);
    }
    Cow::Owned(format!("{}…", &name[..name.floor_char_boundary(ECHOED_BYTES)]))
}

/// `hits_addend`, 0 meaning 1 as Envoy defines it. Descriptors may carry
/// their own; they are decided as one check, so they must agree.
fn cost(request: &RateLimitRequest) -> Result<u64, Status> {
    let own: BTreeSet<u64> =
        request.descriptors.iter().filter_map(|d| d.hits_addend.map(|h| h.value)).collect();
    let hits = match own.len() {
        0 => u64::from(request.hits_addend),
        1 => own.into_iter().next().unwrap_or_default(),
        _ => {
            let message =
                "descriptors carry different hits_addend values; they are decided together, at one cost";
            return Err(Status::invalid_argument(message));
        }
    };
    Ok(hits.max(1))
}

/// The answer to Envoy: the overall code, one status per descriptor, and
/// the RateLimit headers (Cache-Control left out: Envoy adds these headers
/// to the upstream's own responses too).
pub fn respond(
    decision: &Decision,
    policy: Option<&Policy>,
    descriptors: &[BTreeSet<String>],
) -> RateLimitResponse {
    let statuses =
        descriptors.iter().map(|keys| status(decision, headline(decision, policy, keys))).collect();
    RateLimitResponse {
        overall_code: code(decision.allowed) as i32,
        statuses,
        response_headers_to_add: headers(decision),
        ..Default::default()
    }
}

/// The buckets a descriptor describes, and of those the one that speaks
/// for it: the denying one with the longest wait, else the least remaining.
fn headline<'d>(
    decision: &'d Decision,
    policy: Option<&Policy>,
    keys: &BTreeSet<String>,
) -> Option<&'d BucketDecision> {
    let on = |bucket: &BucketDecision| -> Option<BTreeSet<&str>> {
        let def = policy?.buckets.iter().find(|b| b.name == bucket.name)?;
        Some(def.on.iter().map(String::as_str).collect())
    };
    let keys: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
    let exact: Vec<_> = decision.buckets.iter().filter(|b| on(b).is_some_and(|on| on == keys)).collect();
    let within: Vec<_> =
        decision.buckets.iter().filter(|b| on(b).is_some_and(|on| on.is_subset(&keys))).collect();
    let described = [exact, within].into_iter().find(|b| !b.is_empty());
    let described = described.unwrap_or_else(|| decision.buckets.iter().collect());
    let denied = described.iter().filter(|b| !b.allowed).max_by_key(|b| b.retry_at.unwrap_or(b.reset_at));
    denied.or_else(|| described.iter().min_by_key(|b| b.remaining)).copied()
}

fn status(decision: &Decision, bucket: Option<&BucketDecision>) -> DescriptorStatus {
    let Some(bucket) = bucket else {
        return DescriptorStatus { code: code(decision.allowed) as i32, ..Default::default() };
    };
    // A shadow policy is answered as allowed whatever its buckets say.
    let over = !decision.allowed && !bucket.allowed;
    let (requests_per_unit, unit) = per_unit(bucket.limit, bucket.window);
    DescriptorStatus {
        code: code(!over) as i32,
        current_limit: Some(RateLimit {
            name: bucket.name.to_string(),
            requests_per_unit,
            unit: unit as i32,
        }),
        limit_remaining: u32::try_from(bucket.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(until(decision.now, bucket.reset_at)),
        ..Default::default()
    }
}

/// Postgres cannot answer and the policy fails closed (`on_store_error =
/// "deny"`, a 503 on /check): OVER_LIMIT with `Retry-After: 1`, so that
/// Envoy refuses the request whatever its own `failure_mode_deny` says.
pub fn fail_closed(descriptors: usize) -> RateLimitResponse {
    let over = DescriptorStatus { code: Code::OverLimit as i32, ..Default::default() };
    let retry = HeaderValue { key: "retry-after".into(), value: "1".into(), ..Default::default() };
    RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![over; descriptors],
        response_headers_to_add: vec![retry],
        ..Default::default()
    }
}

fn code(allowed: bool) -> Code {
    if allowed {
        Code::Ok
    } else {
        Code::OverLimit
    }
}

/// A bucket's limit per its window as Envoy's `requests_per_unit` of a
/// unit: the longest unit (second to day) that fits in the window, the
/// limit scaled to it and rounded down (never below 1), so the figure never
/// promises more than the bucket admits. Exact for windows of 1 s, 1 m,
/// 1 h and 1 d; the exact figures are in the RateLimit-Policy header.
pub fn per_unit(limit: u64, window: std::time::Duration) -> (u32, Unit) {
    const UNITS: [(Unit, u128); 4] =
        [(Unit::Day, 86_400_000), (Unit::Hour, 3_600_000), (Unit::Minute, 60_000), (Unit::Second, 1_000)];
    let window_ms = window.as_millis().max(1);
    let (unit, unit_ms) = UNITS.into_iter().find(|(_, ms)| window_ms >= *ms).unwrap_or(UNITS[3]);
    let scaled = u128::from(limit) * unit_ms / window_ms;
    (u32::try_from(scaled).unwrap_or(u32::MAX).max(1), unit)
}

fn until(now: DateTime<Utc>, then: DateTime<Utc>) -> ProtoDuration {
    let ms = (then - now).num_milliseconds().max(0);
    ProtoDuration { seconds: ms / 1000, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

fn headers(decision: &Decision) -> Vec<HeaderValue> {
    let rendered = rate_limit_headers(decision);
    rendered
        .iter()
        .filter(|(name, _)| *name != axum::http::header::CACHE_CONTROL)
        .filter_map(|(name, value)| {
            let value = value.to_str().ok()?.to_owned();
            Some(HeaderValue { key: name.as_str().to_owned(), value, ..Default::default() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn windows_of_one_unit_are_exact_and_others_never_overstate_the_limit() {
        assert_eq!(per_unit(5, Duration::from_secs(60)), (5, Unit::Minute));
        assert_eq!(per_unit(3, Duration::from_secs(86_400)), (3, Unit::Day));
        assert_eq!(per_unit(50, Duration::from_secs(900)), (3, Unit::Minute), "50 per 15 min");
        assert_eq!(per_unit(1, Duration::from_secs(900)), (1, Unit::Minute), "never 0");
        assert_eq!(per_unit(10, Duration::from_millis(500)), (20, Unit::Second), "under a second");
        assert_eq!(per_unit(100, Duration::from_secs(7 * 86_400)), (14, Unit::Day));
    }

    #[test]
    fn a_name_as_long_as_a_policy_name_is_shown_whole_and_a_longer_one_is_cut_at_a_character() {
        let longest = "p".repeat(ECHOED_BYTES);
        assert_eq!(shown(&longest), longest);
        let long = format!("{}é{}", "a".repeat(ECHOED_BYTES - 1), "b".repeat(10_000));
        assert_eq!(shown(&long), format!("{}…", "a".repeat(ECHOED_BYTES - 1)), "é straddles the cut");
    }
}
