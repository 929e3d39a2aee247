//! Citus mode on a real cluster: a coordinator and two workers started by
//! `scripts/citus` (`scripts/test --citus` starts one, sets
//! `PGLIMIT_CITUS_URL` and `PGLIMIT_CITUS_DIR`, and runs these one at a
//! time: one of them stops a worker, another reads the coordinator's log).
//!
//! Ignored by a plain `cargo test`, which has no cluster; run through the
//! script, they fail, never skip, when the cluster is missing.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, TimeDelta, Utc};
use common::{check, instance, login, remaining, unique};
use pglimit::algorithm::{decide, Algorithm, State};
use pglimit::storage::{BucketSpec, CheckBatch, MemoryFallback};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"];

/// The coordinator's URL and the cluster's directory.
fn cluster() -> (String, PathBuf) {
    let (Ok(url), Ok(dir)) = (std::env::var("PGLIMIT_CITUS_URL"), std::env::var("PGLIMIT_CITUS_DIR")) else {
        panic!("no Citus cluster: run `scripts/test --citus`, which builds Citus if needed and starts one")
    };
    (url, PathBuf::from(dir))
}

async fn three_instances() -> Vec<pglimit::AppState> {
    let (url, _) = cluster();
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(instance(&url, &[]).await);
    }
    for app in &apps {
        let ready = common::readyz(app).await;
        assert_eq!(ready["store"], "postgres", "{ready}");
    }
    apps
}

/// Fires every body at once, round-robin over `apps`; returns the replies,
/// asserting each was decided by Postgres (no error, no deadlock, no fallback).
async fn fire(apps: &[pglimit::AppState], bodies: Vec<Value>) -> Vec<(bool, Value)> {
    let tasks: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let app = apps[i % apps.len()].clone();
            tokio::spawn(async move { (check(&app, body.clone()).await, body) })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        let (reply, body) = task.await.expect("check task");
        assert_eq!(reply.body["store"], "postgres", "decided by postgres: {}", reply.body);
        match reply.status {
            StatusCode::OK => replies.push((true, body)),
            StatusCode::TOO_MANY_REQUESTS => replies.push((false, body)),
            other => panic!("unexpected status {other}: {}", reply.body),
        }
    }
    replies
}

