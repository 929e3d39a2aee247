//! The memory fallback: Postgres really stopped and paused, not mocked.
//!
//! This binary starts a cluster of its own, because it stops it.

mod common;

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::{check, degraded, instance, remaining, send, unique, wait_for_postgres};
use pglimit::pg_cluster::{Cluster, StopMode};
use serde_json::json;
use tokio::sync::Mutex;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// Tests here stop the shared server, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

async fn cluster() -> &'static Cluster {
    tokio::task::spawn_blocking(|| CLUSTER.get_or_init(|| Cluster::throwaway().expect("test cluster")))
        .await
        .expect("cluster start-up")
}

async fn database() -> String {
    common::create_database(&cluster().await.url()).await
}

async fn stop(mode: StopMode) {
    tokio::task::spawn_blocking(move || CLUSTER.get().expect("cluster").stop(mode))
        .await
        .unwrap()
        .expect("stop");
}

async fn restart() {
    tokio::task::spawn_blocking(|| CLUSTER.get().expect("cluster").restart())
        .await
        .unwrap()
        .expect("restart");
}

/// Sends SIGSTOP or SIGCONT to the postmaster and all its children; true
/// if `kill` succeeded.
fn signal_all(signal: &str) -> bool {
    let pid = CLUSTER.get().and_then(Cluster::pid).expect("postmaster pid").to_string();
    let children = Command::new("pgrep").args(["-P", &pid]).output().expect("pgrep");
    let mut pids = vec![pid];
    pids.extend(String::from_utf8_lossy(&children.stdout).split_whitespace().map(String::from));
    Command::new("kill").arg(format!("-{signal}")).args(&pids).status().is_ok_and(|s| s.success())
}

/// The server stopped by SIGSTOP; sent SIGCONT when dropped, so that a
/// failed assertion does not leave it paused under the tests that follow.
struct Paused;

impl Paused {
    fn start() -> Self {
        assert!(signal_all("STOP"), "SIGSTOP to the server");
        Paused
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // No second panic while unwinding from a failed assertion.
        let resumed = signal_all("CONT");
        assert!(resumed || std::thread::panicking(), "SIGCONT to the server");
    }
}

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
async fn policies_choose_memory_allow_or_deny_when_postgres_is_away() {
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

/// What memory admitted during an outage is written back when Postgres
/// returns, for every algorithm: limit 5, 3 admitted from memory, then
/// exactly 2 more from Postgres in the same window. (Windows of 366 days,
/// so that no clock-aligned window ends during the test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_memory_admitted_during_an_outage_still_counts_when_postgres_returns() {
    let _serial = SERIAL.lock().await;
    let app = instance(&database().await, &[]).await;
    let body =
        |algorithm: &str| json!({ "key": algorithm, "limit": 5, "window": "366d", "algorithm": algorithm });
    stop(StopMode::Fast).await;
    for algorithm in ALGORITHMS {
        for _ in 0..3 {
            check(&app, body(algorithm)).await.assert_memory_admits();
        }
    }
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    for algorithm in ALGORITHMS {
        let mut admitted = 0;
        for _ in 0..5 {
            let reply = check(&app, body(algorithm)).await;
            assert_eq!(reply.body["store"], "postgres", "{algorithm}: {}", reply.body);
            admitted += u32::from(reply.status == StatusCode::OK);
        }
        assert_eq!(admitted, 2, "{algorithm}: 5 - 3 admitted from memory");
    }
}

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"];

/// Three instances on one database, Postgres stopped, checks on one key
/// spread over the three: with `fallback_share = "split"` (the default)
/// each enforces ceil(limit / 3), so together they admit at most
/// limit + N - 1; with "full" each enforces the whole limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_an_outage_instances_split_each_limit_between_them_unless_told_not_to() {
    let _serial = SERIAL.lock().await;
    let file = common::policy_file(
        r#"
        [policies.split]
        identifiers = { user = "text" }
        [[policies.split.buckets]]
        name = "user"
        on = ["user"]
        limit = 7
        window = "1h"

        [policies.full]
        fallback_share = "full"
        identifiers = { user = "text" }
        [[policies.full.buckets]]
        name = "user"
        on = ["user"]
        limit = 7
        window = "1h"
        "#,
    );
    let url = database().await;
    let policies = [("PGLIMIT_POLICIES", file.to_str().unwrap())];
    let apps =
        [instance(&url, &policies).await, instance(&url, &policies).await, instance(&url, &policies).await];
    for app in &apps {
        wait_for_instances(app, 3).await;
    }
    stop(StopMode::Fast).await;
    for (policy, most) in [("split", 7 + 3 - 1), ("full", 3 * 7)] {
        let body = json!({ "policy": policy, "identifiers": { "user": "u" } });
        let mut admitted = 0;
        for n in 0..30 {
            let reply = check(&apps[n % 3], body.clone()).await;
            assert_eq!(reply.body["store"], "memory", "{policy}: {}", reply.body);
            admitted += u32::from(reply.status == StatusCode::OK);
        }
        let each = if policy == "split" { 7u32.div_ceil(3) } else { 7 };
        assert_eq!(admitted, 3 * each, "{policy}: each instance enforces {each}");
        assert!(admitted <= most, "{policy}: {admitted} admitted, at most {most}");
    }
    restart().await;
    for app in &apps {
        wait_for_postgres(app, Duration::from_secs(15)).await;
    }
    let _ = std::fs::remove_file(&file);
}

/// Waits until `app` reports, on `/readyz`, `n` instances sharing its
/// database (each records itself every second).
async fn wait_for_instances(app: &pglimit::AppState, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let request = axum::http::Request::get("/readyz").body(axum::body::Body::empty()).expect("request");
        let reply = send(app, request).await;
        if reply.body["instances"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {n} instances: {}", reply.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
