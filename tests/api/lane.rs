//! A lane keeps several calls in flight, yet checks on one key are decided
//! in the order they were queued; a connection the server ends is replaced.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use crate::common::{adhoc_key, check, fresh_database, pg_store, unique};
use futures_util::poll;
use pglimit::algorithm::Algorithm;
use pglimit::storage::{BucketSpec, Check, Key, MemoryFallback, Store, StoreKind};

fn bucket(key: Key, limit: u64, algorithm: Algorithm) -> BucketSpec {
    // A week: the token bucket refills under one token in the test's time.
    let window = Duration::from_secs(7 * 24 * 3600);
    BucketSpec { name: Arc::from("b"), key, limit, window, algorithm, lockout: None, calendar: None }
}

fn batch(buckets: Vec<BucketSpec>) -> Check {
    Check { buckets, cost: 1, fallback: MemoryFallback::Refuse, lease: None }
}

/// Queues `checks` in order (a check is queued when its future is first
/// polled, so each is polled once, in turn, before any is awaited) and
/// returns, for each check with a bucket on `key`, what that bucket had
/// left, in queue order.
async fn remaining_on(store: &pglimit::storage::PgStore, checks: &[Check], key: &Key) -> Vec<u64> {
    let mut pending: Vec<_> = checks.iter().map(|c| Box::pin(store.check(c))).collect();
    let mut answers = Vec::with_capacity(pending.len());
    for check in &mut pending {
        answers.push(match poll!(check.as_mut()) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        });
    }
    let mut left = Vec::new();
    for ((check, answer), future) in checks.iter().zip(answers).zip(pending) {
        let answer = match answer {
            Some(answer) => answer,
            None => future.await,
        }
        .expect("decided");
        assert_eq!(answer.store, StoreKind::Postgres);
        if let Some(i) = check.buckets.iter().position(|b| &b.key == key) {
            assert!(answer.allowed(), "the limits are above the checks sent");
            left.push(answer.buckets[i].remaining);
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checks_on_one_key_are_decided_in_queue_order_while_other_keys_keep_every_connection_busy() {
    let store = pg_store(&fresh_database().await).await;
    for algorithm in Algorithm::ALL {
        let hot = adhoc_key(&unique("ordered"));
        // Each check on the hot key comes between checks on fresh keys, so
        // calls without it can start while a call with it is in flight.
        let checks: Vec<Check> = (0..150)
            .flat_map(|_| {
                let other = || batch(vec![bucket(adhoc_key(&unique("other")), 5, algorithm)]);
                [other(), batch(vec![bucket(hot, 1000, algorithm)]), other()]
            })
            .collect();
        let left = remaining_on(&store, &checks, &hot).await;
        assert_eq!(left, (850..1000).rev().collect::<Vec<u64>>(), "{algorithm:?}");
    }
}

/// Makes the first write of `key` sleep on the server for a second, so that
/// the call carrying it is in flight for that long.
async fn make_first_write_slow(pool: &sqlx::PgPool, key: &Key) {
    let function = "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$";
    sqlx::query(function).execute(pool).await.expect("create the trigger function");
    let trigger = format!(
        "CREATE TRIGGER slow_insert BEFORE INSERT ON pglimit_buckets FOR EACH ROW
         WHEN (NEW.key = '\\x{}'::bytea) EXECUTE FUNCTION slow_insert()",
        hex::encode(key)
    );
    sqlx::query(&trigger).execute(pool).await.expect("create the trigger");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_check_held_back_holds_back_later_checks_on_its_other_keys() {
    let url = fresh_database().await;
    let store = pg_store(&url).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (hot, shared) = (adhoc_key(&unique("hot")), adhoc_key(&unique("shared")));
    make_first_write_slow(&pool, &hot).await;
    let fw = Algorithm::FixedWindow;
    let first = tokio::spawn({
        let (store, check) = (store.clone(), batch(vec![bucket(hot, 10, fw)]));
        async move { store.check(&check).await }
    });
    crate::common::wait_for_a_backend_waiting_on(&pool, "PgSleep").await;
    // `both` waits for the call in flight on `hot`; `alone` is free, but
    // must wait behind `both`, queued before it on `shared`.
    let (both, alone) =
        (batch(vec![bucket(hot, 10, fw), bucket(shared, 10, fw)]), batch(vec![bucket(shared, 10, fw)]));
    let left = remaining_on(&store, &[both, alone], &shared).await;
    assert_eq!(left, [9, 8]);
    assert_eq!(first.await.expect("first check").expect("decided").buckets[0].remaining, 9);
    pool.close().await;
}

/// A maintenance restart or `pg_terminate_backend` ends pglimit's
/// connections while the server stays up: the next checks are answered by
/// Postgres on new connections, not failed and not answered from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_ends_are_replaced_without_a_failed_check() {
    let url = fresh_database().await;
    let app = crate::common::instance(&url, &[]).await;
    let body = json!({ "key": unique("terminated"), "limit": 100, "window": "1h" });
    assert_eq!(check(&app, body.clone()).await.body["store"], "postgres");
    let admin = sqlx::PgPool::connect(&url).await.expect("admin");
    let ended: (i64,) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(&admin)
    .await
    .expect("terminate");
    assert!(ended.0 >= 2, "pglimit's connections were ended: {}", ended.0);
    for n in 0..20 {
        let reply = check(&app, body.clone()).await;
        assert_eq!(
            (reply.status, reply.body["store"].as_str()),
            (StatusCode::OK, Some("postgres")),
            "check {n}: {}",
            reply.body
        );
    }
}
