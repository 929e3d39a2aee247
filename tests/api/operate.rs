//! What operators rely on, in process: request ids, shadow mode, the
//! policies hash on /readyz, and who may read /metrics. (Exact metric
//! counts, reloads and the CLI are checked on the real binary, in
//! `tests/operate.rs`: the metrics recorder is one per process.)

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

use crate::common::{check, fresh_database, instance, policy_file, readyz, send, unique};

const SHADOW_POLICY: &str = r#"
[policies.signup]
mode = "shadow"
identifiers = { ip = "ip" }

[[policies.signup.buckets]]
name = "ip"
on = ["ip"]
limit = 2
window = "1h"
"#;

/// A generated request id: 32 lowercase hex digits, 128 random bits.
fn is_generated(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[tokio::test]
async fn every_answer_carries_a_request_id_the_callers_own_when_it_sent_one() {
    let app = instance(&fresh_database().await, &[]).await;
    let allowed = check(&app, json!({ "key": unique("id"), "limit": 1, "window": "1m" })).await;
    let generated = allowed.header("x-request-id");
    assert!(is_generated(generated), "a generated id: {generated:?}");

    let mine =
        Request::post("/check").header("x-request-id", "req-42").header("content-type", "application/json");
    let mine = mine.body(Body::from("{")).unwrap();
    let problem = send(&app, mine).await;
    assert_eq!(problem.status, StatusCode::BAD_REQUEST);
    assert_eq!(problem.header("x-request-id"), "req-42");

    let unfit =
        Request::get("/healthz").header("x-request-id", "has spaces in it").body(Body::empty()).unwrap();
    let replaced = send(&app, unfit).await;
    assert!(is_generated(replaced.header("x-request-id")), "an id with spaces is replaced");

    let missing = send(&app, Request::get("/nowhere").body(Body::empty()).unwrap()).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(is_generated(missing.header("x-request-id")));
    assert_ne!(missing.header("x-request-id"), generated, "each request gets its own id");
}

#[tokio::test]
async fn a_shadow_policy_over_its_limit_answers_allowed_with_what_enforcing_would_have_said() {
    let file = policy_file(SHADOW_POLICY);
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let body = json!({ "policy": "signup", "identifiers": { "ip": "203.0.113.9" } });
    for left in [1, 0] {
        let reply = check(&app, body.clone()).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            (reply.body["shadow"].as_bool(), reply.body["would_allow"].as_bool()),
            (Some(true), Some(true))
        );
        assert_eq!(reply.body["remaining"], left, "counted as if enforced");
    }
    let over = check(&app, body).await;
    assert_eq!(over.status, StatusCode::OK, "{}", over.body);
    assert_eq!(over.body["allowed"], true);
    assert_eq!(
        (over.body["shadow"].as_bool(), over.body["would_allow"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(over.body["buckets"][0]["allowed"], false, "the bucket shows the real decision");
    assert_eq!(over.body["retry_after_s"], serde_json::Value::Null);
    assert!(over.header("ratelimit").starts_with("\"ip\";r=0;t="), "{}", over.header("ratelimit"));
    assert_eq!(over.header("retry-after"), "", "nothing to retry: the request goes ahead");
}

#[tokio::test]
async fn pglimit_shadow_puts_ad_hoc_keys_in_shadow_mode_and_enforced_answers_carry_no_shadow_fields() {
    let url = fresh_database().await;
    let body = json!({ "key": unique("shadow"), "limit": 1, "window": "1m" });
    let enforced = instance(&url, &[]).await;
    let first = check(&enforced, body.clone()).await;
    assert!(first.body.get("shadow").is_none() && first.body.get("would_allow").is_none(), "{}", first.body);

    let shadow = instance(&url, &[("PGLIMIT_SHADOW", "true")]).await;
    let over = check(&shadow, body.clone()).await;
    assert_eq!(over.status, StatusCode::OK);
    assert_eq!(over.body["would_allow"], false);
    assert_eq!(check(&enforced, body).await.status, StatusCode::TOO_MANY_REQUESTS, "the same count");
}

#[tokio::test]
async fn readyz_names_the_policies_in_force_by_a_short_hash_of_their_file() {
    let file = policy_file(SHADOW_POLICY);
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    assert_eq!(readyz(&app).await["policies"], pglimit::policy::short_hash(SHADOW_POLICY));
    let builtin = instance(&fresh_database().await, &[]).await;
    assert_eq!(readyz(&builtin).await["policies"], pglimit::policy::Policies::builtin().hash());
}

async fn scrape(app: &pglimit::AppState, token: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get("/metrics");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = pglimit::router(app.clone()).oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8(bytes.to_vec()).expect("UTF-8"))
}

#[tokio::test]
async fn metrics_are_open_on_loopback_and_take_the_metrics_token_once_one_is_set() {
    let url = fresh_database().await;
    let open = instance(&url, &[]).await;
    let (status, text) = scrape(&open, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("pglimit_build_info{version=\""), "{text}");

    let guarded =
        instance(&url, &[("PGLIMIT_METRICS_TOKEN", "scrape-me"), ("PGLIMIT_API_TOKENS", "app")]).await;
    assert_eq!(scrape(&guarded, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(&guarded, Some("wrong")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(&guarded, Some("scrape-me")).await.0, StatusCode::OK);
    assert_eq!(scrape(&guarded, Some("app")).await.0, StatusCode::OK, "an API token reads metrics too");

    let off = instance(&url, &[("PGLIMIT_METRICS", "false")]).await;
    assert_eq!(scrape(&off, None).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn metrics_on_a_network_bind_take_an_api_token() {
    let url = fresh_database().await;
    let exposed = instance(&url, &[("PGLIMIT_BIND", "0.0.0.0:0"), ("PGLIMIT_API_TOKENS", "app")]).await;
    assert_eq!(scrape(&exposed, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(&exposed, Some("app")).await.0, StatusCode::OK);
}

async fn boom() -> &'static str {
    panic!("a bug")
}

async fn call(app: &Router, path: &str) -> axum::response::Response {
    app.clone().oneshot(Request::get(path).body(Body::empty()).unwrap()).await.expect("an answer")
}

#[tokio::test]
async fn a_panicking_handler_answers_a_500_problem_with_its_request_id_and_the_service_carries_on() {
    let routes = Router::new().route("/boom", get(boom)).route("/fine", get(|| async { "fine" }));
    let app = pglimit::server::wrap_in_layers(routes, Duration::from_secs(30));
    let reply = call(&app, "/boom").await;
    assert_eq!(reply.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.headers()["content-type"], "application/problem+json");
    assert!(is_generated(reply.headers()["x-request-id"].to_str().unwrap_or("")));
    assert_eq!(call(&app, "/fine").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_over_the_timeout_answers_a_503_problem_with_retry_after() {
    // The handler would take an hour; the timeout is 50 ms.
    let routes = Router::new().route("/stuck", get(|| tokio::time::sleep(Duration::from_secs(3600))));
    let app = pglimit::server::wrap_in_layers(routes, Duration::from_millis(50));
    let reply = call(&app, "/stuck").await;
    assert_eq!(reply.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers()["retry-after"], "1");
    assert_eq!(reply.headers()["content-type"], "application/problem+json");
    assert!(is_generated(reply.headers()["x-request-id"].to_str().unwrap_or("")));
}

/// `scripts/test --pg N` runs this tier on PostgreSQL N: prove it did,
/// rather than on whichever server binaries came first.
#[tokio::test]
async fn the_server_is_the_major_version_the_run_asked_for() {
    let pool = sqlx::PgPool::connect(&fresh_database().await).await.expect("connect");
    let (version,): (i32,) = sqlx::query_as("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert!((150_000..190_000).contains(&version), "a supported version: {version}");
    if let Ok(asked) = std::env::var("PGLIMIT_TEST_PG_MAJOR") {
        assert_eq!(version / 10_000, asked.parse::<i32>().expect("a major version"), "PGLIMIT_TEST_PG_MAJOR");
    }
}

/// `actions` moves on every reset, so an open `/readyz` would count logins
/// (with reset on success) for anyone who reaches the port.
#[tokio::test]
async fn readyz_shows_only_its_status_without_a_token_and_its_details_with_the_metrics_or_admin_token() {
    let tokens = [
        ("PGLIMIT_METRICS_TOKEN", "scrape-me"),
        ("PGLIMIT_API_TOKENS", "app"),
        ("PGLIMIT_ADMIN_TOKENS", "ops"),
    ];
    let app = instance(&fresh_database().await, &tokens).await;
    let read = |token: Option<&'static str>| {
        let mut request = Request::get("/readyz");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let app = app.clone();
        async move { send(&app, request.body(Body::empty()).unwrap()).await }
    };
    for token in [None, Some("wrong")] {
        let reply = read(token).await;
        assert_eq!(reply.status, StatusCode::OK, "a probe without a token still reads ready");
        assert_eq!(
            reply.body,
            serde_json::json!({ "status": "ready", "store": "postgres", "degraded": false })
        );
    }
    for token in ["scrape-me", "ops"] {
        let body = read(Some(token)).await.body;
        let details = ["instances", "actions", "policies"].map(|k| body.get(k).is_some());
        assert_eq!(details, [true; 3], "{token}: {body}");
    }
}
