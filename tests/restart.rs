//! The real binary restarted or flooded under load: no count lost or
//! counted twice, limits kept, memory bounded.

mod common;

use std::time::{Duration, Instant};

use common::process::*;
use pglimit::pg_cluster::StopMode;
use serde_json::{json, Value};

/// Which process serves now (0 or 1) and its address; `None` once the last
/// has stopped.
type Target = tokio::sync::watch::Receiver<Option<(usize, String)>>;

/// Whole answers received and checks admitted, from one process.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    answered: u64,
    admitted: u64,
}

/// What clients received from each of the two processes, and how many of
/// their requests got no answer (and were retried), by kind.
#[derive(Debug, Default)]
struct Tally {
    answers: [Counts; 2],
    refused: u64,
    closed_early: u64,
}

impl Tally {
    fn add(&mut self, process: usize, admitted: bool) {
        self.answers[process].answered += 1;
        self.answers[process].admitted += u64::from(admitted);
    }

    fn no_answer(&mut self, kind: NoAnswer) {
        match kind {
            NoAnswer::Refused => self.refused += 1,
            NoAnswer::ClosedEarly => self.closed_early += 1,
        }
    }

    fn merge(mut self, other: Tally) -> Tally {
        for (mine, theirs) in self.answers.iter_mut().zip(other.answers) {
            mine.answered += theirs.answered;
            mine.admitted += theirs.admitted;
        }
        self.refused += other.refused;
        self.closed_early += other.closed_early;
        self
    }
}

