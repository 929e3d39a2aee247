//! Acting on limits, with two instances on one database: a reset, a block
//! or an unblock made through one is honoured by the other, deny caches
//! included; lockouts; overrides, allow and deny lists.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

use crate::common::{call, check, fresh_database, instance, login, policy_file, readyz, remaining, send};

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"];

/// The actions generation as Postgres holds it.
async fn generation(url: &str) -> u64 {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let (g,): (i64,) =
        sqlx::query_as("SELECT generation FROM pglimit_actions").fetch_one(&pool).await.unwrap();
    pool.close().await;
    g as u64
}

/// Waits until `app` has heard of every action taken so far on `url`.
async fn wait_until_heard(app: &pglimit::AppState, url: &str) {
    let (wanted, deadline) = (generation(url).await, Instant::now() + Duration::from_secs(15));
    while readyz(app).await["actions"].as_u64().unwrap_or(0) < wanted {
        assert!(Instant::now() < deadline, "generation {wanted} was never heard");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_instance_lets_the_very_next_check_on_another_through() {
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &[]).await, instance(&url, &[]).await);
    let alice = login("alice@example.com", "203.0.113.5");
    for _ in 0..5 {
        assert_eq!(check(&a, alice.clone()).await.status, StatusCode::OK);
    }
    assert_eq!(check(&a, alice.clone()).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(check(&b, alice.clone()).await.status, StatusCode::TOO_MANY_REQUESTS, "B remembers it");

    let mut reset = alice.clone();
    reset["buckets"] = json!(["email_ip"]);
    let reply = call(&a, "POST", "/reset", reset).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(remaining(&reply.body, "email_ip"), 5, "a peek after the reset: {}", reply.body);
    assert_eq!(remaining(&reply.body, "ip"), 15, "the other buckets keep their counts");
    wait_until_heard(&b, &url).await;
    let next = check(&b, alice).await;
    assert_eq!(next.status, StatusCode::OK, "{}", next.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_on_one_instance_denies_on_the_other_until_it_is_lifted() {
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &[]).await, instance(&url, &[]).await);
    let target = json!({ "policy": "login", "identifiers": { "ip": "198.51.100.9" }, "for": "15m", "reason": "abuse" });
    let blocked = call(&b, "POST", "/admin/blocks", target.clone()).await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    assert_eq!(
        blocked.body["blocked"].as_array().map(Vec::len),
        Some(1),
        "only the ip bucket counts over ip alone"
    );
    assert_eq!(blocked.body["blocked"][0]["bucket"], "ip");

    wait_until_heard(&a, &url).await;
    let denied = check(&a, login("someone@example.com", "198.51.100.9")).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{}", denied.body);
    assert_eq!(denied.body["blocked_by"], "ip");
    let retry: u64 = denied.header("retry-after").parse().expect("Retry-After");
    assert!((800..=900).contains(&retry), "retry after {retry} s for a 15 min block");
    assert_eq!(remaining(&denied.body, "email_ip"), 5, "a blocked check consumes nothing");

    let listed = send(&b, Request::get("/admin/blocks").body(Body::empty()).unwrap()).await;
    let entry = &listed.body["blocks"][0];
    assert_eq!((entry["kind"].as_str(), entry["reason"].as_str()), (Some("admin"), Some("abuse")));
    assert_eq!(entry["key"].as_str().map(str::len), Some(64));
    assert!(!listed.body.to_string().contains("198.51.100.9"), "never a raw identifier: {}", listed.body);

    let lifted = call(&a, "DELETE", "/admin/blocks", target).await;
    assert_eq!((lifted.status, lifted.body["lifted"].as_u64()), (StatusCode::OK, Some(1)));
    wait_until_heard(&b, &url).await;
    assert_eq!(check(&b, login("someone@example.com", "198.51.100.9")).await.status, StatusCode::OK);
}

fn lockout_policy(algorithm: &str) -> String {
    format!(
        "[policies.otp]\nidentifiers = {{ user = \"text\" }}\n[[policies.otp.buckets]]\n\
         name = \"user\"\non = [\"user\"]\nlimit = 1\nwindow = \"2s\"\nalgorithm = \"{algorithm}\"\nblock_for = \"1h\"\n"
    )
}

/// Limit 1 per 2 s with a 1 h lockout: the second check starts it; more
/// than two windows later (when every algorithm's bucket alone would admit
/// again) the key is still refused by Postgres, until a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockout_outlasts_the_window_for_every_algorithm_and_a_reset_lifts_it() {
    let otp = json!({ "policy": "otp", "identifiers": { "user": "u1" } });
    let mut apps = Vec::new();
    for algorithm in ALGORITHMS {
        let file = policy_file(&lockout_policy(algorithm));
        let url = fresh_database().await;
        let env = [("PGLIMIT_POLICIES", file.to_str().unwrap())];
        let app = instance(&url, &env).await;
        assert_eq!(check(&app, otp.clone()).await.status, StatusCode::OK, "{algorithm}");
        // Sliding windows start on multiples of 2 s, and the previous one's
        // count is weighted down: two checks that straddle that edge are
        // both admitted, a third is not.
        let mut denied = check(&app, otp.clone()).await;
        if denied.status == StatusCode::OK && algorithm == "sliding_window" {
            denied = check(&app, otp.clone()).await;
        }
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: {}", denied.body);
        assert!(denied.body["retry_after_s"].as_u64().unwrap_or(0) > 3000, "{algorithm}: {}", denied.body);
        assert_eq!(denied.body["blocked_by"], "user", "{algorithm}: the denial starts the lockout");
        // A second instance remembers no denial: Postgres decides for it.
        apps.push((algorithm, app, instance(&url, &env).await));
    }
    tokio::time::sleep(Duration::from_millis(4500)).await;
    for (algorithm, app, other) in apps {
        let later = check(&other, otp.clone()).await;
        assert_eq!(later.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: {}", later.body);
        assert_eq!(later.body["blocked_by"], "user", "{algorithm}");
        let reset = call(&app, "POST", "/reset", otp.clone()).await;
        assert_eq!(reset.status, StatusCode::OK, "{algorithm}: {}", reset.body);
        assert_eq!(
            check(&app, otp.clone()).await.status,
            StatusCode::OK,
            "{algorithm}: the reset lifted the lockout"
        );
    }
}

#[tokio::test]
async fn the_admin_routes_take_an_admin_token_and_are_off_on_a_network_bind_without_one() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_API_TOKENS", "app"), ("PGLIMIT_ADMIN_TOKENS", "ops")]).await;
    let list = |token: &str| {
        Request::get("/admin/blocks")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, list("app")).await.status, StatusCode::UNAUTHORIZED, "an API token is not enough");
    assert_eq!(send(&app, list("ops")).await.status, StatusCode::OK);

    let exposed = instance(&url, &[("PGLIMIT_BIND", "0.0.0.0:0"), ("PGLIMIT_API_TOKENS", "app")]).await;
    let reply = send(&exposed, list("app")).await;
    assert_eq!(
        (reply.status, reply.body["type"].as_str()),
        (StatusCode::FORBIDDEN, Some("urn:pglimit:problem:admin-disabled"))
    );
}

