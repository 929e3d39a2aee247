//! pglimit behind a real PgBouncer, in session and in transaction mode,
//! configured as its users usually have it (`ignore_startup_parameters =
//! extra_float_digits`): exact across instances, every answer from
//! Postgres, actions heard, the cleanup, the server-side timeouts, and an
//! outage of the server behind the pooler; and pglimit's SQL functions
//! called through it (`sql`).
//!
//! This binary starts a cluster of its own, because it stops it; its tests
//! take [`SERIAL`] and run one at a time.

mod common;
#[path = "pooler/sql.rs"]
mod sql;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::pgbouncer::{self, Mode, PgBouncer};
use common::stoppable::{database, restart, stop, SERIAL};
use common::{call, check, degraded, instance, login, readyz, stored_count, unique, wait_for_postgres};
use pglimit::pg_cluster::StopMode;
use pglimit::storage::{Pooler, Reach};
use pglimit::AppState;
use serde_json::{json, Value};

/// A fresh database, PgBouncer in `mode` in front of it, and both URLs.
async fn behind(mode: Mode) -> (PgBouncer, String, String) {
    let direct = database().await;
    let bouncer = pgbouncer::start(&direct, mode);
    let pooled = bouncer.url(&direct);
    (bouncer, direct, pooled)
}

async fn pooled_instance(url: &str, mode: Mode, extra: &[(&str, &str)]) -> AppState {
    let mut vars = vec![("PGLIMIT_DB_POOLER", mode.name())];
    vars.extend_from_slice(extra);
    instance(url, &vars).await
}

/// `body` sent `times` times at once, spread over `apps`.
async fn all_at_once(apps: &[AppState], body: Value, times: usize) -> Vec<common::Reply> {
    let mut sent = tokio::task::JoinSet::new();
    for i in 0..times {
        let (app, body) = (apps[i % apps.len()].clone(), body.clone());
        sent.spawn(async move { check(&app, body).await });
    }
    let mut replies = Vec::with_capacity(times);
    while let Some(reply) = sent.join_next().await {
        replies.push(reply.expect("a check"));
    }
    replies
}

fn admitted_from_postgres(replies: &[common::Reply]) -> usize {
    for reply in replies {
        assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
    }
    replies.iter().filter(|r| r.status == StatusCode::OK).count()
}

