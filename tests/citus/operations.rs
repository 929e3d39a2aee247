//! The cluster at work: cleanup on every shard, a shard move under load
//! and the lock that keeps it exact, a stopped worker.

use std::path::PathBuf;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::DateTime;
use chrono::Utc;
use pglimit::algorithm::Algorithm;
use pglimit::storage::{Check, CitusChecks, MemoryFallback, PgStore, PgStoreOptions, Reach};
use serde_json::json;

use crate::common::{self, check, instance, unique};
use crate::decisions::spec;
use crate::{admitted, cluster, fire, three_instances};

#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn the_cleanup_deletes_expired_rows_on_every_shard_straight_on_the_workers() {
    the_cleanup_deletes_expired_rows_on_every_shard(CitusChecks::Workers).await;
}

#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn the_cleanup_deletes_expired_rows_on_every_shard_through_the_coordinator() {
    the_cleanup_deletes_expired_rows_on_every_shard(CitusChecks::Coordinator).await;
}

async fn the_cleanup_deletes_expired_rows_on_every_shard(checks: CitusChecks) {
    let url = cluster().0;
    let options = PgStoreOptions { citus_checks: checks, ..common::store_options(Reach::default()) };
    let pg = PgStore::connect(&url, options).await.expect("postgres store");
    let long_ago: DateTime<Utc> = "2020-01-01T00:00:00Z".parse().expect("time");
    let mut keys = Vec::new();
    for n in 0..=255u8 {
        let bucket = spec(n, 9, Algorithm::ALL[usize::from(n) % 4], 5, 1_000);
        keys.push(bucket.key.to_vec());
        let batch = Check { buckets: vec![bucket], cost: 1, fallback: MemoryFallback::Refuse, lease: None };
        pg.check_as_of(&batch, long_ago).await.expect("answer");
    }
    let pool = crate::direct(&url).await;
    let count = || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM pglimit_buckets WHERE key = ANY($1)")
            .bind(&keys)
            .fetch_one(&pool)
            .await
            .expect("count");
        n
    };
    assert_eq!(count().await, 256, "every expired row is there before the cleanup");
    // Each run cleans one route; as many runs as routes reach every shard.
    let (routes,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pglimit_routes").fetch_one(&pool).await.expect("routes");
    for _ in 0..routes {
        pg.cleanup().await.expect("cleanup");
    }
    assert_eq!(count().await, 0, "the cleanup deleted every expired row");
}

/// A shard moved to the other worker while checks on it are in flight:
/// calls wait for the move (they lock the shard's metadata as Citus' own
/// writes do), those sent to the old worker are sent anew, and the limit
/// stays exact, also for the keys of other shards that shared a statement
/// with the moving one's (a statement that fails writes none of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_shard_moved_under_load_keeps_the_limit_exact() {
    let url = cluster().0;
    let apps = three_instances().await;
    let name = unique("moving");
    let pool = crate::direct(&url).await;
    let key = common::adhoc_key(&name);
    let (shard, from, to): (i64, i32, i32) = sqlx::query_as(
        "WITH s AS (SELECT get_shard_id_for_distribution_column('pglimit_buckets',
                        (SELECT route FROM pglimit_routes WHERE slot = $1 % (SELECT count(*) FROM pglimit_routes))) AS id)
         SELECT s.id, src.nodeport, dst.nodeport FROM s
         JOIN citus_shards src ON src.shardid = s.id
         JOIN pg_dist_node dst ON dst.noderole = 'primary' AND dst.groupid <> 0 AND dst.nodeport <> src.nodeport",
    )
    .bind(i32::from(u16::from_be_bytes([key[0], key[1]])))
    .fetch_one(&pool)
    .await
    .expect("the shard of the key and the other worker");
    let body = json!({ "key": name, "limit": 150, "window": "1h" });
    let others: Vec<String> = (0..150).map(|n| unique(&format!("beside{n}"))).collect();
    let load = tokio::spawn({
        let (apps, others) = (apps.clone(), others.clone());
        async move {
            let mut replies = Vec::new();
            for round in 0..10 {
                // Each of the others twice at a limit of one, beside the moving key.
                let beside =
                    others[round * 15..round * 15 + 15].iter().chain(&others[round * 15..round * 15 + 15]);
                let beside = beside.map(|key| json!({ "key": key, "limit": 1, "window": "1h" }));
                replies.extend(fire(&apps, vec![body.clone(); 30].into_iter().chain(beside).collect()).await);
            }
            replies
        }
    });
    sqlx::query("SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3, shard_transfer_mode := 'block_writes')")
        .bind(shard)
        .bind(from)
        .bind(to)
        .execute(&pool)
        .await
        .expect("the move");
    let replies = load.await.expect("load");
    let (moving, beside): (Vec<_>, Vec<_>) = replies.into_iter().partition(|(_, sent)| sent["key"] == *name);
    assert_eq!(admitted(&moving), 150, "300 checks at a limit of 150, during a move");
    for key in &others {
        let of_key: Vec<_> =
            beside.iter().filter(|(_, sent)| sent["key"] == *key.as_str()).cloned().collect();
        assert_eq!(admitted(&of_key), 1, "{key}: two checks at a limit of one, during a move");
    }
    let (count,): (i64,) = sqlx::query_as("SELECT count FROM pglimit_buckets WHERE key = $1")
        .bind(key.as_slice())
        .fetch_one(&pool)
        .await
        .expect("the row, on its new worker");
    assert_eq!(count, 150, "what the shard holds is what was admitted");
}

