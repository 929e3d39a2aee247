//! Concurrency buckets through the real binary, three instances on one
//! database: the limit holds exactly under concurrent checks spread over
//! them, a release through one frees a slot another sees, an unreleased
//! lease frees itself after its lease time, renewing extends it, a
//! second release answers `released: false`, and a reset through one
//! instance ends the lease for every other.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::process::*;
use serde_json::{json, Value};

/// The lease time of the tests that wait for one to end: short, so that the
/// suite stays quick; every wait below is derived from it.
const LEASE: Duration = Duration::from_secs(2);

const POLICY: &str = r#"
[policies.export]
identifiers = { account = "text" }

[[policies.export.buckets]]
name = "hourly"
on = ["account"]
limit = 10
window = "1h"

[[policies.export.buckets]]
name = "at_once"
on = ["account"]
limit = 2
algorithm = "concurrency"
lease = "2s"
"#;

async fn three_instances(dir: &Path) -> Vec<Running> {
    three_instances_on(&common::fresh_database().await, dir)
}

fn three_instances_on(url: &str, dir: &Path) -> Vec<Running> {
    let policies = common::policy_file(POLICY);
    let envs = [
        ("DATABASE_URL", url),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_POLICIES", policies.to_str().expect("a UTF-8 path")),
        // A long timeout: a stall on a busy machine must not switch a check to memory.
        ("PGLIMIT_DB_TIMEOUT_MS", "5000"),
    ];
    (0..3).map(|_| start(&envs, dir)).collect()
}

fn ad_hoc(key: &str, limit: u64, lease: &str) -> Value {
    json!({ "key": key, "limit": limit, "algorithm": "concurrency", "lease": lease })
}

fn export(account: &str) -> Value {
    json!({ "policy": "export", "identifiers": { "account": account } })
}

async fn post(at: &Running, path: &str, body: Value) -> (u16, Value) {
    let reply =
        http_client().post(format!("http://{}{path}", at.addr)).json(&body).send().await.expect("reply");
    (reply.status().as_u16(), reply.json().await.expect("JSON body"))
}