fn admitted(replies: &[(bool, Value)]) -> usize {
    replies.iter().filter(|(allowed, _)| *allowed).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn three_instances_on_one_key_admit_exactly_the_limit_for_every_algorithm() {
    let apps = three_instances().await;
    for algorithm in ALGORITHMS {
        let key = unique("hot");
        let body = json!({ "key": key, "limit": 25, "window": "1h", "algorithm": algorithm });
        let replies = fire(&apps, vec![body; 120]).await;
        assert_eq!(admitted(&replies), 25, "{algorithm}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn three_instances_admit_exactly_the_ip_limit_and_the_email_limit_across_shards() {
    let apps = three_instances().await;
    let ip = format!("10.{}.{}.{}", rand::random::<u8>(), rand::random::<u8>(), rand::random::<u8>());
    let bodies = (0..90).map(|_| login(&format!("{}@example.com", unique("u")), &ip)).collect();
    assert_eq!(admitted(&fire(&apps, bodies).await), 20, "the ip bucket's limit");
    let email = format!("{}@example.com", unique("victim"));
    let bodies = (0..120).map(|n| login(&email, &format!("198.51.{}.{}", n / 200, n % 200))).collect();
    assert_eq!(admitted(&fire(&apps, bodies).await), 50, "the email bucket's limit");
}

/// Checks of three buckets each (on different shards, mostly), many
/// denied by one bucket while the others had room: afterwards every bucket
/// holds exactly what the admitted checks took, so nothing a denied check
/// took was kept, and nothing was admitted past a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn checks_across_shards_stay_all_or_nothing_under_concurrency() {
    let apps = three_instances().await;
    let emails: Vec<String> = (0..4).map(|_| format!("{}@example.com", unique("e"))).collect();
    let net = rand::random::<u8>();
    let ips: Vec<String> = (0..3).map(|i| format!("172.16.{net}.{i}")).collect();
    let bodies: Vec<Value> = (0..240).map(|n| login(&emails[n % 4], &ips[(n / 4) % 3])).collect();
    let replies = fire(&apps, bodies).await;
    let taken = |f: &dyn Fn(&Value) -> bool| {
        replies.iter().filter(|(allowed, body)| *allowed && f(body)).count() as u64
    };
    for email in &emails {
        for ip in &ips {
            let peek = check(
                &apps[0],
                json!({ "policy": "login", "cost": 0,
                "identifiers": { "email": email, "ip": ip } }),
            )
            .await;
            let same_email = |b: &Value| b["identifiers"]["email"] == email.as_str();
            let same_ip = |b: &Value| b["identifiers"]["ip"] == ip.as_str();
            assert_eq!(remaining(&peek.body, "email_ip"), 5 - taken(&|b| same_email(b) && same_ip(b)));
            assert_eq!(remaining(&peek.body, "email"), 50 - taken(&same_email));
            assert_eq!(remaining(&peek.body, "ip"), 20 - taken(&same_ip));
        }
    }
}

/// A bucket whose key is `[n, n, random...]`: the same first two bytes, so
/// the same route, for every bucket of a trace.
fn spec(n: u8, tag: u8, algorithm: Algorithm, limit: u64, window_ms: u64) -> BucketSpec {
    let mut key = [0u8; 32];
    key[..2].copy_from_slice(&[n, n]);
    key[2] = tag;
    key[3..11].copy_from_slice(&rand::random::<u64>().to_be_bytes());
    BucketSpec {
        name: Arc::from(format!("b{tag}")),
        key,
        limit,
        window: Duration::from_millis(window_ms),
        algorithm,
        lockout: None,
    }
}

/// The delegated function decides as the model does: random traces of two
/// buckets on one route, with the clock set by the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn the_route_function_decides_exactly_as_the_model_on_random_traces() {
    let pg = common::pg_store(&cluster().0).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let start: DateTime<Utc> = "2030-01-01T00:00:00.123456Z".parse().expect("time");
    for round in 0..8 {
        let (algorithm, other) = (Algorithm::ALL[round % 4], Algorithm::ALL[(round + 1) % 4]);
        let route = rng.gen();
        let specs = [
            spec(route, 1, algorithm, rng.gen_range(1..6), rng.gen_range(200..5_000)),
            spec(route, 2, other, 8, 3_000),
        ];
        let mut model: [Option<State>; 2] = [None, None];
        let mut now = start + TimeDelta::seconds(round as i64 * 100);
        for step in 0..40 {
            now += TimeDelta::microseconds(rng.gen_range(0..900_000));
            let cost = rng.gen_range(0..3);
            let batch = CheckBatch { buckets: specs.to_vec(), cost, fallback: MemoryFallback::Refuse };
            let got = pg.check_as_of(&batch, now).await.expect("postgres answers");
            let now_us = now.timestamp_micros();
            let admit = cost > 0
                && specs
                    .iter()
                    .zip(&model)
                    .all(|(s, m)| decide(s.params(), m.as_ref(), cost, now_us, false).allowed);
            for (i, s) in specs.iter().enumerate() {
                let want = decide(s.params(), model[i].as_ref(), cost, now_us, admit);
                let at = format!("round {round} step {step} bucket {i} ({:?}, cost {cost})", s.algorithm);
                assert_eq!(got.buckets[i].allowed, want.allowed, "allowed, {at}");
                assert_eq!(got.buckets[i].remaining, want.remaining, "remaining, {at}");
                assert_eq!(got.buckets[i].reset_at.timestamp_micros(), want.full_us, "reset_at, {at}");
                assert_eq!(
                    got.buckets[i].retry_at.map(|t| t.timestamp_micros()),
                    want.retry_us,
                    "retry_at, {at}"
                );
                if admit {
                    model[i] = Some(want.next);
                }
            }
        }
    }
}

/// Blocks, lockouts and resets live in the distributed tables too: each is
/// seen by an instance that never saw the key (so Postgres, not its memory,
/// decides).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn blocks_lockouts_and_resets_hold_across_instances() {
    let url = cluster().0;
    let policy = "[policies.otp]\nidentifiers = { user = \"text\" }\n[[policies.otp.buckets]]\n\
                  name = \"user\"\non = [\"user\"]\nlimit = 1\nwindow = \"1h\"\nblock_for = \"1h\"\n";
    let file = common::policy_file(policy);
    let env = [("PGLIMIT_POLICIES", file.to_str().expect("path"))];
    let fresh = || instance(&url, &env);
    let otp = json!({ "policy": "otp", "identifiers": { "user": unique("u") } });
    let first = fresh().await;
    assert_eq!(check(&first, otp.clone()).await.status, StatusCode::OK);
    let denied = check(&first, otp.clone()).await;
    assert_eq!(denied.body["blocked_by"], "user", "the denial starts the lockout: {}", denied.body);
    let later = check(&fresh().await, otp.clone()).await;
    assert_eq!(later.body["blocked_by"], "user", "the lockout is in the shared table: {}", later.body);
    let reset = common::call(&first, "POST", "/reset", otp.clone()).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    assert_eq!(check(&fresh().await, otp.clone()).await.status, StatusCode::OK, "the reset lifted it");

    let target = json!({ "policy": "otp", "identifiers": otp["identifiers"], "for": "15m" });
    let blocked = common::call(&first, "POST", "/admin/blocks", target.clone()).await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    let refused = check(&fresh().await, otp.clone()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(refused.body["blocked_by"], "user");
    let lifted = common::call(&first, "DELETE", "/admin/blocks", target).await;
    assert_eq!(lifted.body["lifted"], 1, "{}", lifted.body);
    let reset = common::call(&first, "POST", "/reset", otp.clone()).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    assert_eq!(check(&fresh().await, otp).await.status, StatusCode::OK, "unblocked");
}

/// The worker (Citus group) holding the shard of keys that begin `[n, n]`.
async fn worker_of(pool: &sqlx::PgPool, n: u8) -> i32 {
    let (group,): (i32,) = sqlx::query_as(
        "SELECT p.groupid FROM pglimit_routes r JOIN pg_dist_placement p
             ON p.shardid = get_shard_id_for_distribution_column('pglimit_buckets', r.route)
         WHERE r.slot = $1 % (SELECT count(*) FROM pglimit_routes)",
    )
    .bind(i32::from(u16::from_be_bytes([n, n])))
    .fetch_one(pool)
    .await
    .expect("placement");
    group
}

/// Every algorithm gives back exactly what it took: a check across workers
/// denied by one bucket leaves the other (on the other worker) as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_denied_check_across_workers_gives_back_what_it_took_for_every_algorithm() {
    let url = cluster().0;
    let pg = common::pg_store(&url).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (mut one, mut other) = (None, None);
    for n in 0..=255u8 {
        match (worker_of(&pool, n).await, one) {
            (w, None) => one = Some((n, w)),
            (w, Some((_, first))) if w != first => other = Some(n),
            _ => {}
        }
        if other.is_some() {
            break;
        }
    }
    let (Some((one, _)), Some(other)) = (one, other) else { panic!("every shard on one worker") };
    let now: DateTime<Utc> = "2032-03-01T00:00:00.5Z".parse().expect("time");
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let roomy = spec(one, i as u8, algorithm, 10, 60_000);
        let full = spec(other, i as u8, Algorithm::FixedWindow, 1, 60_000);
        let one =
            |buckets: Vec<BucketSpec>| CheckBatch { buckets, cost: 1, fallback: MemoryFallback::Refuse };
        assert!(pg.check_as_of(&one(vec![full.clone()]), now).await.expect("answer").allowed());
        let both = pg.check_as_of(&one(vec![roomy.clone(), full.clone()]), now).await.expect("answer");
        assert!(!both.allowed(), "{algorithm:?}: the full bucket denies");
        assert!(both.buckets[0].allowed, "{algorithm:?}: the roomy bucket had room");
        assert_eq!(both.buckets[0].remaining, 10, "{algorithm:?}: shown as given back");
        let peek = CheckBatch { buckets: vec![roomy], cost: 0, fallback: MemoryFallback::Refuse };
        let after = pg.check_as_of(&peek, now).await.expect("answer");
        assert_eq!(after.buckets[0].remaining, 10, "{algorithm:?}: nothing kept by the denied check");
    }
}

