//! `max_wait` on a concurrency bucket: a slot can be freed at any time by a
//! release, so a held check waits for one (heard by every instance through
//! the notification a release sends) rather than for the earliest lease to
//! end. Two instances on one database; margins are the configured lease
//! and `max_wait`, never a guess at how fast this machine is.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{call, check, fresh_database, instance, unique, Reply};
use pglimit::AppState;

/// Far longer than any wait here: a slot frees only by being released.
const LEASE: Duration = Duration::from_secs(60);
const MAX_WAIT: Duration = Duration::from_secs(10);

fn slot(key: &str, max_wait: Option<Duration>) -> Value {
    let mut body = json!({ "key": key, "limit": 1, "algorithm": "concurrency", "lease": format!("{}s", LEASE.as_secs()) });
    if let Some(wait) = max_wait {
        body["max_wait"] = json!(format!("{}ms", wait.as_millis()));
    }
    body
}

fn waited(reply: &Reply) -> Duration {
    let ms = reply.body["waited_ms"].as_u64().unwrap_or_else(|| panic!("no waited_ms in {}", reply.body));
    Duration::from_millis(ms)
}

async fn until_held(app: &AppState, count: usize) {
    while app.limiter.waiters().held() != count {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A and B share a database; A holds the only slot of a new key.
async fn one_slot_taken_on_a() -> (AppState, AppState, String, String) {
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &[]).await, instance(&url, &[]).await);
    let key = unique("export");
    let taken = check(&a, slot(&key, None)).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.body);
    let lease = taken.body["lease"]["id"].as_str().expect("a lease").to_owned();
    (a, b, key, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_waiting_for_a_slot_is_admitted_when_another_instance_releases_it() {
    let (a, b, key, lease) = one_slot_taken_on_a().await;
    let waiting = tokio::spawn({
        let (b, body) = (b.clone(), slot(&key, Some(MAX_WAIT)));
        async move { check(&b, body).await }
    });
    until_held(&b, 1).await;
    let released = call(&a, "POST", "/release", json!({ "lease": lease })).await;
    assert_eq!(released.body, json!({ "released": true }));

    let admitted = waiting.await.expect("the held check");
    assert_eq!(admitted.status, StatusCode::OK, "{}", admitted.body);
    assert!(admitted.body["lease"]["id"].is_string(), "the slot comes with a lease: {}", admitted.body);
    assert!(waited(&admitted) < MAX_WAIT, "woken by the release, not the deadline: {}", admitted.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_waiting_for_a_slot_nobody_releases_answers_429_at_its_deadline() {
    let (_a, b, key, _lease) = one_slot_taken_on_a().await;
    let max_wait = Duration::from_secs(1);
    let refused = check(&b, slot(&key, Some(max_wait))).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert!(waited(&refused) >= max_wait, "held to its deadline: {}", refused.body);
}