fn lease_of(answer: &Value) -> String {
    answer["lease"]["id"].as_str().unwrap_or_else(|| panic!("a lease in {answer}")).to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_of_two_holds_exactly_under_fifty_concurrent_checks_across_instances() {
    let dir = temp_dir("leases-exact");
    let instances = three_instances(&dir.0).await;
    let body = ad_hoc("export:acct_42", 2, "30s");
    let checks = (0..50).map(|i| post(&instances[i % 3], "/check", body.clone()));
    let answers = futures_util::future::join_all(checks).await;
    let admitted: Vec<&Value> = answers.iter().filter(|(status, _)| *status == 200).map(|(_, a)| a).collect();
    assert_eq!(admitted.len(), 2, "{answers:?}");
    assert!(answers.iter().all(|(status, a)| *status == 200 || (*status == 429 && a.get("lease").is_none())));
    let mut ids: Vec<String> = admitted.iter().map(|a| lease_of(a)).collect();
    ids.dedup();
    assert_eq!(ids.len(), 2, "each admitted check has a lease of its own");
    for id in &ids {
        assert!(!id.contains("acct_42") && !id.contains("export"), "{id} names nothing of the check");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_through_one_instance_frees_a_slot_another_sees_and_a_second_is_false() {
    let dir = temp_dir("leases-release");
    let url = common::fresh_database().await;
    let instances = three_instances_on(&url, &dir.0);
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.expect("listen");
    listener.listen("pglimit_actions").await.expect("listen");
    let (a, b, c) = (&instances[0], &instances[1], &instances[2]);
    let (first, second) =
        (post(a, "/check", export("acct_1")).await, post(b, "/check", export("acct_1")).await);
    assert_eq!((first.0, second.0), (200, 200));
    assert_eq!(second.1["remaining"], 0, "remaining counts free slots: {}", second.1);
    let (status, denied) = post(b, "/check", export("acct_1")).await;
    assert_eq!(status, 429, "{denied}");
    assert_eq!(denied["buckets"][0]["remaining"], 8, "the hourly bucket took nothing: {denied}");
    let (status, released) = post(a, "/release", json!({ "lease": lease_of(&first.1) })).await;
    assert_eq!((status, &released), (200, &json!({ "released": true })));
    // Every instance hears which key's slot freed: its hash, nothing raw.
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await;
    let payload = heard.expect("a notification").expect("listening").payload().to_owned();
    let key = payload.strip_prefix("released ").unwrap_or_else(|| panic!("{payload}"));
    assert!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{payload}");
    let (status, third) = post(c, "/check", export("acct_1")).await;
    assert_eq!(status, 200, "the freed slot, seen by another instance: {third}");
    let (status, again) = post(b, "/release", json!({ "lease": lease_of(&first.1) })).await;
    assert_eq!((status, &again), (200, &json!({ "released": false })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreleased_lease_frees_its_slot_after_its_lease_time_and_a_renewal_extends_it() {
    let dir = temp_dir("leases-expiry");
    let instances = three_instances(&dir.0).await;
    let (a, b) = (&instances[0], &instances[1]);
    let body = ad_hoc("export:acct_7", 1, "2s");
    let (status, taken) = post(a, "/check", body.clone()).await;
    assert_eq!(status, 200);
    let taken_at = Instant::now();
    let (status, denied) = post(b, "/check", body.clone()).await;
    assert_eq!(status, 429);
    let retry = denied["retry_after_s"].as_u64().expect("retry_after_s");
    assert!(retry >= 1 && retry <= LEASE.as_secs(), "retry_after_s is when the lease ends: {denied}");

    // Renewed halfway: it now ends a whole lease time after the renewal.
    tokio::time::sleep(LEASE / 2).await;
    let (status, renewed) = post(b, "/renew", json!({ "lease": lease_of(&taken) })).await;
    assert_eq!(status, 200, "{renewed}");
    let renewed_at = Instant::now();
    sleep_until(taken_at + LEASE + LEASE / 4).await;
    assert_eq!(post(a, "/check", body.clone()).await.0, 429, "still held past the first lease time");

    sleep_until(renewed_at + LEASE + LEASE / 4).await;
    let (status, after) = post(b, "/check", body.clone()).await;
    assert_eq!(status, 200, "free again once the renewed lease ended: {after}");
    let (status, problem) = post(a, "/renew", json!({ "lease": lease_of(&taken) })).await;
    assert_eq!((status, problem["field"].as_str()), (404, Some("lease")), "{problem}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_through_one_instance_ends_a_lease_so_another_answers_unknown_lease() {
    let dir = temp_dir("leases-reset");
    let instances = three_instances(&dir.0).await;
    let (a, b, c) = (&instances[0], &instances[1], &instances[2]);
    let (status, taken) = post(a, "/check", export("acct_9")).await;
    assert_eq!(status, 200, "{taken}");
    let mut reset = export("acct_9");
    reset["buckets"] = json!(["at_once"]);
    let (status, after) = post(a, "/reset", reset).await;
    assert_eq!(status, 200, "{after}");
    for (at, path) in [(b, "/renew"), (c, "/release")] {
        let (status, problem) = post(at, path, json!({ "lease": lease_of(&taken) })).await;
        assert_eq!(status, 404, "{path}: {problem}");
        assert_eq!(problem["type"], "urn:pglimit:problem:unknown-lease", "{path}");
    }
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep(at.saturating_duration_since(Instant::now())).await;
}

#[tokio::test]
async fn bad_leases_are_problems_naming_the_field() {
    let dir = temp_dir("leases-errors");
    let instances = three_instances(&dir.0).await;
    let a = &instances[0];
    let cases = [
        ("/check", json!({ "key": "k", "limit": 2, "window": "1m", "lease": "30s" }), 400, "lease"),
        ("/check", json!({ "key": "k", "limit": 2, "algorithm": "concurrency" }), 400, "lease"),
        (
            "/check",
            json!({ "key": "k", "limit": 2, "algorithm": "concurrency", "lease": "forever" }),
            400,
            "lease",
        ),
        (
            "/check",
            json!({ "key": "k", "limit": 2, "algorithm": "concurrency", "window": "1m" }),
            400,
            "window",
        ),
        (
            "/check",
            json!({ "policy": "export", "identifiers": { "account": "a" }, "lease": "1s" }),
            400,
            "lease",
        ),
        ("/release", json!({ "lease": "not-a-lease" }), 400, "lease"),
        ("/renew", json!({ "lease": 42 }), 400, "lease"),
        ("/release", json!({ "lease": "lease_00112233445566778899aabbccddeeff" }), 404, "lease"),
        ("/renew", json!({ "lease": "lease_00112233445566778899aabbccddeeff" }), 404, "lease"),
    ];
    for (path, body, want, field) in cases {
        let (status, problem) = post(a, path, body.clone()).await;
        assert_eq!((status, problem["field"].as_str()), (want, Some(field)), "{path} {body}: {problem}");
    }
}
