//! The one place that renders rate-limit response headers.
//!
//! `RateLimit-Policy` and `RateLimit` follow draft-ietf-httpapi-ratelimit-headers-11:
//! one list item per bucket, `"name";q=<limit>;w=<window s>` and
//! `"name";r=<remaining>;t=<seconds to reset>`. The draft is still moving,
//! which is why nothing else in the code knows this syntax. Bucket names are
//! restricted to `[A-Za-z0-9_-]` (see `policy::is_valid_name`), so they never
//! need escaping inside the quoted string.

use std::fmt::Write;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

use crate::limiter::{seconds_until, Decision};

pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

pub fn rate_limit_headers(decision: &Decision) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(4);
    insert_rate_limit_headers(decision, &mut headers);
    headers
}

/// Adds the headers to `headers`: a response's own map, so that they are
/// not rendered into a map of their own and then copied over.
pub fn insert_rate_limit_headers(decision: &Decision, headers: &mut HeaderMap) {
    let room = 32 * decision.buckets.len();
    let (mut policy, mut state) = (String::with_capacity(room), String::with_capacity(room));
    for (i, b) in decision.buckets.iter().enumerate() {
        let comma = if i == 0 { "" } else { ", " };
        let window_s = b.window.as_millis().div_ceil(1000).max(1);
        // Writing to a String cannot fail.
        let _ = write!(policy, "{comma}\"{}\";q={};w={}", b.name, b.limit, window_s);
        let reset_s = seconds_until(decision.now, b.reset_at);
        let _ = write!(state, "{comma}\"{}\";r={};t={}", b.name, b.remaining, reset_s);
    }
    insert(headers, RATELIMIT_POLICY.clone(), policy);
    insert(headers, RATELIMIT.clone(), state);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(retry) = decision.retry_after_s {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(retry.max(1)));
    }
}

fn insert(headers: &mut HeaderMap, name: HeaderName, value: String) {
    // Names are validated at load time, so this never drops a header in practice.
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(name, value);
    }
}
