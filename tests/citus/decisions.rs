//! The functions on the workers: the model's decisions on random traces,
//! refunds across workers, blocks and lockouts.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use pglimit::algorithm::Algorithm;
use pglimit::storage::{BucketSpec, Check, MemoryFallback};
use serde_json::json;

use crate::cluster;
use crate::common::calendar_replay::{replay_calendar, CalendarShape};
use crate::common::replay::{replay, replay_on, Path, Shape, SHAPES};
use crate::common::{self, check, instance, unique};

/// A bucket whose key is `[n, n, random...]`: the same first two bytes, so
/// the same route, for every bucket of a trace.
pub fn spec(n: u8, tag: u8, algorithm: Algorithm, limit: u64, window_ms: u64) -> BucketSpec {
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
        calendar: None,
    }
}

/// The delegated function decides as the model does: random traces of
/// every shape (`tests/common/replay.rs`), all on one route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn the_route_function_decides_exactly_as_the_model_on_random_traces() {
    let url = cluster().0;
    let pg = common::pg_store(&url).await;
    let rows = crate::direct(&url).await;
    for (n, shape) in SHAPES.into_iter().enumerate() {
        replay(Path::Store(&pg), &rows, shape, 17 + n as u64).await;
    }
}

/// A check's buckets on two shards of one worker, in two segments of the
/// worker's statement (the shards' policy upsert), decide as the model
/// does: two fixed windows, and pairs of other algorithms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn buckets_on_two_shards_of_one_worker_decide_exactly_as_the_model_on_random_traces() {
    let url = cluster().0;
    let pg = common::pg_store(&url).await;
    let rows = crate::direct(&url).await;
    let mut seen: Vec<(u8, (i32, i32))> = Vec::new();
    let mut pair = None;
    for n in 0..=255u8 {
        let (worker, route) = worker_of(&rows, n).await;
        pair = seen.iter().find(|(_, (w, r))| *w == worker && *r != route).map(|&(m, _)| [m, n]);
        if pair.is_some() {
            break;
        }
        seen.push((n, (worker, route)));
    }
    let firsts = pair.expect("a worker with two shards");
    for (n, shape) in [Shape::FixedPolicy, Shape::Mixed].into_iter().enumerate() {
        replay_on(Path::Store(&pg), &rows, shape, 41 + n as u64, Some(firsts)).await;
    }
}