/// Sends `body` again and again, `pace` apart, to whichever process
/// `target` names. A request that gets no answer means that process is gone
/// (or not yet there): counted, and retried on the target. A timeout or an
/// answer cut mid-body fails the test (`no_answer`). Only whole answers count.
async fn restart_client(target: Target, body: Value, pace: Duration) -> Tally {
    let client = http_client();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut tally = Tally::default();
    loop {
        let current = target.borrow().clone();
        let Some((process, addr)) = current else { return tally };
        assert!(Instant::now() < deadline, "the restart test ran past its deadline");
        let reply = match client.post(format!("http://{addr}/check")).json(&body).send().await {
            Ok(reply) => reply,
            Err(e) => {
                tally.no_answer(no_answer(&e));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let status = reply.status().as_u16();
        let decision: Value = reply.json().await.expect("a whole JSON answer");
        assert_eq!(decision["store"], "postgres", "{decision}");
        assert!(status == 200 || status == 429, "status {status}: {decision}");
        tally.add(process, status == 200);
        tokio::time::sleep(pace).await;
    }
}

/// More than this many answers from each process, from the busy clients.
const BUSY_ANSWERS: u64 = 150;

/// 16 clients back to back on a key that admits everything, and one on a
/// key of limit 50, paced so that its limit is reached in the second process.
fn start_restart_clients(
    target: &Target,
) -> (Vec<tokio::task::JoinHandle<Tally>>, tokio::task::JoinHandle<Tally>) {
    let big = json!({ "key": "restart-big", "limit": 1_000_000_000u64, "window": "1h" });
    let busy =
        (0..16).map(|_| tokio::spawn(restart_client(target.clone(), big.clone(), Duration::ZERO))).collect();
    let small = json!({ "key": "restart-small", "limit": 50, "window": "1h" });
    (busy, tokio::spawn(restart_client(target.clone(), small, Duration::from_millis(40))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_under_load_loses_no_count_counts_none_twice_and_keeps_limits() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("restart");
    let url = cluster.url();
    let envs = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let first = start(&envs, &dir);
    let (retarget, target) = tokio::sync::watch::channel(Some((0, first.addr.clone())));
    let (busy, paced) = start_restart_clients(&target);

    // Switch once both keys have counts in the first process, the paced one
    // far from its limit (40 more checks take at least 40 paces).
    common::wait_for_stored_count(&url, "restart-small", 10).await;
    common::wait_for_stored_count(&url, "restart-big", BUSY_ANSWERS).await;
    let first_log = tokio::task::spawn_blocking(move || first.terminate()).await.unwrap();
    let at_restart = common::stored_count(&url, "restart-big").await;
    // Meanwhile the clients keep trying the old address.
    let second = tokio::task::block_in_place(|| start(&envs, &dir));
    retarget.send_replace(Some((1, second.addr.clone())));
    common::wait_for_stored_count(&url, "restart-big", at_restart + BUSY_ANSWERS).await;
    common::wait_for_stored_count(&url, "restart-small", 50).await;
    let (status, reply) = second.check(json!({ "key": "restart-small", "limit": 50, "window": "1h" })).await;
    assert_eq!(status, 429, "the second process keeps the shared limit: {reply}");
    let second_log = tokio::task::spawn_blocking(move || second.terminate()).await.unwrap();
    retarget.send_replace(None);

    let mut big = Tally::default();
    for client in busy {
        big = big.merge(client.await.expect("client"));
    }
    let small = paced.await.expect("paced client");
    assert_restart_lost_nothing(&url, &big, &small).await;
    for log in [first_log, second_log] {
        assert_eq!(messages_containing(&log, "finishing requests in flight"), 1);
    }
    drop(cluster);
}

/// Both processes answered under load; Postgres counted exactly the checks
/// answered (none lost in either shutdown, none counted twice); and the
/// small key admitted exactly its limit, part in each process.
async fn assert_restart_lost_nothing(url: &str, big: &Tally, small: &Tally) {
    // Clients back to back on the first process's address after it exited
    // cannot all have been answered: the restart really came between them.
    assert!(big.refused + big.closed_early > 0, "no request met the restart: {big:?}");
    let [a, b] = big.answers;
    assert!(a.answered >= BUSY_ANSWERS && b.answered >= BUSY_ANSWERS, "first {a:?}, second {b:?}");
    assert!(a.admitted == a.answered && b.admitted == b.answered, "a limit of 10^9 denied");
    let answered = a.answered + b.answered;
    assert_eq!(common::stored_count(url, "restart-big").await, answered, "counted in postgres vs answered");

    let [a, b] = small.answers;
    assert!(a.admitted > 0 && b.admitted > 0, "the limit was not shared: first {a:?}, second {b:?}");
    assert_eq!(a.admitted + b.admitted, 50, "first {a:?}, second {b:?}");
    assert_eq!(common::stored_count(url, "restart-small").await, 50);
}

/// Resident memory of process `pid` (`VmRSS`), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmRSS in kB")
}

/// Checks `n` new ad hoc keys named `prefix-<i>` (window `window`), 32 at a
/// time; asserts each is admitted by the memory fallback.
async fn flood(endpoint: &str, prefix: &str, n: u32, window: &str) {
    let client = http_client();
    let workers: Vec<_> = (0..32)
        .map(|first| {
            let (client, endpoint) = (client.clone(), endpoint.to_owned());
            let bodies: Vec<Value> = (first..n)
                .step_by(32)
                .map(|i| json!({ "key": format!("{prefix}-{i}"), "limit": 5, "window": window }))
                .collect();
            tokio::spawn(async move {
                for body in bodies {
                    let reply = client.post(&endpoint).json(&body).send().await.expect("an answer");
                    let status = reply.status().as_u16();
                    let decision: Value = reply.json().await.expect("a whole JSON answer");
                    assert_eq!(
                        (status, decision["store"].as_str(), decision["degraded"].as_bool()),
                        (200, Some("memory"), Some(true)),
                        "{decision}"
                    );
                }
            })
        })
        .collect();
    let all = async {
        for worker in workers {
            worker.await.expect("flood worker");
        }
    };
    tokio::time::timeout(Duration::from_secs(180), all).await.expect("the flood took over 3 minutes");
}

/// RSS before and after a flood of 64,000 new keys (1 s windows) during an
/// outage, the store filled beforehand (and connections and allocator warmed).
async fn rss_around_a_flood(service: &Running) -> (u64, u64) {
    let endpoint = format!("http://{}/check", service.addr);
    flood(&endpoint, "warm", 2_000, "1s").await;
    let before = rss_kib(service.child.id());
    flood(&endpoint, "flood", 64_000, "1s").await;
    (before, rss_kib(service.child.id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_unique_keys_during_an_outage_keeps_memory_bounded_and_the_busy_key_enforced() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("flood");
    let url = cluster.url();
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_MEMORY_CAPACITY", "1000"),
    ];
    let service = start(&envs, &dir);
    let early = json!({ "key": "early", "limit": 5, "window": "1h" });
    assert_eq!(service.check(early.clone()).await.1["store"], "postgres");
    let cluster = stop_cluster(cluster, StopMode::Immediate).await;

    // Memory starts from zero; the early key's window outlasts every flood
    // key's (1 s), so when a shard is full the flood keys are evicted first.
    for _ in 0..5 {
        let (status, reply) = service.check(early.clone()).await;
        assert_eq!((status, reply["store"].as_str()), (200, Some("memory")), "{reply}");
    }
    let (before, after) = rss_around_a_flood(&service).await;
    // 4 MiB sits far between a bounded store and one that kept every key
    // (measured both ways: docs/performance.md, "Design measurements").
    assert!(after < before + 4 * 1024, "RSS grew from {before} KiB to {after} KiB");
    let (status, reply) = service.check(early).await;
    assert_eq!(
        (status, reply["store"].as_str()),
        (429, Some("memory")),
        "the early key was evicted: {reply}"
    );

    let cluster = restart_cluster(cluster).await;
    service.wait_for_postgres(&json!({ "key": "after", "limit": 5, "window": "1h" })).await;
    service.terminate();
    drop(cluster);
}
