//! One row or one statement stalls: its own check fails over to memory,
//! the instance stays on Postgres, and other keys go around it.

use crate::common::{check, degraded, fresh_database, instance, unique};
use axum::http::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_locked_by_a_stuck_transaction_fails_its_own_checks_not_the_instance() {
    let url = fresh_database().await;
    // lock_timeout is 18 x the DB timeout: 1.8 s here.
    let app = instance(&url, &[("PGLIMIT_DB_TIMEOUT_MS", "100")]).await;
    let stuck = json!({ "key": "stuck", "limit": 100, "window": "1h" });
    let reply = check(&app, stuck.clone()).await;
    assert_eq!((reply.status, reply.body["store"].as_str()), (StatusCode::OK, Some("postgres")));

    // Another client takes the row and sits on it.
    let key = crate::common::adhoc_key("stuck");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let mut holder = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM pglimit_buckets WHERE key = $1 FOR UPDATE")
        .bind(key.as_slice())
        .execute(&mut *holder)
        .await
        .expect("lock the row");

    let started = std::time::Instant::now();
    let blocked = {
        let (app, stuck) = (app.clone(), stuck.clone());
        tokio::spawn(async move { check(&app, stuck).await })
    };
    // Wait until the stuck check waits for its row lock on the server: a
    // check sent before then could be batched with it and share its fate
    // (docs/reliability.md). A fixed pause lost that race on a busy machine.
    crate::common::wait_for_a_backend_waiting_on(&pool, "Lock").await;
    // Unrelated keys go around the stalled call: decided by Postgres, every
    // one of them while the stuck check is still waiting for its lock.
    for i in 0..40 {
        let reply = check(&app, json!({ "key": format!("free-{i}"), "limit": 5, "window": "1h" })).await;
        assert_eq!(
            (reply.status, reply.body["store"].as_str()),
            (StatusCode::OK, Some("postgres")),
            "{}",
            reply.body
        );
    }
    assert!(!blocked.is_finished(), "the unrelated checks waited for the stuck one");
    let reply = blocked.await.unwrap();
    let waited = started.elapsed();
    // The stuck check gave up at lock_timeout and was answered by the memory fallback...
    reply.assert_memory_admits();
    assert!(waited < std::time::Duration::from_secs(6), "waited {waited:?}");
    // ...without switching the instance away from Postgres.
    assert!(!degraded(&app).await);

    holder.rollback().await.expect("release");
    // Its statement was cancelled, not left to commit once the lock was
    // free: Postgres holds only the first check...
    assert_eq!(
        crate::common::stored_count(&url, "stuck").await,
        1,
        "the stuck check was counted in postgres"
    );
    pool.close().await;
    // ...and the next check is its second: 100 - 2 left.
    let reply = check(&app, stuck).await;
    assert_eq!((reply.status, reply.body["store"].as_str()), (StatusCode::OK, Some("postgres")));
    assert_eq!(reply.body["remaining"], 98, "{}", reply.body);
}
