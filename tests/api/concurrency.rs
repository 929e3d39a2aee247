//! Exactness under concurrency, across several service instances.

use crate::common::{check, degraded, fresh_database, instance, login, unique};
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
async fn count_calls(url: &str) -> sqlx::PgPool {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    for statement in [
        "CREATE TABLE calls (n bigint NOT NULL)",
        "INSERT INTO calls VALUES (0)",
        "CREATE FUNCTION count_call() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN UPDATE calls SET n = n + 1; RETURN NULL; END $$",
        "CREATE TRIGGER count_calls AFTER INSERT ON pglimit_buckets
         FOR EACH STATEMENT EXECUTE FUNCTION count_call()",
    ] {
        sqlx::query(statement).execute(&pool).await.expect("set up the call counter");
    }
    pool
}

async fn calls(pool: &sqlx::PgPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT n FROM calls").fetch_one(pool).await.expect("calls");
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_on_one_lane_are_batched_and_decided_as_if_in_sequence() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_DB_POOL_SIZE", "1")]).await;
    let key = unique("batched");
    let counter = count_calls(&url).await;
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
    // Give the stuck check time to reach its row, so that its lane counts
    // as stalled (checks batched with it share its fate: see docs/reliability.md).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // Unrelated keys go around the stalled lane: decided by Postgres, every
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
/// that its lane counts as stalled (checks queued behind it within those
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
    // Other keys go around the stalled lane, and their answers are the
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
