//! Ad hoc keys, windows and headers, against a real PostgreSQL.

use std::time::Duration;

use crate::common::{app, check, unique};
use axum::http::StatusCode;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;

#[tokio::test]
async fn an_ad_hoc_key_allows_exactly_its_limit() {
    let app = app().await;
    let key = unique("export");
    for n in 1..=10 {
        let reply = check(&app, json!({ "key": key, "limit": 10, "window": "1h" })).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        assert_eq!(reply.body["remaining"], 10 - n);
    }
    let reply = check(&app, json!({ "key": key, "limit": 10, "window": "1h" })).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.body["remaining"], 0);
}

#[tokio::test]
async fn the_window_starts_at_the_first_request_not_on_the_clock() {
    let app = app().await;
    let before = Utc::now();
    let reply = check(&app, json!({ "key": unique("w"), "limit": 5, "window": "1h" })).await;
    let after = Utc::now();
    let reset: DateTime<Utc> = reply.body["reset_at"].as_str().unwrap().parse().unwrap();
    // Decided between `before` and `after` (one host, one clock); reset_at
    // is rendered to the millisecond, rounded down.
    let hour = TimeDelta::hours(1);
    let earliest = before + hour - TimeDelta::milliseconds(1);
    assert!(earliest <= reset && reset <= after + hour, "reset {reset}, decided from {before} to {after}");
}

/// Sends `body` 8 times; returns how many were admitted, or `None` if the
/// burst did not fit in one window (the window is what is under test, so a
/// machine too slow to send 8 checks in it proves nothing either way).
async fn burst(app: &pglimit::AppState, body: &serde_json::Value) -> Option<u32> {
    let (mut admitted, mut first_reset) = (0, None);
    for _ in 0..8 {
        let reply = check(app, body.clone()).await;
        admitted += u32::from(reply.status == StatusCode::OK);
        let reset = reply.body["reset_at"].as_str().map(|s| s.parse::<DateTime<Utc>>().unwrap());
        first_reset = first_reset.or(reset);
    }
    (Utc::now() < first_reset?).then_some(admitted)
}

#[tokio::test]
async fn a_fixed_window_admits_a_burst_of_twice_the_limit_across_its_boundary() {
    // The documented weakness of the fixed window (reference, "Demo 2"):
    // a full window just before the reset and another just after.
    let app = app().await;
    for _ in 0..5 {
        let body = json!({ "key": unique("burst"), "limit": 5, "window": "2s" });
        let Some(before) = burst(&app, &body).await else { continue };
        assert_eq!(before, 5, "one window admits its limit");
        let peek = check(&app, json!({ "key": body["key"], "limit": 5, "window": "2s", "cost": 0 })).await;
        let reset: DateTime<Utc> = peek.body["reset_at"].as_str().unwrap().parse().unwrap();
        let wait = (reset - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(50);
        tokio::time::sleep(wait).await;
        let Some(after) = burst(&app, &body).await else { continue };
        assert_eq!(before + after, 10, "5 before the boundary and 5 right after it");
        return;
    }
    panic!("in 5 tries, 8 checks never fitted in a 2 s window");
}

#[tokio::test]
async fn allowed_responses_carry_the_ratelimit_headers() {
    let app = app().await;
    let reply = check(&app, json!({ "key": unique("h"), "limit": 10, "window": "60s", "cost": 3 })).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("ratelimit-policy"), "\"default\";q=10;w=60");
    let state = reply.header("ratelimit");
    assert!(state == "\"default\";r=7;t=60" || state == "\"default\";r=7;t=59", "{state}");
    assert_eq!(reply.header("cache-control"), "no-store");
    assert_eq!(reply.header("content-type"), "application/json");
    assert_eq!(reply.header("retry-after"), "");
    assert!(reply.body["retry_after_s"].is_null());
}

#[tokio::test]
async fn denied_responses_carry_retry_after_of_at_least_one_second() {
    let app = app().await;
    let body = json!({ "key": unique("r"), "limit": 1, "window": "500ms" });
    check(&app, body.clone()).await;
    let reply = check(&app, body).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), "1", "500ms rounds up to 1, never 0");
    assert_eq!(reply.body["retry_after_s"], 1);
    assert_eq!(reply.header("cache-control"), "no-store");
    assert_eq!(reply.header("ratelimit-policy"), "\"default\";q=1;w=1");
}

#[tokio::test]
async fn policy_headers_list_one_item_per_bucket() {
    let app = app().await;
    let reply = check(&app, crate::common::login("erin@example.com", "203.0.113.20")).await;
    assert_eq!(
        reply.header("ratelimit-policy"),
        "\"email_ip\";q=5;w=60, \"ip\";q=20;w=60, \"email\";q=50;w=900"
    );
    let state = reply.header("ratelimit");
    assert!(state.starts_with("\"email_ip\";r=4;t="), "{state}");
    assert!(state.contains(", \"ip\";r=19;t=") && state.contains(", \"email\";r=49;t="), "{state}");
}

#[tokio::test]
async fn instances_with_different_secrets_keep_separate_counters() {
    let url = crate::common::fresh_database().await;
    let a = crate::common::instance(&url, &[]).await;
    let b = crate::common::instance(
        &url,
        &[("PGLIMIT_KEY_SECRET", "another-secret-another-secret-another-secret")],
    )
    .await;
    let body = json!({ "key": "shared", "limit": 1, "window": "1h" });
    assert_eq!(check(&a, body.clone()).await.status, StatusCode::OK);
    assert_eq!(check(&b, body.clone()).await.status, StatusCode::OK, "keys differ when secrets differ");
    assert_eq!(check(&a, body).await.status, StatusCode::TOO_MANY_REQUESTS);
}
