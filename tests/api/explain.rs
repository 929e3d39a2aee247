//! `POST /admin/explain`: what `/check` would answer now and why, for every
//! algorithm and every rule that can decide (a bucket, an override, an
//! allow or deny list, a block, a lockout), counting nothing. The outage
//! case is in `tests/fallback.rs`, Citus' in `tests/citus/`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use crate::common::db::stored_count;
use crate::common::{call, check, fresh_database, instance, login, policy_file, unique, Reply};

const ALGORITHMS: [&str; 5] =
    ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency"];

async fn explain(app: &pglimit::AppState, body: &Value) -> Reply {
    call(app, "POST", "/admin/explain", body.clone()).await
}

/// What each algorithm's state says of `taken` units held, in its own terms.
fn assert_state(algorithm: &str, state: &Value, taken: u64) {
    if taken == 0 {
        assert_eq!(state, &Value::Null, "{algorithm}: nothing stored is a full bucket");
        return;
    }
    let held = match algorithm {
        "fixed_window" | "sliding_window" => state["count"].as_u64(),
        "sliding_log" => state["entries"].as_array().map(|e| e.len() as u64),
        "concurrency" => state["slots_held"].as_u64(),
        _ => state["theoretical_arrival_time"].as_str().map(|_| taken),
    };
    assert_eq!(held, Some(taken), "{algorithm}: {state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_foretells_every_algorithms_answer_and_counts_nothing() {
    let (url, key_of) = (fresh_database().await, |a: &str| unique(a));
    let app = instance(&url, &[]).await;
    for algorithm in ALGORITHMS {
        let key = key_of(algorithm);
        let mut body = json!({ "key": key, "limit": 3, "window": "1h", "algorithm": algorithm });
        if algorithm == "concurrency" {
            body = json!({ "key": key, "limit": 3, "lease": "1h", "algorithm": algorithm });
        }
        for taken in 0..5u64 {
            // Asked twice: an explanation changes nothing that the next one sees.
            let first = explain(&app, &body).await;
            let told = explain(&app, &body).await;
            assert_eq!(told.status, StatusCode::OK, "{}", told.body);
            let figures = |r: &Reply| {
                (r.body["buckets"][0]["state"].clone(), r.body["buckets"][0]["remaining"].clone())
            };
            assert_eq!(figures(&first), figures(&told), "{algorithm}");
            let bucket = &told.body["buckets"][0];
            assert_eq!(
                bucket["remaining"].as_u64(),
                Some(3u64.saturating_sub(taken)),
                "{algorithm}: {bucket}"
            );
            assert_state(algorithm, &bucket["state"], taken.min(3));
            let checked = check(&app, body.clone()).await;
            let allowed = told.body["allowed"].as_bool();
            assert_eq!(
                allowed,
                Some(checked.status == StatusCode::OK),
                "{algorithm}, {taken} taken: {}",
                told.body
            );
            let reason = if taken < 3 { "allowed" } else { "denied" };
            assert_eq!(told.body["reason"], reason, "{algorithm}: {}", told.body);
            assert_eq!(bucket["retry_after_s"].is_u64(), taken >= 3, "{algorithm}: {bucket}");
        }
        if algorithm == "fixed_window" {
            assert_eq!(stored_count(&url, &key).await, 3, "only the checks counted");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_key_by_a_prefix_and_never_the_identifiers() {
    let app = instance(&fresh_database().await, &[]).await;
    let told = explain(&app, &login("alice@example.com", "203.0.113.5")).await;
    assert_eq!(told.status, StatusCode::OK, "{}", told.body);
    assert_eq!(told.body["policy"], "login");
    let names: Vec<&str> =
        told.body["buckets"].as_array().unwrap().iter().filter_map(|b| b["name"].as_str()).collect();
    assert_eq!(names, ["email_ip", "ip", "email"]);
    for bucket in told.body["buckets"].as_array().unwrap() {
        let key = bucket["key"].as_str().unwrap_or_default();
        assert!(key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{bucket}");
    }
    let text = told.body.to_string();
    assert!(!text.contains("alice") && !text.contains("203.0.113.5"), "{text}");
}

fn override_policy() -> std::path::PathBuf {
    policy_file(
        r#"[policies.api]
identifiers = { email = "email", ip = "ip" }
mode = "enforce"
[[policies.api.buckets]]
name = "email"
on = ["email"]
limit = 2
window = "1h"
[[policies.api.buckets]]
name = "ip"
on = ["ip"]
limit = 50
window = "1h"
block_for = "10m"
[[policies.api.overrides]]
when = { email = "*@partner.example" }
limits = { email = 6 }
[[policies.api.overrides]]
when = { ip = "10.0.0.0/8" }
unlimited = true
[[policies.api.overrides]]
when = { ip = "203.0.113.66" }
deny = true
[policies.trial]
identifiers = { email = "email" }
mode = "shadow"
[[policies.trial.buckets]]
name = "email"
on = ["email"]
limit = 1
window = "1h"
"#,
    )
}

fn api(email: &str, ip: &str) -> Value {
    json!({ "policy": "api", "identifiers": { "email": email, "ip": ip } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_override_allow_list_or_deny_list_that_applies() {
    let file = override_policy();
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let partner = explain(&app, &api("b@partner.example", "192.0.2.1")).await;
    assert_eq!(partner.body["rule"], json!({ "by": "file_override", "index": 0, "action": "limits" }));
    assert_eq!(partner.body["buckets"][0]["limit"], 6, "{}", partner.body);
    assert_eq!(partner.body["reason"], "allowed");

    let internal = explain(&app, &api("c@example.com", "10.1.2.3")).await;
    assert_eq!(
        (internal.body["reason"].as_str(), internal.body["allowed"].as_bool()),
        (Some("allow_listed"), Some(true))
    );
    assert_eq!(internal.body["rule"]["index"], 1);

    let refused = explain(&app, &api("d@example.com", "203.0.113.66")).await;
    assert_eq!(
        (refused.body["reason"].as_str(), refused.body["allowed"].as_bool()),
        (Some("deny_listed"), Some(false))
    );
    assert!(refused.body["why"].as_str().unwrap_or_default().contains("override #2"), "{}", refused.body);
    assert_eq!(check(&app, api("d@example.com", "203.0.113.66")).await.status, StatusCode::TOO_MANY_REQUESTS);

    let set = json!({ "policy": "api", "when": { "email": "vip@example.com" }, "limits": { "email": 9 } });
    let added = call(&app, "POST", "/admin/overrides", set).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    let vip = explain(&app, &api("vip@example.com", "192.0.2.1")).await;
    assert_eq!(vip.body["rule"], json!({ "by": "api_override", "id": added.body["id"], "action": "limits" }));
    assert_eq!(vip.body["buckets"][0]["limit"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_a_block_with_its_reason_and_end_until_it_is_lifted() {
    let app = instance(&fresh_database().await, &[]).await;
    let alice = login("alice@example.com", "198.51.100.7");
    let target = json!({ "policy": "login", "identifiers": { "email": "alice@example.com" }, "for": "15m", "reason": "ticket 42" });
    assert_eq!(call(&app, "POST", "/admin/blocks", target.clone()).await.status, StatusCode::OK);
    let told = explain(&app, &alice).await;
    assert_eq!(
        (told.body["reason"].as_str(), told.body["allowed"].as_bool()),
        (Some("blocked"), Some(false))
    );
    let email = &told.body["buckets"][2];
    assert_eq!(
        (email["block"]["kind"].as_str(), email["block"]["reason"].as_str()),
        (Some("admin"), Some("ticket 42"))
    );
    assert!((800..=900).contains(&email["retry_after_s"].as_u64().unwrap_or(0)), "{email}");
    assert!(told.body["why"].as_str().unwrap_or_default().contains("ticket 42"), "{}", told.body);
    assert_eq!(told.body["buckets"][0]["block"], Value::Null, "only the email bucket is blocked");

    assert_eq!(call(&app, "DELETE", "/admin/blocks", target).await.status, StatusCode::OK);
    let lifted = explain(&app, &alice).await;
    assert_eq!(lifted.body["reason"], "allowed", "{}", lifted.body);
    assert_eq!(check(&app, alice).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_a_lockout_and_the_denial_this_instance_remembers() {
    let file = override_policy();
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let body = api("e@example.com", "192.0.2.77");
    for _ in 0..2 {
        assert_eq!(check(&app, body.clone()).await.status, StatusCode::OK);
    }
    // The email bucket denies; the ip bucket has no lockout of its own yet.
    assert_eq!(check(&app, body.clone()).await.status, StatusCode::TOO_MANY_REQUESTS);
    let told = explain(&app, &body).await;
    assert_eq!(told.body["reason"], "denied", "{}", told.body);
    assert!(told.body["remembered_denial_until"].is_string(), "the deny cache holds it: {}", told.body);

    for n in 0..50 {
        let email = format!("u{n}@example.com");
        check(&app, api(&email, "192.0.2.88")).await;
    }
    let locked = api("new@example.com", "192.0.2.88");
    assert_eq!(
        check(&app, locked.clone()).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the ip bucket denies"
    );
    let told = explain(&app, &locked).await;
    assert_eq!(told.body["reason"], "blocked", "{}", told.body);
    assert_eq!(told.body["buckets"][1]["block"]["kind"], "lockout", "{}", told.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_of_a_shadow_policy_says_what_enforcing_would_answer() {
    let file = override_policy();
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let body = json!({ "policy": "trial", "identifiers": { "email": "s@example.com" } });
    check(&app, body.clone()).await;
    let told = explain(&app, &body).await;
    assert_eq!(
        (told.body["allowed"].as_bool(), told.body["shadow"].as_bool(), told.body["would_allow"].as_bool()),
        (Some(true), Some(true), Some(false)),
        "{}",
        told.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_counts_this_instances_waiters_on_each_key() {
    let app = instance(&fresh_database().await, &[]).await;
    let body = json!({ "key": unique("held"), "limit": 1, "lease": "1h", "algorithm": "concurrency" });
    let taken = check(&app, body.clone()).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.body);
    let mut held = body.clone();
    held["max_wait"] = json!("20s");
    let waiter = tokio::spawn({
        let app = app.clone();
        async move { check(&app, held).await }
    });
    // Within the wait it asked for: it is held until the slot is released.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut waiters = 0;
    while waiters == 0 && tokio::time::Instant::now() < deadline {
        waiters = explain(&app, &body).await.body["buckets"][0]["waiters"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(waiters, 1, "the held check is seen while it waits");
    let released = call(&app, "POST", "/release", json!({ "lease": taken.body["lease"]["id"] })).await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert_eq!(waiter.await.expect("joins").status, StatusCode::OK, "the release admits it");
    assert_eq!(explain(&app, &body).await.body["buckets"][0]["waiters"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_refuses_a_wrong_token_an_unknown_policy_and_a_malformed_identity() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_ADMIN_TOKENS", "right-admin-token")]).await;
    let request = |token: &str| {
        let builder = Request::post("/admin/explain").header("content-type", "application/json");
        let builder = builder.header("authorization", format!("Bearer {token}"));
        builder.body(Body::from(login("a@example.com", "192.0.2.1").to_string())).expect("request")
    };
    assert_eq!(crate::common::send(&app, request("wrong")).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(crate::common::send(&app, request("right-admin-token")).await.status, StatusCode::OK);

    let open = instance(&url, &[]).await;
    for (body, field) in [
        (json!({ "policy": "nope", "identifiers": {} }), "policy"),
        (
            json!({ "policy": "login", "identifiers": { "email": "not an email", "ip": "192.0.2.1" } }),
            "identifiers.email",
        ),
        (
            json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "300.1.1.1" } }),
            "identifiers.ip",
        ),
        (json!({ "key": "k", "limit": 1, "window": "1m", "max_wait": "999d" }), "max_wait"),
    ] {
        let refused = explain(&open, &body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
        assert!(refused.body.to_string().contains(field), "{field}: {}", refused.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_how_often_each_key_is_in_the_top_list() {
    let app = instance(&fresh_database().await, &[]).await;
    let body = json!({ "key": unique("denied"), "limit": 1, "window": "1h" });
    assert_eq!(check(&app, body.clone()).await.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(check(&app, body.clone()).await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let told = explain(&app, &body).await;
    let denials = &told.body["buckets"][0]["denials"];
    assert_eq!(denials["count"], 3, "{}", told.body);
    assert!(denials["last"].is_string() && denials["since"].is_string(), "{denials}");
    let fresh = explain(&app, &json!({ "key": unique("never"), "limit": 1, "window": "1h" })).await;
    assert_eq!(fresh.body["buckets"][0]["denials"]["count"], 0, "{}", fresh.body);

    let off = instance(&fresh_database().await, &[("PGLIMIT_TOP", "off")]).await;
    assert_eq!(explain(&off, &body).await.body["buckets"][0]["denials"], Value::Null, "the list is off");
}
