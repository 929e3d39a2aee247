//! The memory fallback: Postgres really stopped and paused, not mocked.
//!
//! This binary starts a cluster of its own, because it stops it.

mod common;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::stoppable::{database, restart, stop, Paused, SERIAL};
use common::{check, degraded, instance, remaining, unique, wait_for_postgres};
use pglimit::pg_cluster::StopMode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_fall_back_to_memory_while_postgres_is_stopped_and_return_after() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let app = instance(&url, &[]).await;
    let key = unique("k");
    let body = json!({ "key": key, "limit": 3, "window": "1h" });
    assert_eq!(check(&app, body.clone()).await.body["store"], "postgres");
    assert_eq!(check(&app, body.clone()).await.body["store"], "postgres");

    stop(StopMode::Fast).await;
    // Memory starts from zero: the fallback is per instance, not a copy.
    for n in 1..=3 {
        let reply = check(&app, body.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "memory admits {n} of 3");
        assert_eq!(reply.body["store"], "memory");
        assert_eq!(reply.body["degraded"], true);
    }
    let reply = check(&app, body.clone()).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "memory enforces the same limit");
    assert_eq!(reply.body["store"], "memory");

    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    let reply = check(&app, body).await;
    assert_eq!(
        (reply.body["store"].as_str(), reply.body["degraded"].as_bool()),
        (Some("postgres"), Some(false))
    );
    // Postgres had counted 2 of 3 before the outage, and memory's 3 were
    // written back: the window is full, not refilled.
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_postgres_is_detected_by_timeout_and_checks_stay_fast() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let app = instance(&url, &[("PGLIMIT_DB_TIMEOUT_MS", "200")]).await;
    check(&app, json!({ "key": unique("warm"), "limit": 5, "window": "1m" })).await;

    let paused = Paused::start();
    let reply = check(&app, json!({ "key": unique("p"), "limit": 5, "window": "1m" })).await;
    reply.assert_memory_admits(); // the first check waits out the timeout
    assert!(degraded(&app).await, "and trips the instance");
    // The rest go straight to memory instead of each waiting 200 ms: 50 of
    // them finish well inside what 50 timeouts would take, and none waits
    // anywhere near a second. (Bounds on a behaviour, not a speed: the
    // margins are 5x on a loaded machine.)
    let started = Instant::now();
    for _ in 0..50 {
        let one = Instant::now();
        let reply = check(&app, json!({ "key": unique("p"), "limit": 5, "window": "1m" })).await;
        let took = one.elapsed();
        reply.assert_memory_admits();
        assert!(took < Duration::from_secs(1), "a degraded check took {took:?}");
    }
    let elapsed = started.elapsed();
    drop(paused);
    assert!(elapsed < Duration::from_secs(2), "50 degraded checks took {elapsed:?}");
    // Resumed, the instance answers from Postgres again.
    wait_for_postgres(&app, Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_choose_memory_allow_or_deny_when_postgres_is_away_and_shadow_never_refuses() {
    let _serial = SERIAL.lock().await;
    let file = common::policy_file(
        r#"
        [policies.open]
        on_store_error = "allow"
        identifiers = { user = "text" }
        [[policies.open.buckets]]
        name = "user"
        on = ["user"]
        limit = 1
        window = "1h"

        [policies.closed]
        on_store_error = "deny"
        identifiers = { user = "text" }
        [[policies.closed.buckets]]
        name = "user"
        on = ["user"]
        limit = 1
        window = "1h"

        [policies.watched]
        on_store_error = "deny"
        mode = "shadow"
        identifiers = { user = "text" }
        [[policies.watched.buckets]]
        name = "user"
        on = ["user"]
        limit = 1
        window = "1h"
        "#,
    );
    let url = database().await;
    let app = instance(&url, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let open = json!({ "policy": "open", "identifiers": { "user": "u1" } });
    let closed = json!({ "policy": "closed", "identifiers": { "user": "u1" } });
    assert_eq!(check(&app, closed.clone()).await.status, StatusCode::OK);

    stop(StopMode::Immediate).await;
    for _ in 0..3 {
        // Limit 1, yet admitted each time with all of it remaining: not
        // counted, in memory or anywhere.
        let reply = check(&app, open.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "fail open admits, uncounted: {}", reply.body);
        assert_eq!(reply.body["store"], "none");
        assert_eq!(reply.body["degraded"], true);
        assert_eq!(remaining(&reply.body, "user"), 1, "{}", reply.body);
        let reply = check(&app, closed.clone()).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "fail closed never admits");
        assert_eq!(reply.header("content-type"), "application/problem+json");
        // An RFC 9457 problem document that says the same as the status line.
        assert_eq!(reply.body["status"], 503, "{}", reply.body);
        assert_eq!(reply.body["type"], "urn:pglimit:problem:store-unavailable", "{}", reply.body);
        assert!(reply.body["title"].as_str().is_some_and(|t| !t.is_empty()), "{}", reply.body);
        // In shadow, even a fail-closed policy never turns traffic away.
        let reply = check(&app, json!({ "policy": "watched", "identifiers": { "user": "u1" } })).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(
            (reply.body["shadow"].as_bool(), reply.body["store"].as_str()),
            (Some(true), Some("none"))
        );
    }
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    assert_eq!(
        check(&app, closed).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the count from before holds"
    );
    // Postgres counted none of the open answers: its first check now is
    // admitted with nothing left, and the next one is denied.
    let reply = check(&app, open.clone()).await;
    assert_eq!((reply.status, reply.body["store"].as_str()), (StatusCode::OK, Some("postgres")));
    assert_eq!(remaining(&reply.body, "user"), 0, "{}", reply.body);
    assert_eq!(check(&app, open).await.status, StatusCode::TOO_MANY_REQUESTS);
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_is_enforced_from_memory_during_an_outage() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let app = instance(&url, &[]).await;
    stop(StopMode::Fast).await;
    for algorithm in ["fixed_window", "sliding_window", "sliding_log", "token_bucket"] {
        let body = json!({ "key": unique(algorithm), "limit": 4, "window": "1h", "algorithm": algorithm });
        // The first 4 admitted, the other 6 denied: nothing refills within
        // a second of a one-hour window.
        for n in 1..=10 {
            let reply = check(&app, body.clone()).await;
            let expected = if n <= 4 { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
            assert_eq!(reply.status, expected, "{algorithm}, check {n}: {}", reply.body);
            assert_eq!(
                (reply.body["store"].as_str(), reply.body["degraded"].as_bool()),
                (Some("memory"), Some(true)),
                "{algorithm}, check {n}"
            );
        }
    }
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_are_refused_with_503_while_postgres_is_away_and_leave_no_audit_row() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let app = instance(&url, &[]).await;
    stop(StopMode::Fast).await;
    check(&app, json!({ "key": unique("trip"), "limit": 5, "window": "1m" })).await.assert_memory_admits();
    let login = json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "192.0.2.1" } });
    let block = json!({ "policy": "login", "identifiers": { "ip": "192.0.2.1" }, "for": "1m" });
    for (method, path, body) in [
        ("POST", "/reset", login),
        ("POST", "/admin/blocks", block.clone()),
        ("DELETE", "/admin/blocks", block),
        ("GET", "/admin/blocks", serde_json::Value::Null),
        ("GET", "/admin/audit", serde_json::Value::Null),
    ] {
        let reply = common::call(&app, method, path, body).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{method} {path}: {}", reply.body);
        assert_eq!(reply.body["type"], "urn:pglimit:problem:store-unavailable");
        assert_eq!(reply.header("retry-after"), "1");
    }
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    let audited = common::call(&app, "GET", "/admin/audit", serde_json::Value::Null).await;
    let actions: Vec<&str> = audited.body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(actions, ["started"], "the refused acts left no row");
}

