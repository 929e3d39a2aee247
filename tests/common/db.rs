//! Reading and rigging the database under test: stored counts, held row
//! locks, stores of the tests' own, call counters and waits on backends.

use crate::common::SECRET;

/// The stored key of the fixed-window ad hoc key `name`, under [`SECRET`].
pub fn adhoc_key(name: &str) -> pglimit::storage::Key {
    let secret = pglimit::limiter::KeySecret::new(SECRET).expect("secret");
    let algorithm = pglimit::algorithm::Algorithm::FixedWindow;
    pglimit::limiter::bucket_key(&secret, &pglimit::limiter::KeyScope::AdHoc { key: name, algorithm })
}

/// A transaction on `pool` holding the row of the ad hoc key `name`
/// (`FOR UPDATE`) until it ends: another client sitting on the row.
pub async fn lock_row(pool: &sqlx::PgPool, name: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM pglimit_buckets WHERE key = $1 FOR UPDATE")
        .bind(adhoc_key(name).as_slice())
        .execute(&mut *holder)
        .await
        .expect("lock the row");
    holder
}

/// The count Postgres holds for the fixed-window ad hoc key `name`.
pub async fn stored_count(url: &str, name: &str) -> u64 {
    counted(url, name).await.unwrap_or_else(|| panic!("no bucket for {name}"))
}

/// The count for `name`, or `None` before its first check.
async fn counted(url: &str, name: &str) -> Option<u64> {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let counted: Option<(i64,)> = sqlx::query_as("SELECT count FROM pglimit_buckets WHERE key = $1")
        .bind(adhoc_key(name).as_slice())
        .fetch_optional(&pool)
        .await
        .unwrap_or_else(|e| panic!("the bucket of {name}: {e}"));
    pool.close().await;
    counted.map(|(n,)| n as u64)
}

/// Waits until Postgres holds `count` for the ad hoc key `name`.
pub async fn wait_for_stored_count(url: &str, name: &str, count: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while counted(url, name).await.unwrap_or(0) < count {
        assert!(std::time::Instant::now() < deadline, "{name} never reached {count}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A Postgres store of its own on `url`, for tests that set the clock or
/// clean up by hand. No cleanup starts by itself.
pub async fn pg_store(url: &str) -> pglimit::storage::PgStore {
    pg_store_through(url, pglimit::storage::Reach::default()).await
}

/// As [`pg_store`], through a pooler or into a schema.
pub async fn pg_store_through(url: &str, reach: pglimit::storage::Reach) -> pglimit::storage::PgStore {
    pglimit::storage::PgStore::connect(url, store_options(reach)).await.expect("postgres store")
}

/// What [`pg_store_through`] connects with.
pub fn store_options(reach: pglimit::storage::Reach) -> pglimit::storage::PgStoreOptions {
    pglimit::storage::PgStoreOptions {
        connections: 2,
        pipeline: 2,
        longest_wait: std::time::Duration::from_secs(5),
        patience: std::time::Duration::from_secs(5),
        cleanup_rate: 0.0,
        cleanup_batch: 1000,
        audit_retention: std::time::Duration::from_secs(90 * 86_400),
        unlogged: false,
        citus: pglimit::storage::Citus::Auto,
        citus_checks: pglimit::storage::CitusChecks::Workers,
        reach,
    }
}

/// Makes the upsert's retry with locks an error in the database of `url`.
/// With one instance no row changes between a statement's snapshot and its
/// lock, so a retry there means the upsert's conflict branch and its answer
/// disagree, which the retry would otherwise decide again and hide.
pub async fn forbid_retries_with_locks(url: &str) {
    let pool = functions_pool(url).await;
    sqlx::query(
        "CREATE OR REPLACE FUNCTION pglimit_retry_with_locks() RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'the upsert asked to retry with locks, with no other writer'; END $$",
    )
    .execute(&pool)
    .await
    .expect("replace pglimit_retry_with_locks");
    pool.close().await;
}

/// A pool whose connections find this build's functions first, as the
/// service's do (the database must have been migrated).
pub async fn functions_pool(url: &str) -> sqlx::PgPool {
    let path = format!("SET search_path = {}, public", pglimit::storage::functions_schema());
    sqlx::postgres::PgPoolOptions::new()
        .after_connect(move |conn, _| {
            let path = path.clone();
            Box::pin(async move { sqlx::Executor::execute(conn, &*path).await.map(|_| ()) })
        })
        .connect(url)
        .await
        .expect("connect")
}

/// Counts the statements that write pglimit_buckets (a call, whichever
/// statement it takes) in a table `calls`, read by [`calls`].
pub async fn count_calls(url: &str) -> sqlx::PgPool {
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

pub async fn calls(pool: &sqlx::PgPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT n FROM calls").fetch_one(pool).await.expect("calls");
    n
}

/// Waits until a backend of the database of `pool` waits on `event`
/// (`wait_event_type` or `wait_event` in pg_stat_activity, e.g. `Lock` or
/// `PgSleep`): a statement a test holds up has reached the server.
pub async fn wait_for_a_backend_waiting_on(pool: &sqlx::PgPool, event: &str) {
    let waiting = "SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND $1 IN (wait_event_type, wait_event)";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sqlx::query_as::<_, (i64,)>(waiting).bind(event).fetch_one(pool).await.expect("pg_stat_activity").0
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "no backend came to wait on {event}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