#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn the_cleanup_deletes_expired_rows_on_every_shard() {
    let url = cluster().0;
    let pg = common::pg_store(&url).await;
    let long_ago: DateTime<Utc> = "2020-01-01T00:00:00Z".parse().expect("time");
    let mut keys = Vec::new();
    for n in 0..=255u8 {
        let bucket = spec(n, 9, Algorithm::ALL[usize::from(n) % 4], 5, 1_000);
        keys.push(bucket.key.to_vec());
        let batch = CheckBatch { buckets: vec![bucket], cost: 1, fallback: MemoryFallback::Refuse };
        pg.check_as_of(&batch, long_ago).await.expect("answer");
    }
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
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

/// Single-shard checks run on their worker with no two-phase commit: the
/// workers log every statement they run while this test lasts, and none is
/// a `PREPARE TRANSACTION`, while a reset (which deletes on every shard)
/// does show one, so the log would tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn checks_on_one_shard_use_no_two_phase_commit() {
    let (url, dir) = cluster();
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let logging = WorkerLogs::start(&dir).await;
    for algorithm in ALGORITHMS {
        for _ in 0..10 {
            let body = json!({ "key": unique("one"), "limit": 5, "window": "1m", "algorithm": algorithm });
            assert_eq!(check(&app, body).await.status, StatusCode::OK);
        }
    }
    let checks = logging.read();
    assert!(checks.matches("pglimit_check_node").count() >= 40, "every check ran on a worker: {checks}");
    assert_eq!(checks.matches("PREPARE TRANSACTION").count(), 0, "no two-phase commit: {checks}");
    let reset = json!({ "key": unique("any"), "limit": 5, "window": "1m" });
    let reset = common::call(&app, "POST", "/reset", reset).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    let all = logging.read();
    assert!(all.matches("PREPARE TRANSACTION").count() > 0, "a reset spans shards: {all}");
}