/// Overrides set through the API are held in memory: while Postgres is
/// stopped they still apply, and changing them is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_overrides_keep_applying_while_postgres_is_stopped_and_changes_are_refused() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let app = instance(&url, &[]).await;
    let email = format!("{}@example.com", unique("vip"));
    let set = json!({ "policy": "login", "when": { "email": email }, "limits": { "email_ip": 8 } });
    let added = common::call(&app, "POST", "/admin/overrides", set.clone()).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);

    stop(StopMode::Fast).await;
    let login = common::login(&email, "203.0.113.10");
    let mut admitted = 0;
    for _ in 0..10 {
        let reply = check(&app, login.clone()).await;
        assert_eq!(
            (reply.body["store"].as_str(), &reply.body["override"]["id"]),
            (Some("memory"), &added.body["id"])
        );
        admitted += usize::from(reply.status == StatusCode::OK);
    }
    assert_eq!(admitted, 8, "the override's limit, from memory");
    let refused = common::call(&app, "POST", "/admin/overrides", set).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.body);

    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
}

/// Explain during an outage: read from this instance's memory, saying so,
/// at the share of each limit memory enforces; blocks cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_from_memory_during_an_outage_and_says_so() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let app = instance(&url, &[]).await;
    let body = json!({ "key": unique("explained"), "limit": 4, "window": "1h" });
    stop(StopMode::Fast).await;
    for _ in 0..2 {
        check(&app, body.clone()).await.assert_memory_admits();
    }
    let told = common::call(&app, "POST", "/admin/explain", body.clone()).await;
    assert_eq!(told.status, StatusCode::OK, "{}", told.body);
    assert_eq!((told.body["store"].as_str(), told.body["degraded"].as_bool()), (Some("memory"), Some(true)));
    let why = told.body["why"].as_str().unwrap_or_default();
    assert!(why.starts_with("From this instance's memory"), "{why}");
    let bucket = &told.body["buckets"][0];
    assert_eq!(
        (bucket["remaining"].as_u64(), bucket["state"]["count"].as_u64()),
        (Some(2), Some(2)),
        "{bucket}"
    );
    assert_eq!(told.body["allowed"], true);
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
}