async fn three_instances_admit_exactly_the_limit_from_postgres(mode: Mode) {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _, pooled) = behind(mode).await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(pooled_instance(&pooled, mode, &[]).await);
    }
    let key = json!({ "key": unique("shared"), "limit": 10, "window": "1h" });
    assert_eq!(admitted_from_postgres(&all_at_once(&apps, key, 30).await), 10, "{mode:?}");
    let login = login(&format!("{}@example.com", unique("alice")), "203.0.113.7");
    assert_eq!(admitted_from_postgres(&all_at_once(&apps, login, 9).await), 5, "{mode:?}: email_ip's limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_pooler_three_instances_admit_exactly_the_limit_from_postgres() {
    three_instances_admit_exactly_the_limit_from_postgres(Mode::Session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_three_instances_admit_exactly_the_limit_from_postgres() {
    three_instances_admit_exactly_the_limit_from_postgres(Mode::Transaction).await;
}

/// B remembers a denial; a reset through A reaches it: by notification in
/// session mode, by the heartbeat's read of the actions generation in
/// transaction mode (no LISTEN there), within two heartbeats.
async fn a_reset_on_one_instance_reaches_the_other(mode: Mode) {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _, pooled) = behind(mode).await;
    let (a, b) = (pooled_instance(&pooled, mode, &[]).await, pooled_instance(&pooled, mode, &[]).await);
    let alice = login(&format!("{}@example.com", unique("alice")), "203.0.113.8");
    for _ in 0..5 {
        assert_eq!(check(&a, alice.clone()).await.status, StatusCode::OK);
    }
    assert_eq!(check(&b, alice.clone()).await.status, StatusCode::TOO_MANY_REQUESTS, "B remembers it");
    let reply = call(&a, "POST", "/reset", alice.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // Heartbeats every 2 s; the margin covers a beat delayed by a busy host.
    let deadline = Instant::now() + Duration::from_secs(2 * 2 + 10);
    loop {
        let next = check(&b, alice.clone()).await;
        if next.status == StatusCode::OK {
            assert_eq!(next.body["store"], "postgres", "{}", next.body);
            break;
        }
        assert!(Instant::now() < deadline, "{mode:?}: B never heard of the reset: {}", next.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let block = json!({ "policy": "login", "identifiers": { "ip": "203.0.113.8" }, "for": "1m" });
    assert_eq!(call(&a, "POST", "/admin/blocks", block).await.status, StatusCode::OK);
    let audit = call(&b, "GET", "/admin/audit?action=block", Value::Null).await;
    assert_eq!(
        audit.body["entries"][0]["target"], "login/ip",
        "{mode:?}: the block's audit row: {}",
        audit.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_pooler_a_reset_on_one_instance_reaches_the_other() {
    a_reset_on_one_instance_reaches_the_other(Mode::Session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_reset_on_one_instance_reaches_the_other() {
    a_reset_on_one_instance_reaches_the_other(Mode::Transaction).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_the_cleanup_deletes_expired_rows() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, direct, pooled) = behind(Mode::Transaction).await;
    let app = pooled_instance(&pooled, Mode::Transaction, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    for _ in 0..20 {
        check(&app, json!({ "key": unique("gone"), "limit": 5, "window": "100ms" })).await;
    }
    let live = unique("live");
    check(&app, json!({ "key": live, "limit": 2, "window": "1h" })).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reach = Reach { pooler: Pooler::Transaction, schema: None };
    let deleted = common::pg_store_through(&pooled, reach).await.cleanup().await.expect("cleanup");
    assert_eq!(deleted, 20);
    assert_eq!(stored_count(&direct, &live).await, 1, "the live row and its count stay");
}

/// A row locked by a stuck transaction: the server's own lock timeout
/// (which pglimit sets in every transaction behind a pooler) cancels the
/// check's statement, so it is never counted once the lock is free. With
/// the settings lost, the service would give up on its side and the
/// statement would wait on the server, then commit a second count.
async fn a_stalled_statement_is_cancelled_by_the_server(mode: Mode) {
    let _serial = SERIAL.lock().await;
    let (_bouncer, direct, pooled) = behind(mode).await;
    // lock_timeout is 18 x the DB timeout: 1.8 s here.
    let app = pooled_instance(&pooled, mode, &[("PGLIMIT_DB_TIMEOUT_MS", "100")]).await;
    let name = unique("stuck");
    let stuck = json!({ "key": name, "limit": 100, "window": "1h" });
    assert_eq!(check(&app, stuck.clone()).await.body["store"], "postgres");

    let pool = sqlx::PgPool::connect(&direct).await.expect("connect");
    let holder = common::lock_row(&pool, &name).await;
    let reply = check(&app, stuck.clone()).await;
    reply.assert_memory_admits();
    assert!(!degraded(&app).await, "{mode:?}: one stuck row switched the instance to memory");
    let waiting: (i64,) =
        sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            .fetch_one(&pool)
            .await
            .expect("pg_stat_activity");
    assert_eq!(waiting.0, 0, "{mode:?}: the check's statement still waits on the server");
    holder.rollback().await.expect("release");
    pool.close().await;
    assert_eq!(stored_count(&direct, &name).await, 1, "{mode:?}: the cancelled check was counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_session_pooler_a_stalled_statement_is_cancelled_by_the_server() {
    a_stalled_statement_is_cancelled_by_the_server(Mode::Session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_stalled_statement_is_cancelled_by_the_server() {
    a_stalled_statement_is_cancelled_by_the_server(Mode::Transaction).await;
}

/// PgBouncer stays up while the server behind it stops: the instance
/// answers from memory, and once the server is back, from Postgres again,
/// with what memory admitted written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_an_outage_of_the_server_is_survived_and_written_back() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _, pooled) = behind(Mode::Transaction).await;
    let app = pooled_instance(&pooled, Mode::Transaction, &[]).await;
    let body = json!({ "key": unique("outage"), "limit": 5, "window": "366d" });
    stop(StopMode::Fast).await;
    for _ in 0..3 {
        check(&app, body.clone()).await.assert_memory_admits();
    }
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(30)).await;
    assert_eq!(readyz(&app).await["store"], "postgres");
    let replies = all_at_once(std::slice::from_ref(&app), body, 5).await;
    assert_eq!(admitted_from_postgres(&replies), 2, "5 - 3 admitted from memory");
}

/// A lockout (a bucket with `block_for`) is written by the batch function,
/// with the bucket's name among its values: the second check starts it, and
/// a second instance, which remembers nothing, is refused by Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_lockout_is_kept_by_postgres() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _, pooled) = behind(Mode::Transaction).await;
    let file = common::policy_file(
        "[policies.otp]\nidentifiers = { user = \"text\" }\n[[policies.otp.buckets]]\n\
         name = \"user\"\non = [\"user\"]\nlimit = 1\nwindow = \"1h\"\nblock_for = \"2h\"\n",
    );
    let env = [("PGLIMIT_POLICIES", file.to_str().expect("a UTF-8 path"))];
    let (a, b) = (
        pooled_instance(&pooled, Mode::Transaction, &env).await,
        pooled_instance(&pooled, Mode::Transaction, &env).await,
    );
    let otp = json!({ "policy": "otp", "identifiers": { "user": unique("u") } });
    assert_eq!(check(&a, otp.clone()).await.status, StatusCode::OK);
    let denied = check(&a, otp.clone()).await;
    assert_eq!((denied.status, &denied.body["blocked_by"]), (StatusCode::TOO_MANY_REQUESTS, &json!("user")));
    let elsewhere = check(&b, otp).await;
    assert_eq!(elsewhere.body["store"], "postgres", "{}", elsewhere.body);
    assert!(
        elsewhere.body["retry_after_s"].as_u64().unwrap_or(0) > 3600,
        "the 2 h lockout: {}",
        elsewhere.body
    );
}

/// Without LISTEN, overrides changes are found by the poll: within twice
/// its period (a change just after one poll waits for the next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_an_api_override_reaches_the_other_instance_by_the_poll() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _, pooled) = behind(Mode::Transaction).await;
    let a = pooled_instance(&pooled, Mode::Transaction, &[]).await;
    let b = pooled_instance(&pooled, Mode::Transaction, &[]).await;
    let bound = pglimit::storage::OVERRIDES_POLL_EVERY * 2;
    let mut peek = login("vip@example.com", "203.0.113.8");
    peek["cost"] = json!(0);
    let set =
        json!({ "policy": "login", "when": { "email": "vip@example.com" }, "limits": { "email_ip": 50 } });
    let added = call(&a, "POST", "/admin/overrides", set).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    let id = added.body["id"].clone();
    let took = until(&b, &peek, |body| body["override"]["id"] == id).await;
    assert!(took < bound, "applied after {took:?}");

    let removed =
        call(&a, "DELETE", &format!("/admin/overrides/{}", id.as_str().unwrap()), Value::Null).await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    let took = until(&b, &peek, |body| body.get("override").is_none()).await;
    assert!(took < bound, "removed after {took:?}");
}

/// No release is heard behind a transaction pooler (no LISTEN): a check
/// held for a slot rechecks every `RELEASE_POLL` instead of sleeping until
/// the lease ends (60 s here) and answering 429 at its deadline (20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_check_waiting_for_a_slot_is_admitted_after_another_instance_releases_it(
) {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _, pooled) = behind(Mode::Transaction).await;
    let a = pooled_instance(&pooled, Mode::Transaction, &[]).await;
    let b = pooled_instance(&pooled, Mode::Transaction, &[]).await;
    let slot = json!({ "key": unique("export"), "limit": 1, "algorithm": "concurrency", "lease": "60s" });
    let held = check(&a, slot.clone()).await;
    assert_eq!(held.status, StatusCode::OK, "{}", held.body);
    let mut waiting = slot;
    waiting["max_wait"] = json!("20s");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { check(&b, waiting).await }
    });
    let started = Instant::now();
    while b.waiting.queues().held() == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the check was never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = call(&a, "POST", "/release", json!({ "lease": held.body["lease"]["id"] })).await;
    assert_eq!(released.body["released"], true, "{}", released.body);
    let answer = waiter.await.expect("the waiting check");
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "admitted after the release, not at its deadline: {}",
        answer.body
    );
    assert!(answer.body["lease"]["id"].is_string(), "{}", answer.body);
}

/// Sends `body` to `app` until its answer satisfies `done`; how long that took.
async fn until(app: &AppState, body: &Value, done: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let reply = check(app, body.clone()).await;
        if done(&reply.body) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(15), "never: {}", reply.body);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The top list's statements through a transaction pooler: two instances'
/// denials written and summed exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_the_top_list_sums_both_instances_denials() {
    let _serial = SERIAL.lock().await;
    let mode = Mode::Transaction;
    let (_bouncer, _, pooled) = behind(mode).await;
    let (a, b) = (pooled_instance(&pooled, mode, &[]).await, pooled_instance(&pooled, mode, &[]).await);
    let body = json!({ "key": "pooled-denials", "limit": 1, "window": "1h" });
    assert_eq!(check(&a, body.clone()).await.status, StatusCode::OK);
    for app in [&a, &b, &b] {
        assert_eq!(check(app, body.clone()).await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    a.top.flush().await.expect("a writes through the pooler");
    let listed = call(&b, "GET", "/admin/top?policy=_adhoc", Value::Null).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.body["keys"][0]["denials"], 3, "{}", listed.body);
}
