//! Shared test harness: a real PostgreSQL, and service instances on it.
//!
//! With `DATABASE_URL` unset, each test binary starts one throwaway cluster
//! (loopback, random port, deleted at exit) and every test gets a database of
//! its own in it. With `DATABASE_URL` set, the databases are created there
//! (the role needs CREATEDB). Tests never skip: no PostgreSQL is a failure.
// Each test binary uses a different part of this harness.
#![allow(dead_code)]

pub mod backend;
pub mod caddy;
pub mod calendar_replay;
pub mod db;
pub mod docs;
pub mod envoy;
pub mod nginx;
pub mod pgbouncer;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod replay;
pub mod stoppable;
pub mod traefik;

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use pglimit::pg_cluster::Cluster;
use pglimit::{AppState, Config, Service};
use serde_json::Value;
use tower::ServiceExt;

// As `dead_code` above: some test binaries use none of these.
#[allow(unused_imports)]
pub use db::*;

pub const SECRET: &str = "test-secret-test-secret-test-secret-0123";

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The server all tests of this binary share (none of them stops it).
fn admin_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return url;
    }
    CLUSTER
        .get_or_init(|| {
            Cluster::throwaway().unwrap_or_else(|e| panic!("cannot start a test PostgreSQL: {e}"))
        })
        .url()
}

/// A URL for a new, empty database on the shared server.
pub async fn fresh_database() -> String {
    let admin = tokio::task::spawn_blocking(admin_url).await.expect("cluster start-up");
    create_database(&admin).await
}

/// Creates a new, empty database on the server of `admin`; returns its URL.
pub async fn create_database(admin: &str) -> String {
    let name = format!("t_{:016x}", rand::random::<u64>());
    let pool = sqlx::PgPool::connect(admin).await.expect("connect to the test server");
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.expect("create a test database");
    pool.close().await;
    with_database(admin, &name)
}

/// Waits until `app` answers from Postgres again: checks a new key every
/// 100 ms until one is decided by Postgres, admitted and no longer degraded.
/// An answer, not the instance's flag: the flag could clear while answers
/// still came from memory.
pub async fn wait_for_postgres(app: &AppState, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let probe = serde_json::json!({ "key": unique("probe"), "limit": 1, "window": "1s" });
        let reply = check(app, probe).await;
        if reply.body["store"] == "postgres" {
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            assert_eq!(reply.body["degraded"], false, "{}", reply.body);
            return;
        }
        assert!(std::time::Instant::now() < deadline, "did not return to postgres: {}", reply.body);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Writes `toml` to a policy file of its own, for `PGLIMIT_POLICIES`.
pub fn policy_file(toml: &str) -> std::path::PathBuf {
    let file = std::env::temp_dir().join(format!("{}.toml", unique("policies")));
    std::fs::write(&file, toml).expect("policy file");
    file
}

/// `url` with its database replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_end..].find('/').map_or(base.len(), |i| authority_end + i);
    let mut out = format!("{}/{name}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// One service instance on `url`: its own pool, memory store and fallback
/// state, exactly as a separate process would have. `extra` adds or
/// overrides environment variables.
pub async fn instance(url: &str, extra: &[(&str, &str)]) -> AppState {
    try_instance(url, extra).await.unwrap_or_else(|e| panic!("service starts: {e}"))
}

/// As [`instance`], for tests of start-up itself: a start that fails is
/// its one-line message.
pub async fn try_instance(url: &str, extra: &[(&str, &str)]) -> Result<AppState, String> {
    try_service(url, extra).await.map(|service| service.state)
}

/// As [`try_instance`], the whole service: its state and its background
/// tasks (policy reloads), which stop when it is dropped.
pub async fn try_service(url: &str, extra: &[(&str, &str)]) -> Result<Service, String> {
    let mut vars: HashMap<String, String> = HashMap::from([
        ("DATABASE_URL".into(), url.to_owned()),
        ("PGLIMIT_KEY_SECRET".into(), SECRET.into()),
    ]);
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let config = Config::from_lookup(|name| vars.get(name).cloned()).expect("valid test config");
    Service::start(&config).await.map_err(|e| e.to_string())
}

/// The value of `series` (its name and labels, as `/metrics` writes them)
/// on `app`'s `/metrics`; 0 while it has no sample. The recorder is one per
/// process, so the figure counts every instance of this test binary.
pub async fn metric(app: &AppState, series: &str) -> f64 {
    let reply = send(app, Request::get("/metrics").body(Body::empty()).expect("request")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let text = reply.body.as_str().unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// A fresh database and one instance on it.
pub async fn app() -> AppState {
    instance(&fresh_database().await, &[]).await
}

/// What `app` says on `/readyz` (always 200 while it answers).
pub async fn readyz(app: &AppState) -> Value {
    let reply = send(app, Request::get("/readyz").body(Body::empty()).expect("request")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

/// Whether `app` says, on `/readyz`, that it answers from memory.
pub async fn degraded(app: &AppState) -> bool {
    let body = readyz(app).await;
    body["degraded"].as_bool().unwrap_or_else(|| panic!("no degraded flag in {body}"))
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// Asserts a check admitted by the memory fallback, and saying so.
    pub fn assert_memory_admits(&self) {
        assert_eq!(self.status, StatusCode::OK, "{}", self.body);
        assert_eq!(
            (self.body["store"].as_str(), self.body["degraded"].as_bool()),
            (Some("memory"), Some(true)),
            "{}",
            self.body
        );
    }
}

/// Sends `request` through the router, without a socket.
pub async fn send(state: &AppState, request: Request<Body>) -> Reply {
    let response = pglimit::router(state.clone()).oneshot(request).await.expect("router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    let json = headers.get("content-type").is_some_and(|t| t.as_bytes().ends_with(b"json"));
    let body = match (bytes.is_empty(), json) {
        (true, _) => Value::Null,
        (false, true) => serde_json::from_slice(&bytes).expect("JSON body"),
        (false, false) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    Reply { status, headers, body }
}

/// `POST /check` with a raw body.
pub async fn post_raw(state: &AppState, body: impl Into<Body>, token: Option<&str>) -> Reply {
    let mut request = Request::post("/check").header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    send(state, request.body(body.into()).expect("request")).await
}

/// `method path` with a JSON body (none for `Value::Null`).
pub async fn call(state: &AppState, method: &str, path: &str, body: Value) -> Reply {
    let request = Request::builder().method(method).uri(path).header("content-type", "application/json");
    let body = if body.is_null() { Body::empty() } else { Body::from(body.to_string()) };
    send(state, request.body(body).expect("request")).await
}

pub async fn check(state: &AppState, body: Value) -> Reply {
    post_raw(state, body.to_string(), None).await
}

pub fn login(email: &str, ip: &str) -> Value {
    serde_json::json!({ "policy": "login", "identifiers": { "email": email, "ip": ip } })
}

/// The `remaining` of the bucket called `name` in a check's body.
pub fn remaining(body: &Value, name: &str) -> u64 {
    body["buckets"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == name))
        .and_then(|b| b["remaining"].as_u64())
        .unwrap_or_else(|| panic!("no bucket {name} in {body}"))
}

/// A key no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}