/// The workers' statement logs, from the start of a test; `log_statement`
/// is back to its default when this is dropped.
struct WorkerLogs {
    dir: PathBuf,
    from: Vec<usize>,
}

const WORKERS: [&str; 2] = ["worker1", "worker2"];

impl WorkerLogs {
    async fn start(dir: &std::path::Path) -> Self {
        set_worker_setting(dir, "SET log_statement = 'all'").await;
        let from = WORKERS.iter().map(|w| log_text(dir, w).len()).collect();
        Self { dir: dir.to_owned(), from }
    }

    fn read(&self) -> String {
        // The logger writes a statement before it runs, so what has been
        // answered is in the file.
        WORKERS.iter().zip(&self.from).map(|(w, &from)| log_text(&self.dir, w)[from..].to_owned()).collect()
    }
}

impl Drop for WorkerLogs {
    fn drop(&mut self) {
        let dir = self.dir.clone();
        let reset = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(set_worker_setting(&dir, "RESET log_statement"));
        });
        reset.join().expect("log_statement reset");
    }
}

fn log_text(dir: &std::path::Path, worker: &str) -> String {
    let bytes = std::fs::read(dir.join(format!("{worker}.log"))).expect("worker log");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `ALTER SYSTEM <change>` and a reload on each worker, directly.
async fn set_worker_setting(dir: &std::path::Path, change: &str) {
    let password = std::fs::read_to_string(dir.join("password")).expect("password");
    for worker in WORKERS {
        let port = std::fs::read_to_string(dir.join(format!("{worker}.port"))).expect("port");
        let url = format!("postgres://pglimit:{}@127.0.0.1:{}/postgres", password.trim(), port.trim());
        let pool = sqlx::PgPool::connect(&url).await.expect("connect to a worker");
        sqlx::query(&format!("ALTER SYSTEM {change}")).execute(&pool).await.expect("alter system");
        sqlx::query("SELECT pg_reload_conf()").execute(&pool).await.expect("reload");
        // A reload is signalled, not awaited: wait until a new session sees it.
        let want = if change.starts_with("SET") { "all" } else { "none" };
        for _ in 0..100 {
            let (now,): (String,) =
                sqlx::query_as("SHOW log_statement").fetch_one(&pool).await.expect("show");
            if now == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pool.close().await;
    }
}

/// A shard moved to the other worker while checks on it are in flight:
/// calls wait for the move (they lock the shard's metadata as Citus' own
/// writes do), those sent to the old worker are sent anew, and the limit
/// stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_shard_moved_under_load_keeps_the_limit_exact() {
    let url = cluster().0;
    let apps = three_instances().await;
    let name = unique("moving");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
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
    let load = tokio::spawn({
        let apps = apps.clone();
        async move {
            let mut replies = Vec::new();
            for _ in 0..10 {
                replies.extend(fire(&apps, vec![body.clone(); 30]).await);
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
    assert_eq!(admitted(&replies), 150, "300 checks at a limit of 150, during a move");
    let (count,): (i64,) = sqlx::query_as("SELECT count FROM pglimit_buckets WHERE key = $1")
        .bind(key.as_slice())
        .fetch_one(&pool)
        .await
        .expect("the row, on its new worker");
    assert_eq!(count, 150, "what the shard holds is what was admitted");
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
