//! Ad hoc keys, windows and headers, against a real PostgreSQL.

use std::time::Duration;

use crate::common::{app, check, unique};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
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
    let reset: DateTime<Utc> = reply.body["reset_at"].as_str().unwrap().parse().unwrap();
    let offset = reset - before;
    assert!(
        offset > chrono::TimeDelta::milliseconds(3_599_000)
            && offset < chrono::TimeDelta::milliseconds(3_601_000),
        "reset {offset} after the first request"
    );
}

#[tokio::test]
async fn a_fixed_window_admits_a_burst_of_twice_the_limit_across_its_boundary() {
    // The documented weakness of the fixed window (reference, "Demo 2"):
    // a full window just before the reset and another just after.
    let app = app().await;
    let key = unique("burst");
    let body = json!({ "key": key, "limit": 5, "window": "1s" });
    let mut admitted = 0;
    let mut reset_at = None;
    for _ in 0..8 {
        let reply = check(&app, body.clone()).await;
        if reply.status == StatusCode::OK {
            admitted += 1;
        }
        reset_at = reply.body["reset_at"].as_str().map(|s| s.parse::<DateTime<Utc>>().unwrap());
    }
    assert_eq!(admitted, 5);
    let wait = (reset_at.unwrap() - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(50);
    tokio::time::sleep(wait).await;
    for _ in 0..8 {
        if check(&app, body.clone()).await.status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10, "5 before the boundary and 5 right after it");
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
