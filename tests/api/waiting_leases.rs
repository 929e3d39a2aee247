//! `max_wait` on a concurrency bucket: a slot can be freed at any time by a
//! release, so a held check waits for one (heard by every instance through
//! the notification a release sends) rather than for the earliest lease to
//! end, and a waiter its own bucket denies never holds up those waiting for
//! a slot they share. Two instances on one database; margins are the
//! configured lease, windows and `max_wait`, never a guess at how fast
//! this machine is.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{call, check, fresh_database, instance, policy_file, unique, Reply};
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
    while app.waiting.queues().held() != count {
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

/// The attacker's own bucket refills only this long after it was spent:
/// the victims' `max_wait` ends before, so only the freed slot can admit them.
const ACCOUNT_WINDOW: Duration = Duration::from_secs(6);
const VICTIM_WAIT: Duration = Duration::from_secs(3);

/// "One export per account per window, one at a time per tenant": every
/// caller here shares the tenant's one slot.
fn per_account_and_a_shared_slot() -> String {
    format!(
        r#"
[policies.export]
identifiers = {{ account = "text", tenant = "text" }}
[[policies.export.buckets]]
name = "account"
on = ["account"]
limit = 1
window = "{}s"
[[policies.export.buckets]]
name = "slot"
on = ["tenant"]
limit = 1
algorithm = "concurrency"
lease = "{}s"
"#,
        ACCOUNT_WINDOW.as_secs(),
        LEASE.as_secs()
    )
}

fn export(account: &str, max_wait: Option<Duration>) -> Value {
    let mut body = json!({ "policy": "export", "identifiers": { "account": account, "tenant": "acme" } });
    if let Some(wait) = max_wait {
        body["max_wait"] = json!(format!("{}ms", wait.as_millis()));
    }
    body
}

/// Takes the slot for `account` on `app`: its lease.
async fn take_slot(app: &AppState, account: &str) -> String {
    let taken = check(app, export(account, None)).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.body);
    taken.body["lease"]["id"].as_str().expect("a lease").to_owned()
}

async fn release(app: &AppState, lease: &str) {
    let released = call(app, "POST", "/release", json!({ "lease": lease })).await;
    assert_eq!(released.body, json!({ "released": true }));
}

/// A and B share a database and the policy; the attacker has spent its
/// account's one export, and a holder has the tenant's slot: its lease.
async fn attacker_spent_and_slot_held() -> (AppState, AppState, String) {
    let file = policy_file(&per_account_and_a_shared_slot());
    let policies = [("PGLIMIT_POLICIES", file.to_str().expect("utf-8"))];
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &policies).await, instance(&url, &policies).await);
    let spent = take_slot(&a, "attacker").await;
    release(&a, &spent).await;
    let held = take_slot(&a, "holder").await;
    (a, b, held)
}

fn spawn_check(app: &AppState, body: Value) -> tokio::task::JoinHandle<Reply> {
    let app = app.clone();
    tokio::spawn(async move { check(&app, body).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_its_own_bucket_denies_does_not_hold_up_the_next_one_waiting_for_the_shared_slot() {
    let (a, b, held) = attacker_spent_and_slot_held().await;
    let _attacker = spawn_check(&b, export("attacker", Some(MAX_WAIT)));
    until_held(&b, 1).await;
    let victim = spawn_check(&b, export("victim", Some(VICTIM_WAIT)));
    until_held(&b, 2).await;
    release(&a, &held).await;

    let admitted = victim.await.expect("the victim");
    assert_eq!(admitted.status, StatusCode::OK, "{}", admitted.body);
    assert!(
        waited(&admitted) < VICTIM_WAIT,
        "admitted on the release, not at its deadline: {}",
        admitted.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_denied_by_its_own_bucket_on_reaching_the_front_steps_out_of_the_line() {
    let (a, b, held) = attacker_spent_and_slot_held().await;
    // The attacker arrives behind a waiter on the slot, so it queues there
    // without checking, and reaches the front when that one is admitted.
    let first = spawn_check(&b, export("first", Some(MAX_WAIT)));
    until_held(&b, 1).await;
    let _attacker = spawn_check(&b, export("attacker", Some(MAX_WAIT)));
    until_held(&b, 2).await;
    let victim = spawn_check(&b, export("victim", Some(VICTIM_WAIT)));
    until_held(&b, 3).await;
    release(&a, &held).await;
    let first = first.await.expect("the first waiter");
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    release(&a, first.body["lease"]["id"].as_str().expect("a lease")).await;

    let admitted = victim.await.expect("the victim");
    assert_eq!(admitted.status, StatusCode::OK, "{}", admitted.body);
    assert!(
        waited(&admitted) < VICTIM_WAIT,
        "admitted on the release, not at its deadline: {}",
        admitted.body
    );
}
