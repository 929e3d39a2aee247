//! Exactness under concurrency, across several service instances.

use crate::common::replay::{record_statements, seen};
use crate::common::{calls, check, count_calls, degraded, fresh_database, instance, login, unique};
use axum::http::StatusCode;
use serde_json::json;

/// Fires `n` checks of `body`, spread round-robin over `instances`, all at
/// once; returns how many were admitted, and asserts each came from Postgres.
async fn admitted(instances: &[pglimit::AppState], bodies: Vec<serde_json::Value>) -> usize {
    let tasks: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let app = instances[i % instances.len()].clone();
            tokio::spawn(async move { check(&app, body).await })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        let reply = task.await.expect("check task");
        assert_eq!(reply.body["store"], "postgres", "every decision from postgres: {}", reply.body);
        match reply.status {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}: {}", reply.body),
        }
    }
    allowed
}

async fn three_instances() -> Vec<pglimit::AppState> {
    let url = fresh_database().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        // Default settings: a timeout long enough to hide queueing would
        // hide over-admission too.
        apps.push(instance(&url, &[]).await);
    }
    apps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_one_key_admit_exactly_the_limit() {
    let apps = three_instances().await;
    let key = unique("hot");
    let bodies = (0..300).map(|_| json!({ "key": key, "limit": 50, "window": "1h" })).collect();
    assert_eq!(admitted(&apps, bodies).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_one_ip_admit_exactly_the_ip_limit() {
    let apps = three_instances().await;
    let bodies = (0..90).map(|n| login(&format!("u{n}@example.com"), "192.0.2.77")).collect();
    assert_eq!(admitted(&apps, bodies).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_one_email_admit_exactly_the_email_limit() {
    let apps = three_instances().await;
    let bodies = (0..120).map(|n| login("victim@example.com", &format!("198.51.100.{n}"))).collect();
    assert_eq!(admitted(&apps, bodies).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_multi_bucket_checks_do_not_deadlock() {
    // Checks that share some buckets but not others, in every combination:
    // if rows were locked in request order these would deadlock.
    let apps = three_instances().await;
    let bodies = (0..240)
        .map(|n| login(&format!("user{}@example.com", n % 4), &format!("203.0.113.{}", (n / 4) % 6)))
        .collect();
    // 4 emails x 6 IPs, 10 attempts per pair: each pair admits its 5, which
    // fills each IP's 20 exactly and leaves each email under its 50.
    assert_eq!(admitted(&apps, bodies).await, 4 * 6 * 5);
}

/// From now on, counts the statements that write counters in `url`'s
/// database: one per store call (each call's upsert or batch function
/// inserts once). Exact and synchronous, where the server's statistics are
/// flushed late and also count the instances' heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_on_one_lane_are_batched_and_decided_as_if_in_sequence() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_DB_POOL_SIZE", "1")]).await;
    let key = unique("batched");
    let counter = count_calls(&url).await;
    let log = record_statements(&url).await;
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let app = app.clone();
            let body = json!({ "key": key, "limit": 120, "window": "1h" });
            tokio::spawn(async move { check(&app, body).await })
        })
        .collect();
    let mut remaining = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.body["store"], "postgres");
        if reply.status == StatusCode::OK {
            remaining.push(reply.body["remaining"].as_u64().unwrap());
        }
    }
    // Each admitted check saw the state the one before it left: 119, 118, ... 0.
    remaining.sort_unstable();
    assert_eq!(remaining, (0..120).collect::<Vec<u64>>());
    // 200 checks on one lane took far fewer calls than checks.
    let calls = calls(&counter).await;
    assert!(calls < 100, "{calls} calls for 200 checks");
    // The key's checks in a batch were proposed as one row.
    let statements = seen(&log).await;
    assert!(statements.contains(&"hot_upsert.sql"), "statements: {statements:?}");
}

#[tokio::test]
async fn a_flood_on_a_denied_key_is_answered_without_statements() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let body = json!({ "key": unique("flood"), "limit": 2, "window": "1h" });
    for _ in 0..3 {
        check(&app, body.clone()).await;
    }
    let counter = count_calls(&url).await;
    for _ in 0..200 {
        let reply = check(&app, body.clone()).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.body["remaining"], 0);
        assert!(reply.body["retry_after_s"].as_u64().unwrap() > 3500);
    }
    let calls = calls(&counter).await;
    assert!(calls <= 1, "{calls} calls to postgres for 200 denied checks");
    // A peek still asks Postgres.
    let mut peek = body.clone();
    peek["cost"] = json!(0);
    assert_eq!(check(&app, peek).await.body["remaining"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_on_new_keys_stay_on_postgres_and_exact() {
    // Batches of distinct fixed-window keys take the plain upsert; a key
    // another instance creates after our statement's snapshot must still be
    // answered by Postgres (not a decode error that trips the fallback).
    let url = fresh_database().await;
    let (a, b) = (instance(&url, &[]).await, instance(&url, &[]).await);
    for round in 0..5 {
        let keys: Vec<String> = (0..40).map(|i| format!("race-{round}-{i}-{}", unique(""))).collect();
        let tasks: Vec<_> = keys
            .iter()
            .flat_map(|key| [a.clone(), b.clone(), a.clone(), b.clone()].map(|app| (app, key.clone())))
            .map(|(app, key)| {
                tokio::spawn(
                    async move { check(&app, json!({ "key": key, "limit": 1, "window": "1h" })).await },
                )
            })
            .collect();
        // Four tries per key (tasks in key order), limit 1: one admitted, three denied.
        let mut allowed = vec![0; keys.len()];
        for (i, task) in tasks.into_iter().enumerate() {
            let reply = task.await.unwrap();
            assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
            assert!(reply.body["reset_at"].is_string(), "{}", reply.body);
            match reply.status {
                StatusCode::OK => allowed[i / 4] += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected status {other}: {}", reply.body),
            }
        }
        for (key, allowed) in keys.iter().zip(allowed) {
            assert_eq!(allowed, 1, "round {round}: {key} admitted {allowed} of 4");
        }
    }
    assert!(!degraded(&a).await && !degraded(&b).await);
}

/// A policy check is admitted on the upsert's snapshot; when another
/// instance fills one of its buckets between that snapshot and the upsert's
/// lock, the check is decided again with locks: denied, and its other
/// bucket keeps nothing of it (all or nothing across instances). The retry
/// is counted in `pglimit_upsert_retries_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_check_whose_bucket_fills_under_its_upsert_takes_nothing() {
    use pglimit::algorithm::Algorithm;
    use pglimit::storage::{BucketSpec, Check, MemoryFallback, Store};
    const RETRIES: &str = "pglimit_upsert_retries_total";
    let url = fresh_database().await;
    // An instance for its /metrics: the recorder is the process's, so it
    // counts the retries of the store below too.
    let observer = instance(&url, &[]).await;
    let retries_before = crate::common::metric(&observer, RETRIES).await;
    let pg = crate::common::pg_store(&url).await;
    let bucket = |n: u8, limit| BucketSpec {
        name: std::sync::Arc::from(format!("b{n}")),
        key: [n; 32],
        limit,
        window: std::time::Duration::from_secs(3600),
        algorithm: Algorithm::FixedWindow,
        lockout: None,
        calendar: None,
    };
    let (roomy, tight) = (bucket(1, 5), bucket(2, 1));
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::query(
        "INSERT INTO pglimit_buckets (key, count, expires_at) VALUES ($1, 0, now() + interval '1 hour')",
    )
    .bind(tight.key.as_slice())
    .execute(&pool)
    .await
    .expect("an empty bucket");
    // Another instance is taking the tight bucket's last unit, not yet committed.
    let mut other = pool.begin().await.expect("begin");
    sqlx::query("UPDATE pglimit_buckets SET count = 1 WHERE key = $1")
        .bind(tight.key.as_slice())
        .execute(&mut *other)
        .await
        .expect("take the last unit");
    let policy =
        Check { buckets: vec![roomy.clone(), tight], cost: 1, fallback: MemoryFallback::Refuse, lease: None };
    let checking = tokio::spawn(async move { pg.check(&policy).await });
    crate::common::wait_for_a_backend_waiting_on(&pool, "Lock").await;
    other.commit().await.expect("commit");

    let answer = checking.await.expect("check task").expect("postgres answers");
    let allowed: Vec<bool> = answer.buckets.iter().map(|b| b.allowed).collect();
    assert_eq!(allowed, [true, false], "the roomy bucket fits, the tight one is full");
    assert_eq!(answer.buckets[0].remaining, 5, "the denied check took nothing from the roomy bucket");
    let live: (i64,) = sqlx::query_as(
        "SELECT coalesce(sum(count), 0)::bigint FROM pglimit_buckets WHERE key = $1 AND expires_at > now()",
    )
    .bind(roomy.key.as_slice())
    .fetch_one(&pool)
    .await
    .expect("the roomy bucket");
    assert_eq!(live.0, 0, "the roomy bucket holds a unit of a denied check");
    pool.close().await;
    let retries = crate::common::metric(&observer, RETRIES).await;
    assert!(retries > retries_before, "the retry was not counted: {retries_before} then {retries}");
}

/// A sliding-window or token-bucket check admitted on the upsert's snapshot
/// but denied on its locked row (another instance took the last unit in
/// between) is decided again with locks, so that its answer's figures agree
/// with the denial: nothing left, and a time to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sliding_window_check_whose_row_fills_under_its_upsert_is_denied_with_figures() {
    let take_last = "UPDATE pglimit_buckets SET count = 2 WHERE key = $1";
    row_fills_under_the_upsert(pglimit::algorithm::Algorithm::SlidingWindow, take_last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_bucket_check_whose_row_fills_under_its_upsert_is_denied_with_figures() {
    // Limit 2 an hour: a token every 30 minutes, so the first check left the
    // arrival time 30 minutes ahead and 30 more empty the bucket.
    let take_last = "UPDATE pglimit_buckets SET tat_us = tat_us + 1800000000 WHERE key = $1";
    row_fills_under_the_upsert(pglimit::algorithm::Algorithm::TokenBucket, take_last).await;
}

/// Admits one check of a bucket of limit 2, then checks again while
/// `take_last` (another instance taking the last unit) waits to commit.
async fn row_fills_under_the_upsert(algorithm: pglimit::algorithm::Algorithm, take_last: &str) {
    use pglimit::storage::{BucketSpec, Check, MemoryFallback};
    let url = fresh_database().await;
    let pg = crate::common::pg_store(&url).await;
    let bucket = BucketSpec {
        name: std::sync::Arc::from("filling"),
        key: [7; 32],
        limit: 2,
        window: std::time::Duration::from_secs(3600),
        algorithm,
        lockout: None,
        calendar: None,
    };
    let key = bucket.key;
    let now: chrono::DateTime<chrono::Utc> = "2031-06-01T00:10:00Z".parse().unwrap();
    let check = Check { buckets: vec![bucket], cost: 1, fallback: MemoryFallback::Refuse, lease: None };
    assert!(pg.check_as_of(&check, now).await.expect("postgres answers").allowed());
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let mut other = pool.begin().await.expect("begin");
    sqlx::query(take_last).bind(key.as_slice()).execute(&mut *other).await.expect("take the last unit");
    let row = "SELECT row(count, expires_at, tat_us)::text FROM pglimit_buckets WHERE key = $1";
    let taken: (String,) =
        sqlx::query_as(row).bind(key.as_slice()).fetch_one(&mut *other).await.expect("the row");
    let checking = tokio::spawn(async move { pg.check_as_of(&check, now).await });
    crate::common::wait_for_a_backend_waiting_on(&pool, "Lock").await;
    other.commit().await.expect("commit");

    let answer = checking.await.expect("check task").expect("postgres answers");
    let bucket = &answer.buckets[0];
    assert!(!bucket.allowed, "the row was full when the upsert locked it");
    assert_eq!(bucket.remaining, 0, "a denied check reports nothing left");
    assert!(bucket.retry_at.is_some_and(|t| t > now), "a denied check says when to retry");
    let after: (String,) = sqlx::query_as(row).bind(key.as_slice()).fetch_one(&pool).await.expect("the row");
    assert_eq!(after, taken, "the denied check took nothing");
    pool.close().await;
}
