//! Expired rows are deleted without cron; live ones never are.

use std::time::Duration;

use crate::common::{check, fresh_database, instance, unique};
use axum::http::StatusCode;
use serde_json::json;

async fn rows(url: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pglimit_buckets").fetch_one(&pool).await.expect("count");
    pool.close().await;
    n
}

#[tokio::test]
async fn cleanup_deletes_expired_rows_and_keeps_live_ones() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    for _ in 0..30 {
        check(&app, json!({ "key": unique("gone"), "limit": 5, "window": "100ms" })).await;
    }
    let live = unique("live");
    check(&app, json!({ "key": live, "limit": 2, "window": "1h" })).await;
    assert_eq!(rows(&url).await, 31);
    tokio::time::sleep(Duration::from_millis(150)).await;

    let deleted = crate::common::pg_store(&url).await.cleanup().await.expect("cleanup");
    assert_eq!(deleted, 30);
    assert_eq!(rows(&url).await, 1);
    // The live bucket's count survived the cleanup.
    check(&app, json!({ "key": live, "limit": 2, "window": "1h" })).await;
    let reply = check(&app, json!({ "key": live, "limit": 2, "window": "1h" })).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_stream_of_one_off_keys_keeps_the_table_bounded() {
    let url = fresh_database().await;
    // Every check samples a cleanup here, so the bound shows in a short test;
    // the default samples 1%.
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "1")]).await;
    let mut peak = 0;
    for round in 0..6 {
        for _ in 0..50 {
            check(&app, json!({ "key": unique("once"), "limit": 1, "window": "100ms" })).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if round > 0 {
            peak = peak.max(rows(&url).await);
        }
    }
    // 300 one-off keys were written; expired ones are gone, so at most
    // about one round's worth remain.
    assert!(peak <= 100, "table held {peak} rows");
}

#[tokio::test]
async fn pglimit_unlogged_sets_an_empty_table_and_refuses_to_rewrite_a_full_one() {
    let url = fresh_database().await;
    let persistence = |url: String| async move {
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let (p,): (String,) = sqlx::query_as(
            "SELECT relpersistence::text FROM pg_class WHERE oid = 'pglimit_buckets'::regclass",
        )
        .fetch_one(&pool)
        .await
        .expect("persistence");
        pool.close().await;
        p
    };
    let app = instance(&url, &[("PGLIMIT_UNLOGGED", "true")]).await;
    assert_eq!(persistence(url.clone()).await, "u");
    let reply = check(&app, json!({ "key": unique("u"), "limit": 1, "window": "1h" })).await;
    assert_eq!(reply.body["store"], "postgres");

    let vars = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", crate::common::SECRET)];
    let config = pglimit::Config::from_lookup(|name| {
        vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    })
    .expect("config");
    let refused = pglimit::Service::start(&config).await.err().expect("a full table is not rewritten");
    assert!(refused.to_string().contains("ALTER TABLE pglimit_buckets SET LOGGED"), "{refused}");
    assert_eq!(persistence(url.clone()).await, "u", "left as it was");
}

#[tokio::test]
async fn cleanup_deletes_ended_leases_and_keeps_live_ones() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let lease = |key: String, lease: &str| json!({ "key": key, "limit": 1, "algorithm": "concurrency", "lease": lease });
    for _ in 0..10 {
        assert_eq!(check(&app, lease(unique("gone"), "100ms")).await.status, StatusCode::OK);
    }
    let live = check(&app, lease(unique("live"), "1h")).await;
    let leases = || async {
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM pglimit_leases").fetch_one(&pool).await.expect("count");
        pool.close().await;
        n
    };
    assert_eq!(leases().await, 11);
    tokio::time::sleep(Duration::from_millis(150)).await;

    let deleted = crate::common::pg_store(&url).await.cleanup().await.expect("cleanup");
    assert_eq!(deleted, 20, "ten bucket rows and their ten leases");
    assert_eq!(leases().await, 1);
    let released =
        crate::common::call(&app, "POST", "/release", json!({ "lease": live.body["lease"]["id"] })).await;
    assert_eq!(released.body, json!({ "released": true }));
}
