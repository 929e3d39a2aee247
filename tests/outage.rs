//! An outage seen by several instances: each keeps to its share of a limit
//! in memory, and what memory admitted is written back when Postgres returns.
//!
//! This binary starts a cluster of its own, because it stops it.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::stoppable::{admin_url, database, restart, restart_as_standby, stop, SERIAL};
use common::{check, instance, readyz, send, wait_for_postgres};
use pglimit::algorithm::Algorithm;
use pglimit::pg_cluster::StopMode;
use serde_json::json;

/// What memory admitted during an outage is written back when Postgres
/// returns, for every algorithm: limit 5, 3 admitted from memory, then
/// exactly 2 more from Postgres in the same window. (Windows of 366 days,
/// so that no clock-aligned window ends during the test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_memory_admitted_during_an_outage_still_counts_when_postgres_returns() {
    let _serial = SERIAL.lock().await;
    let app = instance(&database().await, &[]).await;
    // A concurrency bucket's slots are held for its lease time: a day, the
    // longest an ad hoc lease may be.
    let period = |algorithm: Algorithm| match algorithm {
        Algorithm::Concurrency => ("lease", "1d"),
        _ => ("window", "366d"),
    };
    let body = |algorithm: Algorithm| {
        let (period, length) = period(algorithm);
        json!({ "key": algorithm.name(), "limit": 5, period: length, "algorithm": algorithm.name() })
    };
    stop(StopMode::Fast).await;
    for algorithm in Algorithm::ALL {
        for _ in 0..3 {
            check(&app, body(algorithm)).await.assert_memory_admits();
        }
    }
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    for algorithm in Algorithm::ALL {
        let mut admitted = 0;
        for _ in 0..5 {
            let reply = check(&app, body(algorithm)).await;
            assert_eq!(reply.body["store"], "postgres", "{algorithm:?}: {}", reply.body);
            admitted += u32::from(reply.status == StatusCode::OK);
        }
        assert_eq!(admitted, 2, "{algorithm:?}: 5 - 3 admitted from memory");
    }
}

/// A lease released while Postgres is away is written back when it
/// returns: the slot it held in Postgres is free again, not held for the
/// rest of its (day-long) lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_during_an_outage_is_released_in_postgres_when_it_returns() {
    let _serial = SERIAL.lock().await;
    let app = instance(&database().await, &[]).await;
    let body = json!({ "key": "leased", "limit": 1, "algorithm": "concurrency", "lease": "1d" });
    let taken = check(&app, body.clone()).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.body);
    let lease = taken.body["lease"]["id"].clone();
    stop(StopMode::Fast).await;
    check(&app, json!({ "key": "during", "limit": 5, "window": "366d" })).await.assert_memory_admits();
    let released = common::call(&app, "POST", "/release", json!({ "lease": lease })).await;
    assert_eq!((released.status, &released.body), (StatusCode::OK, &json!({ "released": true })));
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    let again = check(&app, body).await;
    assert_eq!((again.status, &again.body["store"]), (StatusCode::OK, &json!("postgres")), "{}", again.body);
}

/// During an outage a release is kept only for a lease this instance can
/// vouch for: ids it never issued (a lone instance: every lease is its own)
/// are refused, however many, and its own lease's release is still kept
/// and written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_never_issued_are_not_kept_as_released_during_an_outage_and_a_real_release_is() {
    let _serial = SERIAL.lock().await;
    let app = instance(&database().await, &[]).await;
    let body = json!({ "key": "vouched", "limit": 1, "algorithm": "concurrency", "lease": "1d" });
    let taken = check(&app, body.clone()).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.body);
    stop(StopMode::Fast).await;
    check(&app, json!({ "key": "during", "limit": 5, "window": "366d" })).await.assert_memory_admits();
    for _ in 0..500 {
        let made_up = format!("lease_{:032x}", rand::random::<u128>());
        let refused = common::call(&app, "POST", "/release", json!({ "lease": made_up })).await;
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.body);
    }
    let released =
        common::call(&app, "POST", "/release", json!({ "lease": taken.body["lease"]["id"] })).await;
    assert_eq!((released.status, &released.body), (StatusCode::OK, &json!({ "released": true })));
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    let again = check(&app, body).await;
    assert_eq!((again.status, &again.body["store"]), (StatusCode::OK, &json!("postgres")), "{}", again.body);
}

/// The connection actions keep is from before the outage once Postgres
/// returns: it is reopened, so the first action after succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_action_after_postgres_returns_runs_on_a_fresh_connection() {
    let _serial = SERIAL.lock().await;
    let app = instance(&database().await, &[]).await;
    let list = || Request::get("/admin/blocks").body(Body::empty()).expect("a request");
    assert_eq!(send(&app, list()).await.status, StatusCode::OK, "the actions' connection opens");
    stop(StopMode::Fast).await;
    check(&app, json!({ "key": "during", "limit": 5, "window": "366d" })).await.assert_memory_admits();
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    let listed = send(&app, list()).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
}

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

        [policies.token]
        identifiers = { user = "text" }
        [[policies.token.buckets]]
        name = "user"
        on = ["user"]
        limit = 9
        window = "366d"
        algorithm = "token_bucket"

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
        assert!(admitted <= most, "{policy}: {admitted} admitted, at most limit + N - 1 = {most}");
    }
    // One token taken on each instance, at its share (ceil(9 / 3) = 3)...
    let token = json!({ "policy": "token", "identifiers": { "user": "u" } });
    for app in &apps {
        check(app, token.clone()).await.assert_memory_admits();
    }
    restart().await;
    for app in &apps {
        wait_for_postgres(app, Duration::from_secs(15)).await;
    }
    // ...is written back as one of the 9 shared tokens, not one of 3: 6 left.
    let mut admitted = 0;
    for n in 0..9 {
        let reply = check(&apps[n % 3], token.clone()).await;
        assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
        admitted += u32::from(reply.status == StatusCode::OK);
    }
    assert_eq!(admitted, 6, "9 tokens, 3 taken from memory during the outage");
    let _ = std::fs::remove_file(&file);
}