#[tokio::test]
async fn actions_name_the_field_at_fault() {
    let app = instance(&fresh_database().await, &[]).await;
    let cases = [
        (
            "/reset",
            json!({ "policy": "login", "identifiers": { "email": "a@b.c", "ip": "192.0.2.1" }, "buckets": ["nope"] }),
            "buckets",
        ),
        ("/admin/blocks", json!({ "policy": "login", "identifiers": { "ip": "192.0.2.1" } }), "for"),
        (
            "/admin/blocks",
            json!({ "policy": "login", "identifiers": { "ip": "192.0.2.1" }, "for": "soon" }),
            "for",
        ),
        (
            "/admin/blocks",
            json!({ "policy": "login", "identifiers": { "ip": "192.0.2.1" }, "bucket": "x", "for": "1m" }),
            "bucket",
        ),
        ("/admin/blocks", json!({ "policy": "login", "identifiers": {}, "for": "1m" }), "identifiers.email"),
    ];
    for (path, body, field) in cases {
        let reply = call(&app, "POST", path, body).await;
        assert_eq!(
            (reply.status, reply.body["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some(field)),
            "{}",
            reply.body
        );
    }
    let on_check =
        check(&app, json!({ "key": "k", "limit": 1, "window": "1m", "buckets": ["default"] })).await;
    assert_eq!(on_check.body["field"], "buckets");
}

/// Listener connections of this test's database.
async fn listeners(url: &str, kill: bool) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let select = if kill { "count(pg_terminate_backend(pid))" } else { "count(*)" };
    let sql = format!(
        "SELECT {select} FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'"
    );
    let (n,): (i64,) = sqlx::query_as(&sql).fetch_one(&pool).await.expect("pg_stat_activity");
    pool.close().await;
    n
}

/// The listeners are killed just before the reset, so its notification may
/// reach nobody. Each instance forgets everything when it listens again (1 s
/// later) and when its heartbeat (every 2 s) reads a generation it never
/// heard announced: so B converges within about 3 s. The test allows 15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_notification_still_converges_within_a_bounded_time() {
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &[]).await, instance(&url, &[]).await);
    let alice = login("alice@example.com", "203.0.113.5");
    for _ in 0..6 {
        check(&a, alice.clone()).await;
    }
    assert_eq!(check(&b, alice.clone()).await.status, StatusCode::TOO_MANY_REQUESTS, "B remembers it");
    let deadline = Instant::now() + Duration::from_secs(15);
    while listeners(&url, false).await < 2 {
        assert!(Instant::now() < deadline, "the instances never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listeners(&url, true).await, 2);
    assert_eq!(call(&a, "POST", "/reset", alice.clone()).await.status, StatusCode::OK);

    let deadline = Instant::now() + Duration::from_secs(15);
    while check(&b, alice.clone()).await.status != StatusCode::OK {
        assert!(Instant::now() < deadline, "B still answers from a stale memory");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn single_bucket_policy(algorithm: &str) -> String {
    format!(
        "[policies.one]\nidentifiers = {{ ip = \"ip\" }}\n[[policies.one.buckets]]\n\
         name = \"ip\"\non = [\"ip\"]\nlimit = 100\nwindow = \"1h\"\nalgorithm = \"{algorithm}\"\n"
    )
}

/// One fixed-window bucket takes the plain upsert, the other algorithms the
/// batch function: a block holds on both roads, and consumes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_holds_for_every_algorithm_and_consumes_nothing() {
    for algorithm in ALGORITHMS {
        let file = policy_file(&single_bucket_policy(algorithm));
        let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
        let body = json!({ "policy": "one", "identifiers": { "ip": "192.0.2.44" } });
        let target = json!({ "policy": "one", "identifiers": { "ip": "192.0.2.44" }, "for": "10m" });
        assert_eq!(call(&app, "POST", "/admin/blocks", target.clone()).await.status, StatusCode::OK);
        for _ in 0..3 {
            let denied = check(&app, body.clone()).await;
            assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: {}", denied.body);
            assert_eq!(denied.body["blocked_by"], "ip", "{algorithm}");
            assert_eq!(denied.body["buckets"][0]["blocked"], true, "{algorithm}");
        }
        assert_eq!(call(&app, "DELETE", "/admin/blocks", target).await.status, StatusCode::OK);
        let admitted = check(&app, body).await;
        assert_eq!(admitted.status, StatusCode::OK, "{algorithm}");
        assert_eq!(remaining(&admitted.body, "ip"), 99, "{algorithm}: the blocked checks took nothing");
    }
}