/// A worker locks only the shards it holds: asked for one it does not (as
/// when a move ends while a statement waits for its lock), the call fails
/// with a serialization error naming that shard, which the lane retries.
#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_worker_refuses_to_lock_a_shard_it_does_not_hold() {
    let url = cluster().0;
    let _functions = instance(&url, &[]).await;
    let shards: Vec<(i64, i32)> = sqlx::query_as(
        "SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'pglimit_buckets'::regclass ORDER BY shardid",
    )
    .fetch_all(&crate::direct(&url).await)
    .await
    .expect("the shards");
    let port = shards[0].1;
    let elsewhere = shards.iter().find(|(_, p)| *p != port).expect("a shard on the other worker").0;
    let worker = crate::direct_at(&url, u16::try_from(port).expect("a port")).await;
    let (schema,): (String,) = sqlx::query_as(
        "SELECT n.nspname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname = 'pglimit_lock_shards' LIMIT 1",
    )
    .fetch_one(&worker)
    .await
    .expect("the function on the worker");
    let lock = format!("SELECT \"{schema}\".pglimit_lock_shards($1)");
    for held in [[Some(shards[0].0), None], [None, None]] {
        let (n,): (i64,) = sqlx::query_as(&lock).bind(held).fetch_one(&worker).await.expect("its own shard");
        assert_eq!(n, 0, "{held:?}");
    }
    let gone = sqlx::query(&lock).bind([Some(shards[0].0), Some(elsewhere)]).execute(&worker).await;
    let gone = gone.expect_err("a shard on the other worker").into_database_error().expect("from the worker");
    assert_eq!(gone.code().as_deref(), Some("40001"), "{gone}");
    assert!(gone.message().contains(&format!("shard {elsewhere} is not on this node")), "{gone}");
}

/// A worker that stops takes the instance to memory (the coordinator alone
/// cannot decide the keys it held), and the instance returns to Postgres
/// once the worker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_stopped_worker_sends_checks_to_memory_until_it_is_back() {
    let (url, dir) = cluster();
    let app = instance(&url, &[("PGLIMIT_DB_TIMEOUT_MS", "500")]).await;
    let keys: Vec<String> = (0..16).map(|_| unique("w")).collect();
    for key in &keys {
        let reply = check(&app, json!({ "key": key, "limit": 100, "window": "1h" })).await;
        assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
    }
    let worker = Worker::stop(&dir, "worker2");
    // Sixteen random keys are on both workers' shards (the chance that all
    // are on one worker is 2^-15): some check meets the stopped worker.
    let mut from_memory = 0;
    for key in &keys {
        let reply = check(&app, json!({ "key": key, "limit": 100, "window": "1h" })).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        from_memory += usize::from(reply.body["store"] == "memory");
    }
    assert!(from_memory > 0, "a check on the stopped worker's shards was answered from memory");
    assert!(common::degraded(&app).await, "the instance says it is degraded");
    drop(worker);
    common::wait_for_postgres(&app, Duration::from_secs(30)).await;
    for key in &keys {
        let reply = check(&app, json!({ "key": key, "limit": 100, "window": "1h" })).await;
        assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
    }
}

/// A stopped node, started again when dropped (even by a failing test).
struct Worker {
    dir: PathBuf,
    name: &'static str,
}

impl Worker {
    fn stop(dir: &std::path::Path, name: &'static str) -> Self {
        node(dir, name, "stop");
        Self { dir: dir.to_owned(), name }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        node(&self.dir, self.name, "start");
    }
}

fn node(dir: &std::path::Path, name: &str, action: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/citus");
    let status = std::process::Command::new(script)
        .args(["node", &dir.display().to_string(), name, action])
        .status()
        .expect("scripts/citus");
    assert!(status.success(), "scripts/citus node {name} {action}");
}
