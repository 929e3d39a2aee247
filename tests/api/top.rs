//! `GET /admin/top`: who is being limited. Denials counted on two
//! instances of one database are listed with exactly their counts; an
//! identity is kept only where its policy shows it; bad parameters are
//! problems naming their field.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use crate::common::{adhoc_key, check, fresh_database, instance, policy_file, send, Reply};
use pglimit::AppState;

const POLICIES: &str = r#"
[policies.signin]
identifiers = { ip = { kind = "ip", show = true }, email = "email" }
[[policies.signin.buckets]]
name = "ip"
on = ["ip"]
limit = 1
window = "1h"
[[policies.signin.buckets]]
name = "email"
on = ["email"]
limit = 100
window = "1h"

[policies.quiet]
identifiers = { email = "email" }
[[policies.quiet.buckets]]
name = "email"
on = ["email"]
limit = 1
window = "1h"
[[policies.quiet.overrides]]
when = { email = "banned@example.com" }
deny = true
"#;

async fn two_instances(extra: &[(&str, &str)]) -> (String, AppState, AppState) {
    let file = policy_file(POLICIES);
    let mut env = vec![("PGLIMIT_POLICIES", file.to_str().expect("a path"))];
    env.extend_from_slice(extra);
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &env).await, instance(&url, &env).await);
    (url, a, b)
}

async fn top(app: &AppState, query: &str) -> Reply {
    send(app, Request::get(format!("/admin/top{query}")).body(Body::empty()).expect("request")).await
}

/// Sends `body` `times` times, each answered as `status`.
async fn checks(app: &AppState, body: &Value, times: usize, status: StatusCode) {
    for _ in 0..times {
        let reply = check(app, body.clone()).await;
        assert_eq!(reply.status, status, "{}", reply.body);
    }
}

fn ad_hoc(name: &str) -> Value {
    json!({ "key": name, "limit": 1, "window": "1h" })
}

/// The (key, denials) pairs of a listing, in its order.
fn counts(reply: &Reply) -> Vec<(String, u64)> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let keys = reply.body["keys"].as_array().expect("keys");
    keys.iter()
        .map(|k| (k["key"].as_str().expect("key").to_owned(), k["denials"].as_u64().expect("n")))
        .collect()
}

