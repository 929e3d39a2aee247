//! Overrides set through the API (`/admin/overrides`), with two instances
//! on one database: set or removed through one, applied by the other
//! within the bound; tried before the policy file's, but never lifting a
//! deny; ended by `until`;
//! listed with exact values only as hashes.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use pglimit::storage::OVERRIDES_POLL_EVERY;
use serde_json::{json, Value};

use crate::common::{call, check, fresh_database, instance, policy_file};

/// A change is applied everywhere within this: a notification is heard at
/// once, and without one (behind a transaction pooler) the next poll,
/// every `OVERRIDES_POLL_EVERY`, finds it. Twice the poll is the 1 s promised.
fn bound() -> Duration {
    OVERRIDES_POLL_EVERY * 2
}

pub const PLANS: &str = r#"
[policies.api]
identifiers = { account = "text", email = "email", ip = "ip" }
[[policies.api.buckets]]
name = "monthly"
on = ["account"]
limit = 3
window = "30d"
[[policies.api.overrides]]
when = { ip = "10.0.0.0/8" }
deny = true
"#;

/// Two instances on one fresh database, with [`PLANS`].
async fn two_instances() -> (pglimit::AppState, pglimit::AppState) {
    let file = policy_file(PLANS);
    let vars = [("PGLIMIT_POLICIES", file.to_str().unwrap())];
    let url = fresh_database().await;
    (instance(&url, &vars).await, instance(&url, &vars).await)
}

pub fn request(account: &str, ip: &str) -> Value {
    json!({ "policy": "api", "identifiers": { "account": account, "email": "x@example.com", "ip": ip } })
}

/// A peek: the answer (limit, override) without counting.
async fn peek(app: &pglimit::AppState, account: &str) -> Value {
    let mut body = request(account, "192.0.2.1");
    body["cost"] = json!(0);
    check(app, body).await.body
}