/// Calendar windows on the workers' function, on traces across DST
/// changes and month ends (`tests/common/calendar_replay.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn calendar_windows_on_the_workers_decide_exactly_as_the_model() {
    let url = cluster().0;
    let pg = common::pg_store(&url).await;
    let rows = crate::direct(&url).await;
    for (n, shape) in [CalendarShape::Alone, CalendarShape::Mixed].into_iter().enumerate() {
        replay_calendar(Path::Store(&pg), &rows, shape, 71 + n as u64).await;
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

/// The worker (Citus group) holding the shard of keys that begin `[n, n]`,
/// and their route.
async fn worker_of(pool: &sqlx::PgPool, n: u8) -> (i32, i32) {
    let placed: (i32, i32) = sqlx::query_as(
        "SELECT p.groupid, r.route FROM pglimit_routes r JOIN pg_dist_placement p
             ON p.shardid = get_shard_id_for_distribution_column('pglimit_buckets', r.route)
         WHERE r.slot = $1 % (SELECT count(*) FROM pglimit_routes)",
    )
    .bind(i32::from(u16::from_be_bytes([n, n])))
    .fetch_one(pool)
    .await
    .expect("placement");
    placed
}

/// Every algorithm gives back exactly what it took: a check across workers
/// denied by one bucket leaves the other (on the other worker) as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_denied_check_across_workers_gives_back_what_it_took_for_every_algorithm() {
    let url = cluster().0;
    let pg = common::pg_store(&url).await;
    let pool = crate::direct(&url).await;
    let (mut one, mut other) = (None, None);
    for n in 0..=255u8 {
        match (worker_of(&pool, n).await.0, one) {
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
    // Concurrency buckets are refused in Citus mode (see the test below).
    let algorithms = Algorithm::ALL.into_iter().filter(|a| *a != Algorithm::Concurrency);
    for (i, algorithm) in algorithms.enumerate() {
        let roomy = spec(one, i as u8, algorithm, 10, 60_000);
        let full = spec(other, i as u8, Algorithm::FixedWindow, 1, 60_000);
        let one = |buckets: Vec<BucketSpec>| Check {
            buckets,
            cost: 1,
            fallback: MemoryFallback::Refuse,
            lease: None,
        };
        assert!(pg.check_as_of(&one(vec![full.clone()]), now).await.expect("answer").allowed());
        let both = pg.check_as_of(&one(vec![roomy.clone(), full.clone()]), now).await.expect("answer");
        assert!(!both.allowed(), "{algorithm:?}: the full bucket denies");
        assert!(both.buckets[0].allowed, "{algorithm:?}: the roomy bucket had room");
        assert_eq!(both.buckets[0].remaining, 10, "{algorithm:?}: shown as given back");
        let peek = Check { buckets: vec![roomy], cost: 0, fallback: MemoryFallback::Refuse, lease: None };
        let after = pg.check_as_of(&peek, now).await.expect("answer");
        assert_eq!(after.buckets[0].remaining, 10, "{algorithm:?}: nothing kept by the denied check");
    }
}

/// Leases live in one table on a single node: a concurrency check is
/// refused on its own, naming Citus mode, rather than batched with others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_concurrency_check_is_refused_naming_citus_mode() {
    let pg = common::pg_store(&cluster().0).await;
    let slot = spec(1, 99, Algorithm::Concurrency, 2, 30_000);
    let batch = Check { buckets: vec![slot], cost: 1, fallback: MemoryFallback::Refuse, lease: None };
    let refused = pg.check_as_of(&batch, Utc::now()).await.expect_err("refused");
    assert!(refused.to_string().contains(pglimit::storage::CONCURRENCY_ON_CITUS), "{refused}");
}

/// Through the service the same refusal is the caller's mistake, a 400
/// naming `algorithm`, and a policy file with a concurrency bucket does not
/// start: neither is answered from memory as if Postgres had failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_concurrency_check_is_a_400_naming_algorithm_and_such_a_policy_does_not_start() {
    let (url, _) = cluster();
    let app = common::instance(&url, &[]).await;
    let slot = serde_json::json!({ "key": "export:acct_42", "limit": 2, "algorithm": "concurrency", "lease": "30s" });
    let refused = common::check(&app, slot).await;
    assert_eq!(refused.status, axum::http::StatusCode::BAD_REQUEST, "{}", refused.body);
    assert_eq!(refused.body["field"], "algorithm", "{}", refused.body);
    assert!(refused.body["detail"].as_str().is_some_and(|d| d.contains("Citus")), "{}", refused.body);

    let policies = common::policy_file(
        "[policies.export]\nidentifiers = { account = \"text\" }\n[[policies.export.buckets]]\n\
         name = \"in_flight\"\non = [\"account\"]\nlimit = 2\nalgorithm = \"concurrency\"\nlease = \"30s\"\n",
    );
    let path = policies.to_str().expect("UTF-8 path");
    let error =
        common::try_instance(&url, &[("PGLIMIT_POLICIES", path)]).await.err().expect("refused at start");
    assert!(
        error.contains("\"export\"") && error.contains("\"in_flight\"") && error.contains("Citus"),
        "{error}"
    );
}

/// A reload that would put a concurrency bucket in force in Citus mode is
/// refused whole, as at start: the policies in force stay, and the failed
/// reload is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_reload_that_adds_a_concurrency_bucket_is_refused_and_the_policies_in_force_stay() {
    const FAILED: &str = "pglimit_policy_reloads_total{result=\"error\"}";
    let (url, _) = cluster();
    let export = "[policies.export]\nidentifiers = { account = \"text\" }\n[[policies.export.buckets]]\n\
                  name = \"in_flight\"\non = [\"account\"]\nlimit = 2\n";
    let plain = format!("{export}window = \"60s\"\n");
    let file = common::policy_file(&plain);
    let settings =
        [("PGLIMIT_POLICIES", file.to_str().expect("UTF-8 path")), ("PGLIMIT_WATCH_POLICIES", "true")];
    let service = common::try_service(&url, &settings).await.expect("a policy without leases starts");
    let app = &service.state;
    let (in_force, failed) =
        (common::readyz(app).await["policies"].clone(), common::metric(app, FAILED).await);
    std::fs::write(&file, format!("{export}algorithm = \"concurrency\"\nlease = \"30s\"\n"))
        .expect("rewrite");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while common::metric(app, FAILED).await <= failed {
        assert!(std::time::Instant::now() < deadline, "the rewritten file was never read");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(common::readyz(app).await["policies"], in_force, "the policies in force stay");
    let reply =
        common::check(app, serde_json::json!({ "policy": "export", "identifiers": { "account": "a1" } }))
            .await;
    assert_eq!(reply.status, axum::http::StatusCode::OK, "{}", reply.body);
    assert!(reply.body.get("lease").is_none(), "no lease taken: {}", reply.body);
}
