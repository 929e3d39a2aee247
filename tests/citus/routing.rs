//! Where checks go: straight to the workers (`PGLIMIT_CITUS_CHECKS=workers`,
//! the default) or through the coordinator, and on one shard without a
//! two-phase commit. Each node's statement log tells.

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use crate::common::{self, check, instance, unique};
use crate::{admitted, cluster, fire, ALGORITHMS};

/// Checks go straight to the workers: the coordinator runs none of their
/// calls, each worker runs its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn checks_go_straight_to_the_workers_and_not_through_the_coordinator() {
    let (url, dir) = cluster();
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let logging = NodeLogs::start(&dir).await;
    for n in 0..40 {
        let body = json!({ "key": unique(&format!("straight{n}")), "limit": 5, "window": "1m" });
        assert_eq!(check(&app, body).await.status, StatusCode::OK);
    }
    let coordinator = logging.read(&["coordinator"]);
    assert_eq!(calls(&coordinator), 0, "no check on the coordinator: {coordinator}");
    for worker in WORKERS {
        assert!(calls(&logging.read(&[worker])) > 0, "{worker} decided its own keys' checks");
    }
    assert!(calls(&logging.read(&WORKERS)) >= 40, "every check on a worker");
}

/// A hot key's checks that share a batch are one row of its shard's hot
/// upsert on the key's worker, and admit exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_hot_keys_checks_are_decided_as_one_row_on_its_shard() {
    let (url, dir) = cluster();
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let logging = NodeLogs::start(&dir).await;
    let body = json!({ "key": unique("hot"), "limit": 40, "window": "1m" });
    assert_eq!(admitted(&fire(&[app], vec![body; 120]).await), 40);
    let workers = logging.read(&WORKERS);
    assert!(workers.contains("PARTITION BY r.key"), "the hot upsert ran on a worker: {workers}");
    assert_eq!(calls(&logging.read(&["coordinator"])), 0, "no check on the coordinator");
}

/// A worker's checks on keys of several of its shards, sent together, are
/// one statement over its shards, and each check gets its own answer:
/// of keys checked at once, those already at their limit are denied and
/// the others admitted, whatever their place in the statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_workers_checks_on_several_shards_are_one_statement_each_answered_as_its_own() {
    let (url, dir) = cluster();
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let keys: Vec<String> = (0..120).map(|n| unique(&format!("several{n}"))).collect();
    let body = |key: &String| json!({ "key": key, "limit": 1, "window": "1m" });
    assert_eq!(admitted(&fire(std::slice::from_ref(&app), keys[..40].iter().map(body).collect()).await), 40);
    let logging = NodeLogs::start(&dir).await;
    for (allowed, sent) in fire(&[app], keys.iter().map(body).collect()).await {
        let spent = keys[..40].iter().any(|key| sent["key"] == *key.as_str());
        assert_eq!(allowed, !spent, "{sent}: only the keys checked before are at their limit");
    }
    let workers = logging.read(&WORKERS);
    let several = workers.split("LOG:").filter(|s| s.matches("INSERT INTO pglimit_buckets_").count() >= 2);
    assert!(several.count() > 0, "a statement over several shards: {workers}");
}

/// A `login` check's buckets on one worker (on two of its shards, often)
/// are one statement over them, all or nothing: once the IP's bucket is
/// full, checks of new emails from that IP take nothing from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_checks_buckets_on_several_shards_of_a_worker_are_decided_together() {
    let (url, dir) = cluster();
    let app = instance(&url, &[("PGLIMIT_CLEANUP_RATE", "0")]).await;
    let logging = NodeLogs::start(&dir).await;
    let [a, b, c] = rand::random::<[u8; 3]>();
    let ip = format!("100.{}.{b}.{c}", 64 + a % 64);
    let emails: Vec<String> = (0..50).map(|_| format!("{}@example.com", unique("shards"))).collect();
    for (n, email) in emails.iter().enumerate() {
        let reply = check(&app, common::login(email, &ip)).await;
        assert_eq!(reply.body["allowed"], n < 20, "the IP's limit is 20: {}", reply.body);
    }
    let workers = logging.read(&WORKERS);
    assert!(workers.contains("multi_all"), "the policy upsert over a worker's shards: {workers}");
    assert_eq!(workers.matches("pglimit_check_node").count(), 0, "no route function: {workers}");
    for email in &emails[20..] {
        let body = json!({ "policy": "login", "cost": 0, "identifiers": { "email": email, "ip": ip } });
        let peek = check(&app, body).await;
        assert_eq!(common::remaining(&peek.body, "email"), 50, "{email}: nothing taken");
        assert_eq!(common::remaining(&peek.body, "email_ip"), 5, "{email}: nothing taken");
    }
}

