//! How long a lease, and its row, may last: a released lease's row is
//! gone within a minute, renewals stop at the policy's `max_lease_life`,
//! an ad hoc lease is at most a day, and a reset ends the leases of the
//! buckets it resets (issue 46).

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{call, check, fresh_database, instance, policy_file, unique, Reply};
use pglimit::AppState;

fn slot(key: &str, lease: &str) -> Value {
    json!({ "key": key, "limit": 1, "algorithm": "concurrency", "lease": lease })
}

fn lease_of(reply: &Reply) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["lease"]["id"].clone()
}

async fn count(url: &str, sql: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.expect("count");
    pool.close().await;
    n
}

/// An instance whose policy `job` has two concurrency buckets, one per
/// account and one per tenant, each of one slot.
async fn with_policy(url: &str, lease: &str, max_lease_life: Option<&str>) -> AppState {
    let life = max_lease_life.map_or_else(String::new, |life| format!("max_lease_life = \"{life}\""));
    let file = policy_file(&format!(
        r#"
[policies.job]
identifiers = {{ account = "text", tenant = "text" }}
{life}
[[policies.job.buckets]]
name = "account"
on = ["account"]
limit = 1
algorithm = "concurrency"
lease = "{lease}"
[[policies.job.buckets]]
name = "tenant"
on = ["tenant"]
limit = 1
algorithm = "concurrency"
lease = "{lease}"
"#
    ));
    instance(url, &[("PGLIMIT_POLICIES", file.to_str().expect("a UTF-8 path"))]).await
}

fn job(account: &str, tenant: &str) -> Value {
    json!({ "policy": "job", "identifiers": { "account": account, "tenant": tenant } })
}

#[tokio::test]
async fn a_released_lease_row_ends_within_a_minute_and_a_second_release_is_still_false() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let lease = lease_of(&check(&app, slot(&unique("day"), "1d")).await);
    let released = call(&app, "POST", "/release", json!({ "lease": lease })).await;
    assert_eq!(released.body, json!({ "released": true }));
    let lasting = "SELECT count(*) FROM pglimit_leases WHERE expires_at > now() + interval '1 minute'";
    assert_eq!(count(&url, lasting).await, 0, "the released row outlives its release by at most a minute");
    let again = call(&app, "POST", "/release", json!({ "lease": lease })).await;
    assert_eq!(again.body, json!({ "released": false }), "a retried release is still answered");

    // A minute on, the cleanup deletes it as any ended lease.
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let age = "UPDATE pglimit_leases SET expires_at = expires_at - interval '1 minute'";
    sqlx::query(age).execute(&pool).await.expect("a minute on");
    pool.close().await;
    crate::common::pg_store(&url).await.cleanup().await.expect("cleanup");
    assert_eq!(count(&url, "SELECT count(*) FROM pglimit_leases").await, 0);
}

#[tokio::test]
async fn a_lease_renewed_past_its_policy_max_lease_life_is_a_409_naming_it_and_still_held() {
    // Renewals may keep a 4 s lease 6 s in all: one at once passes, one 3 s
    // on (it would end at 7 s) is refused; each has a second of slack.
    let url = fresh_database().await;
    let app = with_policy(&url, "4s", Some("6s")).await;
    let lease = lease_of(&check(&app, job("a", "t")).await);
    let taken_at = Instant::now();
    let renewed = call(&app, "POST", "/renew", json!({ "lease": lease })).await;
    assert_eq!(renewed.status, StatusCode::OK, "within its life: {}", renewed.body);
    tokio::time::sleep((taken_at + Duration::from_secs(3)).saturating_duration_since(Instant::now())).await;

    let refused = call(&app, "POST", "/renew", json!({ "lease": lease })).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert_eq!(refused.body["type"], "urn:pglimit:problem:lease-life-exceeded");
    assert_eq!(refused.body["field"], "lease");
    let detail = refused.body["detail"].as_str().expect("a detail");
    assert!(detail.contains("max_lease_life"), "{detail}");
    assert_eq!(check(&app, job("a", "t")).await.status, StatusCode::TOO_MANY_REQUESTS, "still held");
    let released = call(&app, "POST", "/release", json!({ "lease": lease })).await;
    assert_eq!(released.body, json!({ "released": true }));
}

#[tokio::test]
async fn an_ad_hoc_lease_longer_than_a_day_and_a_policy_lease_longer_than_its_max_lease_life_are_refused() {
    let url = fresh_database().await;
    let app = instance(&url, &[]).await;
    let refused = check(&app, slot(&unique("long"), "2d")).await;
    assert_eq!((refused.status, &refused.body["field"]), (StatusCode::BAD_REQUEST, &json!("lease")));
    assert!(
        refused.body["detail"].as_str().is_some_and(|d| d.contains("max_lease_life")),
        "{}",
        refused.body
    );
    assert_eq!(check(&app, slot(&unique("day"), "1d")).await.status, StatusCode::OK);

    let file = policy_file(
        "[policies.job]\nidentifiers = { account = \"text\" }\nmax_lease_life = \"1h\"\n\
         [[policies.job.buckets]]\nname = \"slot\"\non = [\"account\"]\nlimit = 1\n\
         algorithm = \"concurrency\"\nlease = \"2h\"\n",
    );
    let policies = [("PGLIMIT_POLICIES", file.to_str().expect("a UTF-8 path"))];
    let start = crate::common::try_instance(&url, &policies).await.err().expect("refused at start");
    assert!(start.contains("line 9") && start.contains("max_lease_life"), "{start}");
}

#[tokio::test]
async fn a_reset_of_a_concurrency_bucket_ends_its_leases_so_renew_and_release_are_unknown() {
    let url = fresh_database().await;
    let app = instance(&url, &[]).await;
    let body = slot(&unique("reset"), "1h");
    let lease = lease_of(&check(&app, body.clone()).await);
    let reset = call(&app, "POST", "/reset", body.clone()).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    for path in ["/renew", "/release"] {
        let ended = call(&app, "POST", path, json!({ "lease": lease })).await;
        assert_eq!(ended.status, StatusCode::NOT_FOUND, "{path}: {}", ended.body);
        assert_eq!(ended.body["type"], "urn:pglimit:problem:unknown-lease", "{path}");
    }
    assert_eq!(check(&app, body).await.status, StatusCode::OK, "the slot is free for another");
}

#[tokio::test]
async fn a_reset_of_one_bucket_ends_the_whole_lease_and_frees_its_slots_in_the_others() {
    let url = fresh_database().await;
    let app = with_policy(&url, "1h", None).await;
    let lease = lease_of(&check(&app, job("a", "t")).await);
    assert_eq!(check(&app, job("b", "t")).await.status, StatusCode::TOO_MANY_REQUESTS, "tenant t is full");
    let mut reset = job("a", "t");
    reset["buckets"] = json!(["account"]);
    assert_eq!(call(&app, "POST", "/reset", reset).await.status, StatusCode::OK);
    let renewed = call(&app, "POST", "/renew", json!({ "lease": lease })).await;
    assert_eq!(renewed.status, StatusCode::NOT_FOUND, "{}", renewed.body);
    let other = check(&app, job("b", "t")).await;
    assert_eq!(other.status, StatusCode::OK, "the ended lease's tenant slot is free: {}", other.body);
}