/// Waits until `app` reports, on `/readyz`, `n` instances sharing its
/// database (each records itself every 2 s).
async fn wait_for_instances(app: &pglimit::AppState, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let body = readyz(app).await;
        if body["instances"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {n} instances: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A failover as a DNS name sees it: the server comes back read-only (a
/// standby), which answers but cannot count, so the instance stays on
/// memory; once promoted it takes the write-back and serves again. The
/// recovery would return after its write-back failed 3 times, a probe
/// (500 ms) apart: 3 s of memory answers show it did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_counts_as_gone_until_it_is_promoted() {
    let _serial = SERIAL.lock().await;
    let app = instance(&database().await, &[]).await;
    let body = json!({ "key": "failover", "limit": 6, "window": "366d" });
    assert_eq!(check(&app, body.clone()).await.body["store"], "postgres");
    stop(StopMode::Fast).await;
    restart_as_standby().await;
    let until = Instant::now() + Duration::from_secs(3);
    let mut admitted = 0;
    while Instant::now() < until {
        let reply = check(&app, json!({ "key": "failover-probe", "limit": 1000, "window": "366d" })).await;
        reply.assert_memory_admits();
        tokio::time::sleep(Duration::from_millis(100)).await;
        admitted += 1;
    }
    assert!(admitted > 10, "checks went on being answered: {admitted}");
    for _ in 0..2 {
        check(&app, body.clone()).await.assert_memory_admits();
    }
    let admin = sqlx::PgPool::connect(&admin_url().await).await.expect("a read-only connection");
    sqlx::query("SELECT pg_promote(true, 60)").execute(&admin).await.expect("promote");
    admin.close().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    let mut admitted = 0;
    for _ in 0..5 {
        let reply = check(&app, body.clone()).await;
        assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
        admitted += u32::from(reply.status == StatusCode::OK);
    }
    assert_eq!(admitted, 3, "6 - 1 before - 2 from memory, written back");
}

/// Denials answered from memory while Postgres is away are kept, and
/// written to the top list by the periodic flush once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_answered_from_memory_during_an_outage_reach_the_top_list_when_postgres_returns() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    // The whole service: its background tasks, the flushes among them, run while it is held.
    let service = common::try_service(&url, &[]).await.expect("service starts");
    let app = service.state.clone();
    let body = json!({ "key": "denied-in-outage", "limit": 1, "window": "366d" });
    stop(StopMode::Fast).await;
    check(&app, body.clone()).await.assert_memory_admits();
    for _ in 0..3 {
        let reply = check(&app, body.clone()).await;
        assert_eq!((reply.status, &reply.body["degraded"]), (StatusCode::TOO_MANY_REQUESTS, &json!(true)));
    }
    assert!(app.top.flush().await.is_err(), "nothing can be written while Postgres is away");
    restart().await;
    wait_for_postgres(&app, Duration::from_secs(15)).await;
    // Read from the table, not through /admin/top, which would flush first.
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let deadline = Instant::now() + pglimit::limiter::FLUSH_EVERY * 3;
    loop {
        let (denials,): (Option<i64>,) =
            sqlx::query_as("SELECT sum(count)::bigint FROM pglimit_denials WHERE key = $1")
                .bind(common::adhoc_key("denied-in-outage").as_slice())
                .fetch_one(&pool)
                .await
                .expect("the top list's table");
        if denials == Some(3) {
            break;
        }
        assert!(Instant::now() < deadline, "not written within three flushes: {denials:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Explain during an outage tells the share of each limit this instance
/// enforces from memory, as its checks do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_during_an_outage_gives_the_share_of_the_limit_memory_enforces() {
    let _serial = SERIAL.lock().await;
    let url = database().await;
    let (a, _b) = (instance(&url, &[]).await, instance(&url, &[]).await);
    wait_for_instances(&a, 2).await;
    stop(StopMode::Fast).await;
    let body = json!({ "key": common::unique("shared"), "limit": 4, "window": "1h" });
    check(&a, body.clone()).await.assert_memory_admits();
    let told = common::call(&a, "POST", "/admin/explain", body).await;
    let bucket = &told.body["buckets"][0];
    assert_eq!((bucket["limit"].as_u64(), bucket["remaining"].as_u64()), (Some(2), Some(1)), "{}", told.body);
    assert!(told.body["why"].as_str().unwrap_or_default().contains("1/2"), "{}", told.body);
    restart().await;
    wait_for_postgres(&a, Duration::from_secs(15)).await;
}