/// With `PGLIMIT_CITUS_CHECKS=coordinator` every check goes through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn checks_go_through_the_coordinator_when_so_configured() {
    let (url, dir) = cluster();
    let settings = [("PGLIMIT_CLEANUP_RATE", "0"), ("PGLIMIT_CITUS_CHECKS", "coordinator")];
    let app = instance(&url, &settings).await;
    let logging = NodeLogs::start(&dir).await;
    for n in 0..20 {
        let body = json!({ "key": unique(&format!("through{n}")), "limit": 5, "window": "1m" });
        assert_eq!(check(&app, body).await.status, StatusCode::OK);
    }
    let coordinator = logging.read(&["coordinator"]);
    assert!(coordinator.matches("pglimit_check_node").count() >= 20, "every check via the coordinator");
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
    let logging = NodeLogs::start(&dir).await;
    for algorithm in ALGORITHMS {
        for _ in 0..10 {
            let body = json!({ "key": unique("one"), "limit": 5, "window": "1m", "algorithm": algorithm });
            assert_eq!(check(&app, body).await.status, StatusCode::OK);
        }
    }
    let checks = logging.read(&WORKERS);
    assert!(calls(&checks) >= 40, "every check ran on a worker: {checks}");
    assert_eq!(checks.matches("PREPARE TRANSACTION").count(), 0, "no two-phase commit: {checks}");
    let reset = json!({ "key": unique("any"), "limit": 5, "window": "1m" });
    let reset = common::call(&app, "POST", "/reset", reset).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    let all = logging.read(&WORKERS);
    assert!(all.matches("PREPARE TRANSACTION").count() > 0, "a reset spans shards: {all}");
}

/// The check calls in a log: a worker's upsert (which locks its shards
/// first) or the route function.
fn calls(log: &str) -> usize {
    log.matches("pglimit_lock_shards(").count() + log.matches("pglimit_check_node").count()
}

const WORKERS: [&str; 2] = ["worker1", "worker2"];
const NODES: [&str; 3] = ["coordinator", "worker1", "worker2"];

/// Every node's statement log, from the start of a test; `log_statement`
/// is back to its default when this is dropped.
struct NodeLogs {
    dir: PathBuf,
    from: Vec<usize>,
}

impl NodeLogs {
    async fn start(dir: &Path) -> Self {
        set_log_statement(dir, "SET log_statement = 'all'").await;
        let from = NODES.iter().map(|node| log_text(dir, node).len()).collect();
        Self { dir: dir.to_owned(), from }
    }

    /// What `nodes` logged since the start. The logger writes a statement
    /// before it runs, so what has been answered is in the file.
    fn read(&self, nodes: &[&str]) -> String {
        let since = NODES.iter().zip(&self.from).filter(|(node, _)| nodes.contains(node));
        since.map(|(node, &from)| log_text(&self.dir, node)[from..].to_owned()).collect()
    }
}

impl Drop for NodeLogs {
    fn drop(&mut self) {
        let dir = self.dir.clone();
        let reset = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(set_log_statement(&dir, "RESET log_statement"));
        });
        reset.join().expect("log_statement reset");
    }
}

fn log_text(dir: &Path, node: &str) -> String {
    let bytes = std::fs::read(dir.join(format!("{node}.log"))).expect("node log");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `ALTER SYSTEM <change>` and a reload on each node, directly.
async fn set_log_statement(dir: &Path, change: &str) {
    let password = std::fs::read_to_string(dir.join("password")).expect("password");
    for node in NODES {
        let port = std::fs::read_to_string(dir.join(format!("{node}.port"))).expect("port");
        let url = format!("postgres://pglimit:{}@127.0.0.1:{}/postgres", password.trim(), port.trim());
        let pool = crate::direct(&url).await;
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
