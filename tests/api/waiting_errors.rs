//! `max_wait` refused as a 4xx problem naming it, and `max_wait` on a
//! forward-auth policy.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

use crate::common::{call, check, fresh_database, instance, policy_file, send, unique, Reply};

fn assert_names_max_wait(reply: &Reply, says: &str) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.body["field"], "max_wait", "{}", reply.body);
    let detail = reply.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(says), "{detail:?} should say {says:?}");
}

fn ad_hoc(max_wait: serde_json::Value) -> serde_json::Value {
    json!({ "key": unique("errors"), "limit": 1, "window": "1s", "max_wait": max_wait })
}

#[tokio::test]
async fn a_malformed_max_wait_is_a_400_naming_it() {
    let app = instance(&fresh_database().await, &[]).await;
    assert_names_max_wait(&check(&app, ad_hoc(json!("soon"))).await, "not a duration");
    assert_names_max_wait(&check(&app, ad_hoc(json!("-1s"))).await, "not a duration");
    let number = check(&app, ad_hoc(json!(2))).await;
    assert_eq!((number.status, &number.body["field"]), (StatusCode::BAD_REQUEST, &json!("max_wait")));
}

#[tokio::test]
async fn a_max_wait_over_the_bound_its_timeouts_allow_is_a_400_naming_the_bound() {
    // 10 s requests less the longest check (20 × 250 ms) and 1 s: 4 s.
    let app = instance(&fresh_database().await, &[("PGLIMIT_REQUEST_TIMEOUT_MS", "10000")]).await;
    assert_names_max_wait(&check(&app, ad_hoc(json!("4001ms"))).await, "at most 4s");
    assert_eq!(check(&app, ad_hoc(json!("4s"))).await.status, StatusCode::OK);
    assert_eq!(app.waiting.queues().limits().max_wait, Duration::from_secs(4));
}

#[tokio::test]
async fn the_default_bound_is_24_seconds_and_zero_is_no_wait() {
    let app = instance(&fresh_database().await, &[]).await;
    assert_names_max_wait(&check(&app, ad_hoc(json!("25s"))).await, "at most 24s");
    let body = ad_hoc(json!("0s"));
    assert_eq!(check(&app, body.clone()).await.status, StatusCode::OK);
    let denied = check(&app, body).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{}", denied.body);
}

#[tokio::test]
async fn max_wait_with_a_cost_above_the_limit_is_refused_at_once_as_the_cost() {
    let app = instance(&fresh_database().await, &[]).await;
    let mut body = ad_hoc(json!("2s"));
    body["cost"] = json!(2);
    let refused = check(&app, body).await;
    assert_eq!((refused.status, &refused.body["field"]), (StatusCode::BAD_REQUEST, &json!("cost")));
}

#[tokio::test]
async fn max_wait_goes_with_check_not_reset() {
    let app = instance(&fresh_database().await, &[]).await;
    let reply = call(&app, "POST", "/reset", ad_hoc(json!("2s"))).await;
    assert_names_max_wait(&reply, "/reset");
}

const POLICIES: &str = r#"
[policies.llm]
identifiers = { account = "text" }
[[policies.llm.buckets]]
name = "account"
on = ["account"]
limit = 1
window = "1s"
algorithm = "token_bucket"
[policies.llm.forward_auth]
account = { header = "x-account" }
max_wait = "3s"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_auth_policy_with_max_wait_holds_a_request_until_admitted() {
    let file = policy_file(POLICIES);
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().expect("utf-8"))]).await;
    let ask =
        || Request::get("/auth/llm").header("x-account", "acct_42").body(Body::empty()).expect("request");
    assert_eq!(send(&app, ask()).await.status, StatusCode::OK);
    let held = send(&app, ask()).await;
    assert_eq!(held.status, StatusCode::OK, "admitted at the refill a window later: {}", held.body);
    let waited = held.body["waited_ms"].as_u64().expect("waited_ms");
    assert!(waited > 0 && waited <= 3000, "{}", held.body);
}

#[test]
fn a_malformed_forward_auth_max_wait_is_a_start_up_error_naming_it() {
    let text = POLICIES.replace("max_wait = \"3s\"", "max_wait = \"2 minutes\"");
    let error = pglimit::policy::Policies::parse(&text).expect_err("refused").to_string();
    assert!(error.contains("max_wait"), "{error}");
}