fn short(name: &str) -> String {
    hex::encode(&adhoc_key(name)[..8])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_denied_known_times_on_two_instances_are_listed_with_exactly_those_counts() {
    let (_, a, b) = two_instances(&[]).await;
    let (hot, warm) = (ad_hoc("hot"), ad_hoc("warm"));
    checks(&a, &hot, 1, StatusCode::OK).await;
    checks(&a, &hot, 4, StatusCode::TOO_MANY_REQUESTS).await;
    checks(&b, &hot, 3, StatusCode::TOO_MANY_REQUESTS).await;
    checks(&b, &warm, 1, StatusCode::OK).await;
    checks(&b, &warm, 2, StatusCode::TOO_MANY_REQUESTS).await;
    // Each listing writes its own instance's counts first: a's, then b's.
    assert_eq!(counts(&top(&a, "?policy=_adhoc").await), [(short("hot"), 4)]);
    let listed = top(&b, "?policy=_adhoc&since=15m").await;
    assert_eq!(counts(&listed), [(short("hot"), 7), (short("warm"), 2)]);
    let first = &listed.body["keys"][0];
    assert_eq!(
        (&first["policy"], &first["bucket"], &first["shown"]),
        (&json!("_adhoc"), &json!("default"), &Value::Null)
    );
    assert!(first["first"].as_str() <= first["last"].as_str(), "{first}");
    assert!(listed.body["since"].as_str() < listed.body["until"].as_str(), "{}", listed.body);
    assert_eq!(counts(&top(&a, "?limit=1").await), [(short("hot"), 7)], "most denied first, summed");
    assert!(counts(&top(&a, "?policy=signin").await).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identifier_marked_show_is_listed_and_one_not_marked_is_stored_nowhere() {
    let (url, a, _) = two_instances(&[]).await;
    let signin =
        json!({ "policy": "signin", "identifiers": { "ip": "203.0.113.7", "email": "shown@example.com" } });
    checks(&a, &signin, 1, StatusCode::OK).await;
    checks(&a, &signin, 2, StatusCode::TOO_MANY_REQUESTS).await;
    let quiet = json!({ "policy": "quiet", "identifiers": { "email": "Hidden.Person@Example.com" } });
    checks(&a, &quiet, 1, StatusCode::OK).await;
    checks(&a, &quiet, 3, StatusCode::TOO_MANY_REQUESTS).await;
    let listed = top(&a, "?policy=signin&bucket=ip").await;
    assert_eq!(counts(&listed).len(), 1, "{}", listed.body);
    assert_eq!(listed.body["keys"][0]["shown"], json!({ "ip": "203.0.113.7" }));
    assert_eq!(listed.body["keys"][0]["denials"], 2);
    let quiet = top(&a, "?policy=quiet").await;
    assert_eq!(
        (quiet.body["keys"][0]["denials"].as_u64(), &quiet.body["keys"][0]["shown"]),
        (Some(3), &Value::Null)
    );
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (table,): (String,) = sqlx::query_as("SELECT string_agg(d::text, ' ') FROM pglimit_denials d")
        .fetch_one(&pool)
        .await
        .expect("the table");
    assert!(table.contains("203.0.113.7"), "{table}");
    assert!(!table.to_lowercase().contains("hidden") && !table.contains("shown@"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_are_problems_naming_their_field() {
    let (_, a, _) = two_instances(&[("PGLIMIT_TOP_RETENTION", "1h")]).await;
    for (query, field) in [
        ("?policy=nope", "policy"),
        ("?since=2h", "since"),
        ("?since=soon", "since"),
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?policy=signin&bucket=nope", "bucket"),
        ("?policy=_adhoc&bucket=ip", "bucket"),
        ("?top=10", "top"),
        ("?bucket=a%00b", "bucket"),
        ("?limit=1&limit=2", "query"),
    ] {
        let reply = top(&a, query).await;
        assert_eq!(
            (reply.status, &reply.body["field"]),
            (StatusCode::BAD_REQUEST, &json!(field)),
            "{query}: {}",
            reply.body
        );
    }
    assert_eq!(top(&a, "?since=1h").await.status, StatusCode::OK);
    assert_eq!(top(&a, "").await.status, StatusCode::OK, "the default since, 1h, is within the retention");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_top_list_off_nothing_is_counted_and_the_route_says_it_is_off() {
    let (url, a, _) = two_instances(&[("PGLIMIT_TOP", "off")]).await;
    checks(&a, &ad_hoc("off"), 1, StatusCode::OK).await;
    checks(&a, &ad_hoc("off"), 2, StatusCode::TOO_MANY_REQUESTS).await;
    let reply = top(&a, "").await;
    assert_eq!(
        (reply.status, &reply.body["type"]),
        (StatusCode::NOT_FOUND, &json!("urn:pglimit:problem:top-off"))
    );
    a.top.flush().await.expect("a flush of nothing");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (rows,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pglimit_denials").fetch_one(&pool).await.expect("rows");
    assert_eq!(rows, 0);
}

/// What explain asks: each key's denials and last minute, this instance's
/// counts not yet written included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_s_denials_are_told_with_those_not_yet_written() {
    let (_, a, b) = two_instances(&[]).await;
    checks(&a, &ad_hoc("asked"), 1, StatusCode::OK).await;
    checks(&a, &ad_hoc("asked"), 2, StatusCode::TOO_MANY_REQUESTS).await;
    checks(&b, &ad_hoc("asked"), 1, StatusCode::TOO_MANY_REQUESTS).await;
    b.top.flush().await.expect("b writes");
    let keys = [adhoc_key("asked"), adhoc_key("never")];
    let told = a.top.denials_of(&keys, Duration::from_secs(3600)).await.expect("told");
    assert_eq!(told.iter().map(|k| k.denials).collect::<Vec<_>>(), [3, 0]);
    assert!(told[0].last.is_some() && told[1].last.is_none(), "{told:?}");
}

/// A deny list refuses without asking the store; its refusals are denials
/// the caller saw, and are listed as its bucket's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_list_s_refusals_are_listed_as_denials() {
    let (_, a, _) = two_instances(&[]).await;
    let banned = json!({ "policy": "quiet", "identifiers": { "email": "banned@example.com" } });
    checks(&a, &banned, 3, StatusCode::TOO_MANY_REQUESTS).await;
    let listed = top(&a, "?policy=quiet&bucket=email").await;
    assert_eq!(counts(&listed).iter().map(|(_, n)| *n).collect::<Vec<_>>(), [3], "{}", listed.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_list_takes_an_admin_token() {
    let (_, a, _) = two_instances(&[("PGLIMIT_API_TOKENS", "app"), ("PGLIMIT_ADMIN_TOKENS", "ops")]).await;
    let asked = |token: &str| Request::get("/admin/top").header("authorization", format!("Bearer {token}"));
    let refused = send(&a, asked("app").body(Body::empty()).expect("request")).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
    let listed = send(&a, asked("ops").body(Body::empty()).expect("request")).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
}

/// Minutes past the retention go with the cleanup; newer ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_deletes_minutes_older_than_the_retention_and_keeps_the_rest() {
    use pglimit::storage::{DenialStore, MinuteDenials};
    let url = fresh_database().await;
    let pg = crate::common::pg_store(&url).await;
    pg.keep_denials_for(Duration::from_secs(3600));
    let minute = |ago_minutes: i64, name: &str| MinuteDenials {
        minute: chrono::Utc::now() - chrono::TimeDelta::minutes(ago_minutes),
        key: adhoc_key(name),
        policy: "_adhoc".into(),
        bucket: "default".into(),
        shown: None,
        count: 2,
    };
    pg.add_denials(&[minute(120, "old"), minute(10, "recent")]).await.expect("written");
    pg.cleanup().await.expect("cleanup");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let kept: Vec<(Vec<u8>,)> =
        sqlx::query_as("SELECT key FROM pglimit_denials").fetch_all(&pool).await.expect("rows");
    assert_eq!(kept, [(adhoc_key("recent").to_vec(),)]);
}

/// Past its bound in memory an instance keeps no more keys: what it could
/// not keep is counted in /metrics, and with what it kept makes every denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_past_the_bound_in_memory_are_counted_as_lost() {
    let (_, a, _) = two_instances(&[("PGLIMIT_MEMORY_CAPACITY", "16")]).await;
    let names: Vec<String> = (0..40).map(|n| format!("bounded-{n}")).collect();
    for name in &names {
        checks(&a, &ad_hoc(name), 1, StatusCode::OK).await;
        checks(&a, &ad_hoc(name), 1, StatusCode::TOO_MANY_REQUESTS).await;
    }
    let listed: u64 = counts(&top(&a, "?policy=_adhoc&limit=1000").await).iter().map(|(_, n)| n).sum();
    let lost = crate::common::metric(&a, "pglimit_top_lost_total").await as u64;
    assert!(listed <= 16 && lost > 0, "{listed} listed, {lost} lost");
    assert_eq!(listed + lost, 40);
}

/// A check held by `max_wait` is tried several times but answered once:
/// one denial when its time runs out, none when it is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_check_counts_one_denial_when_its_time_runs_out_and_none_when_admitted() {
    let (_, a, _) = two_instances(&[]).await;
    let slot = json!({ "key": "held", "limit": 1, "algorithm": "concurrency", "lease": "1h" });
    checks(&a, &slot, 1, StatusCode::OK).await;
    let mut held = slot.clone();
    held["max_wait"] = json!("300ms");
    let timed_out = check(&a, held).await;
    assert_eq!(timed_out.status, StatusCode::TOO_MANY_REQUESTS, "{}", timed_out.body);
    assert!(timed_out.body["waited_ms"].as_u64() > Some(0), "it was held: {}", timed_out.body);
    let turn = json!({ "key": "turn", "limit": 1, "window": "1s" });
    checks(&a, &turn, 1, StatusCode::OK).await;
    let mut waits = turn.clone();
    waits["max_wait"] = json!("3s");
    checks(&a, &waits, 1, StatusCode::OK).await;
    let listed = counts(&top(&a, "?policy=_adhoc").await);
    assert_eq!(listed.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [1], "{listed:?}");
}
