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
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let holder = crate::common::lock_row(&pool, "stuck").await;

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

/// Makes every write of the row `key` sleep on the server for a minute: a
/// trigger, so the statement is slow without waiting for any lock.
async fn make_writes_slow(pool: &sqlx::PgPool, key: &pglimit::storage::Key) {
    sqlx::query(
        "CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$",
    )
    .execute(pool)
    .await
    .expect("create the trigger function");
    let trigger = format!(
        "CREATE TRIGGER slow_write BEFORE INSERT OR UPDATE ON pglimit_buckets FOR EACH ROW
         WHEN (NEW.key = '\\x{}'::bytea) EXECUTE FUNCTION slow_write()",
        hex::encode(key)
    );
    sqlx::query(&trigger).execute(pool).await.expect("create the trigger");
}

/// Backends of this database inside `pg_sleep` right now.
async fn sleeping_backends(pool: &sqlx::PgPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event = 'PgSleep'",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_activity");
    n
}

/// Waits until the slow check sleeps on the server, and a little longer so
/// that its call counts as stalled (checks queued behind it within those
/// 5 ms would share its fate: see docs/reliability.md).
async fn wait_until_sleeping(pool: &sqlx::PgPool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sleeping_backends(pool).await == 0 {
        assert!(std::time::Instant::now() < deadline, "the slow check never reached the server");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
}

/// Checks new keys one after another until `waiting` is answered, each
/// decided by Postgres; returns how many were sent meanwhile.
async fn check_others_until(
    app: &pglimit::AppState,
    waiting: &tokio::task::JoinHandle<crate::common::Reply>,
) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut sent = 0;
    while !waiting.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the slow check was never answered");
        let reply = check(app, json!({ "key": unique("other"), "limit": 5, "window": "1h" })).await;
        assert_eq!(
            (reply.status, reply.body["store"].as_str()),
            (StatusCode::OK, Some("postgres")),
            "{}",
            reply.body
        );
        sent += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_slow_on_the_server_is_cancelled_at_statement_timeout_and_fails_only_its_own_check() {
    slow_statement_is_cancelled_before_its_caller_gives_up(100).await;
}

/// At 50 ms a caller waits 1 s (20 x the timeout). The server-side timeouts
/// once had a 2 s floor, so the caller gave up first and the statement ran
/// on, free to commit a count for a check already answered from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_short_db_timeout_the_server_cancels_a_slow_statement_before_its_caller_gives_up() {
    slow_statement_is_cancelled_before_its_caller_gives_up(50).await;
}

/// statement_timeout is 0.9 x 20 x the DB timeout: the check must be
/// answered by the fallback once the server has cancelled its statement,
/// without switching the instance, while other keys stay on Postgres.
async fn slow_statement_is_cancelled_before_its_caller_gives_up(timeout_ms: u64) {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_DB_TIMEOUT_MS", &timeout_ms.to_string())]).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let slow_key = crate::common::adhoc_key("slow");
    make_writes_slow(&pool, &slow_key).await;

    let started = std::time::Instant::now();
    let slow = {
        let app = app.clone();
        tokio::spawn(async move { check(&app, json!({ "key": "slow", "limit": 100, "window": "1h" })).await })
    };
    wait_until_sleeping(&pool).await;
    // Other keys go around the stalled call, and their answers are the
    // progress that tells the fallback Postgres is alive, not away.
    let others = check_others_until(&app, &slow).await;
    let reply = slow.await.unwrap();
    let waited = started.elapsed();
    let statement_timeout = std::time::Duration::from_millis(timeout_ms * 18);
    assert_slow_check_was_cancelled(&pool, &slow_key, &reply, waited, statement_timeout).await;
    assert!(others > 10, "only {others} other checks while the slow one waited");
    assert!(!degraded(&app).await, "one slow statement switched the instance");
    // The lane that ran it took the cancellation and carries on.
    let after = check(&app, json!({ "key": unique("after"), "limit": 5, "window": "1h" })).await;
    assert_eq!(
        (after.status, after.body["store"].as_str()),
        (StatusCode::OK, Some("postgres")),
        "{}",
        after.body
    );
    pool.close().await;
}

/// The slow check was answered by the fallback once the server cancelled
/// its statement (at `statement_timeout`, before the caller's own limit),
/// and nothing of it stayed on the server: no backend still sleeping, no
/// count stored.
async fn assert_slow_check_was_cancelled(
    pool: &sqlx::PgPool,
    key: &pglimit::storage::Key,
    reply: &crate::common::Reply,
    waited: std::time::Duration,
    statement_timeout: std::time::Duration,
) {
    reply.assert_memory_admits();
    let window = statement_timeout * 19 / 20..statement_timeout + std::time::Duration::from_secs(3);
    assert!(window.contains(&waited), "answered after {waited:?}, expected about {statement_timeout:?}");
    // Dropping the connection at the hard limit would leave pg_sleep(60)
    // running; only the server's own cancellation ends it.
    assert_eq!(sleeping_backends(pool).await, 0, "the statement still runs on the server");
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM pglimit_buckets WHERE key = $1")
        .bind(key.as_slice())
        .fetch_one(pool)
        .await
        .expect("count rows");
    assert_eq!(rows, 0, "the cancelled statement was rolled back");
}