/// Peeks at `account` on `app` until `done` holds; how long that took.
async fn until_seen(app: &pglimit::AppState, account: &str, done: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let body = peek(app, account).await;
        if done(&body) {
            return started.elapsed();
        }
        assert!(started.elapsed() < bound() * 10, "never applied: {body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn add(app: &pglimit::AppState, body: Value) -> String {
    let reply = call(app, "POST", "/admin/overrides", body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    reply.body["id"].as_str().expect("an id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_on_one_instance_changes_the_others_answer_within_a_second_and_so_does_its_removal() {
    let (a, b) = two_instances().await;
    assert_eq!(peek(&b, "acct_42").await["limit"], 3, "the policy's limit");
    let plan = json!({ "policy": "api", "when": { "account": "acct_42" }, "limits": { "monthly": 100000 },
                       "until": "2099-06-01T00:00:00Z", "note": "enterprise plan" });
    let id = add(&a, plan).await;
    assert!(id.starts_with("ovr_"), "{id}");
    assert_eq!(peek(&a, "acct_42").await["override"], json!({ "id": id, "action": "limits" }), "A at once");

    let took = until_seen(&b, "acct_42", |body| body["limit"] == 100000).await;
    assert!(took < bound(), "B applied it after {took:?}");
    assert_eq!(peek(&b, "acct_42").await["override"]["id"], json!(id));
    assert_eq!(peek(&b, "acct_43").await["limit"], 3, "another account keeps the policy's limit");

    let removed = call(&a, "DELETE", &format!("/admin/overrides/{id}"), Value::Null).await;
    assert_eq!((removed.status, &removed.body["removed"]), (StatusCode::OK, &json!(id)));
    let took = until_seen(&b, "acct_42", |body| body["limit"] == 3).await;
    assert!(took < bound(), "B dropped it after {took:?}");
    assert_eq!(peek(&b, "acct_42").await.get("override"), None);
}

/// The review's first case: an account allowed or given limits through the
/// API could lift the file's deny list for itself. A deny wins over both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_files_deny_holds_against_an_api_override_that_would_lift_it() {
    let (a, b) = two_instances().await;
    let internal = request("acct_7", "10.1.2.3");
    let refused = check(&b, internal.clone()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "the file's deny list");
    assert_eq!(refused.body["override"], json!({ "index": 0, "action": "deny" }));

    let allowed =
        add(&a, json!({ "policy": "api", "when": { "account": "acct_7" }, "unlimited": true })).await;
    let limits = json!({ "policy": "api", "when": { "account": "acct_8" }, "limits": { "monthly": 100 } });
    let raised = add(&a, limits).await;
    until_seen(&b, "acct_8", |body| body["override"]["id"] == json!(raised)).await;
    assert_eq!(peek(&b, "acct_7").await["override"]["id"], json!(allowed), "applies outside the range");
    for account in ["acct_7", "acct_8"] {
        let denied = check(&b, request(account, "10.1.2.3")).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{}", denied.body);
        assert_eq!(denied.body["override"], json!({ "index": 0, "action": "deny" }));
    }
}

/// The review's second case: a newer `unlimited` on a whole domain lifted
/// an older deny of one address in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_deny_holds_against_a_newer_api_override_that_would_lift_it() {
    let (a, b) = two_instances().await;
    let deny = json!({ "policy": "api", "when": { "account": "acct_3" }, "deny": true });
    let denied = add(&a, deny).await;
    let partner = json!({ "policy": "api", "when": { "email": "*@example.com" }, "unlimited": true });
    let partner = add(&a, partner).await;
    until_seen(&b, "acct_4", |body| body["override"]["id"] == json!(partner)).await;
    let reply = check(&b, request("acct_3", "192.0.2.1")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    assert_eq!(reply.body["override"], json!({ "id": denied, "action": "deny" }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_matching_api_override_applies() {
    let (a, _) = two_instances().await;
    let domain =
        add(&a, json!({ "policy": "api", "when": { "email": "*@example.com" }, "limits": { "monthly": 7 } }));
    let domain = domain.await;
    assert_eq!(peek(&a, "acct_1").await["override"]["id"], json!(domain));
    let exact =
        add(&a, json!({ "policy": "api", "when": { "account": "acct_1" }, "limits": { "monthly": 9 } }));
    let exact = exact.await;
    assert_eq!(peek(&a, "acct_1").await["override"]["id"], json!(exact));
    assert_eq!(peek(&a, "acct_2").await["override"]["id"], json!(domain));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_stops_applying_at_its_until_by_itself() {
    let (a, b) = two_instances().await;
    let lasts = Duration::from_secs(2);
    let until = chrono::Utc::now() + lasts;
    let until_text = until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let body = json!({ "policy": "api", "when": { "account": "acct_9" }, "deny": true, "until": until_text });
    let id = add(&a, body).await;
    until_seen(&b, "acct_9", |body| body["override"]["id"] == json!(id)).await;

    tokio::time::sleep((until - chrono::Utc::now()).to_std().unwrap_or_default()).await;
    for app in [&a, &b] {
        let reply = check(app, request("acct_9", "192.0.2.1")).await;
        assert_eq!(reply.status, StatusCode::OK, "expired: {}", reply.body);
        assert_eq!(reply.body.get("override"), None);
    }
    let listed = call(&a, "GET", "/admin/overrides?policy=api", Value::Null).await;
    assert_eq!(listed.body["overrides"], json!([]), "an expired override is not listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_shows_exact_values_only_by_their_hash() {
    let (a, b) = two_instances().await;
    let when = json!({ "account": "acct_secret_42", "email": "*@Example.COM", "ip": "10.0.0.0/8" });
    let id =
        add(&a, json!({ "policy": "api", "when": when, "limits": { "monthly": 50 }, "note": "trial" })).await;

    let listed = call(&b, "GET", "/admin/overrides?policy=api", Value::Null).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let entries = listed.body["overrides"].as_array().expect("a list");
    assert_eq!(entries.len(), 1, "{}", listed.body);
    let entry = &entries[0];
    assert_eq!(
        (&entry["id"], &entry["note"], &entry["limits"]),
        (&json!(id), &json!("trial"), &json!({ "monthly": 50 }))
    );
    let account = entry["when"]["account"].as_str().expect("a hash");
    assert!(account.starts_with("hmac:") && account.len() == 5 + 64, "{account}");
    assert_eq!(
        (&entry["when"]["email"], &entry["when"]["ip"]),
        (&json!("*@example.com"), &json!("10.0.0.0/8"))
    );
    assert!(!listed.body.to_string().contains("acct_secret_42"), "the raw value: {}", listed.body);

    let all = call(&b, "GET", "/admin/overrides", Value::Null).await;
    assert_eq!(all.body["overrides"], listed.body["overrides"], "{}", all.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setting_an_override_again_for_the_same_values_replaces_it() {
    let (a, b) = two_instances().await;
    let plan = |monthly: u64| json!({ "policy": "api", "when": { "account": "acct_5" }, "limits": { "monthly": monthly } });
    let first = add(&a, plan(100)).await;
    let again = call(&a, "POST", "/admin/overrides", plan(200)).await;
    assert_eq!(
        (again.status, &again.body["replaced"]),
        (StatusCode::CREATED, &json!([first])),
        "{}",
        again.body
    );
    let second = again.body["id"].clone();
    until_seen(&b, "acct_5", |body| body["override"]["id"] == second && body["limit"] == 200).await;
    let listed = call(&b, "GET", "/admin/overrides?policy=api", Value::Null).await;
    assert_eq!(listed.body["overrides"].as_array().map(Vec::len), Some(1), "{}", listed.body);
    let gone = call(&a, "DELETE", &format!("/admin/overrides/{first}"), Value::Null).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "the replaced one is gone");
}
