//! The real binary, as an operator runs it: zero-config start, logs,
//! signals, and refusals at start-up.

mod common;

use std::time::{Duration, Instant};

use common::process::*;
use common::prometheus::{scrape, value};
use pglimit::pg_cluster::StopMode;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_start_serves_from_a_private_postgres_and_keeps_counters_across_restarts() {
    let dir = temp_dir("zero-config");
    let data = dir.join("data");
    let envs = [("PGLIMIT_DATA_DIR", data.to_str().unwrap())];
    let body = json!({ "key": "report", "limit": 2, "window": "1h" });

    let service = start(&envs, &dir);
    assert_eq!(messages_containing(&service.log, "started a private PostgreSQL"), 1);
    let (status, reply) = service.check(body.clone()).await;
    assert_eq!((status, reply["store"].as_str()), (200, Some("postgres")));
    let log = service.terminate();
    assert_eq!(messages_containing(&log, "stopped the private PostgreSQL"), 1);
    assert!(!data.join("pg/postmaster.pid").exists(), "the private cluster was stopped");

    // Same data directory, same generated secret: the count carried over.
    let service = start(&envs, &dir);
    assert_eq!(service.check(body.clone()).await.0, 200);
    assert_eq!(service.check(body).await.0, 429);
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_configured_it_starts_in_dot_pglimit_of_the_working_directory() {
    let dir = temp_dir("default-dir");
    let log = dir.join("pglimit.log");
    let file = std::fs::File::create(&log).expect("log file");
    let child = command(&[]).current_dir(&dir).stderr(file).spawn().expect("spawn pglimit");
    let mut service = Running { child, log, addr: String::new() };
    service.addr = wait_for_listening(&service.log);
    let (status, reply) = service.check(json!({ "key": "k", "limit": 1, "window": "1m" })).await;
    assert_eq!((status, reply["store"].as_str()), (200, Some("postgres")));
    assert!(dir.join(".pglimit/pg/PG_VERSION").exists());
    assert!(dir.join(".pglimit/key-secret").exists());
    service.terminate();
}

/// As root the cluster runs as `postgres`, which cannot enter a 0700
/// directory of root's: it then runs in a directory of its own, named in
/// the log, and still stops with the service. (Not as root, the cluster
/// runs as this user, who can enter the directory: it stays there.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_from_a_directory_postgres_cannot_enter_still_starts() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = temp_dir("closed-dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let log = dir.join("pglimit.log");
    let child = command(&[]).current_dir(&dir).stderr(std::fs::File::create(&log).expect("log")).spawn();
    let mut service = Running { child: child.expect("spawn pglimit"), log, addr: String::new() };
    service.addr = wait_for_listening(&service.log);
    let (status, reply) = service.check(json!({ "key": "k", "limit": 1, "window": "1m" })).await;
    assert_eq!((status, reply["store"].as_str()), (200, Some("postgres")), "{reply}");
    let moved = log_lines(&service.log)
        .into_iter()
        .find(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains("cannot enter")));
    let as_root = std::fs::metadata("/proc/self").expect("/proc/self").uid() == 0;
    let cluster = match (as_root, moved) {
        (true, Some(line)) => {
            std::path::PathBuf::from(line["fields"]["cluster"].as_str().expect("the cluster's directory"))
        }
        (true, None) => panic!("as root, the cluster should have moved out of a 0700 directory"),
        (false, moved) => {
            assert!(moved.is_none(), "this user can enter its own directory");
            dir.join(".pglimit/pg")
        }
    };
    assert!(cluster.join("PG_VERSION").exists(), "{}", cluster.display());
    let log = service.terminate();
    assert_eq!(messages_containing(&log, "stopped the private PostgreSQL"), 1);
    assert!(!cluster.join("postmaster.pid").exists(), "the private cluster was stopped");
    if as_root {
        std::fs::remove_dir_all(&cluster).expect("remove the moved cluster");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_is_logged_once_when_postgres_goes_and_once_when_it_returns() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("fallback-log");
    let url = cluster.url();
    let envs = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let service = start(&envs, &dir);
    let body = json!({ "key": "k", "limit": 1000, "window": "1h" });
    assert_eq!(service.check(body.clone()).await.1["store"], "postgres");

    let cluster = stop_cluster(cluster, StopMode::Fast).await;
    for _ in 0..30 {
        let (status, reply) = service.check(body.clone()).await;
        assert_eq!((status, reply["store"].as_str()), (200, Some("memory")));
    }
    let cluster = restart_cluster(cluster).await;
    service.wait_for_postgres(&body).await;
    for _ in 0..10 {
        let (status, reply) = service.check(body.clone()).await;
        assert_eq!((status, reply["store"].as_str()), (200, Some("postgres")), "{reply}");
    }
    assert_eq!(messages_containing(&service.log, "postgres unreachable"), 1);
    assert_eq!(messages_containing(&service.log, "postgres is back"), 1);
    // Going away is a warning; coming back is news, not a problem.
    assert_eq!(level_of(&service.log, "postgres unreachable"), "WARN");
    assert_eq!(level_of(&service.log, "postgres is back"), "INFO");
    service.terminate();
    drop(cluster);
}

#[test]
fn without_server_binaries_it_exits_naming_the_package_and_the_alternative() {
    let dir = temp_dir("no-binaries");
    let (ok, stderr) =
        run_to_exit(&[("PGLIMIT_DATA_DIR", dir.to_str().unwrap()), ("PGLIMIT_PG_BIN", "/nonexistent")]);
    assert!(!ok);
    assert!(stderr.contains("apt-get install postgresql") && stderr.contains("DATABASE_URL"), "{stderr}");
}

/// The review's case: a data directory another local account made first,
/// holding a password of its choosing, would make that account the private
/// cluster's superuser. As root the test gives a directory to `nobody`;
/// otherwise it names a directory of root's, which this account is not.
#[test]
fn a_data_directory_of_another_account_stops_start_up_naming_it() {
    use std::os::unix::fs::MetadataExt;
    let dir = temp_dir("pre-seeded");
    let seeded = dir.join("data");
    let me = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    let seeded = if me == 0 {
        std::fs::create_dir(&seeded).expect("mkdir");
        std::fs::write(seeded.join("pg-password"), "chosen-by-nobody").expect("password");
        std::os::unix::fs::chown(&seeded, Some(65534), Some(65534)).expect("chown nobody");
        seeded
    } else {
        std::path::PathBuf::from("/")
    };
    let (ok, stderr) = run_to_exit(&[("PGLIMIT_DATA_DIR", seeded.to_str().unwrap())]);
    assert!(!ok);
    let named = format!("{} belongs to uid", seeded.display());
    assert!(stderr.contains(&named) && stderr.contains("PGLIMIT_DATA_DIR"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line at start-up: {stderr}");
}

#[test]
fn without_tokens_it_refuses_to_listen_beyond_loopback() {
    let (ok, stderr) = run_to_exit(&[
        ("PGLIMIT_BIND", "0.0.0.0:0"),
        ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
    ]);
    assert!(!ok);
    assert!(stderr.contains("PGLIMIT_API_TOKENS"), "{stderr}");
}

#[test]
fn a_database_url_without_a_shared_secret_is_a_start_up_error() {
    let (ok, stderr) = run_to_exit(&[("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")]);
    assert!(!ok);
    assert!(stderr.contains("PGLIMIT_KEY_SECRET") && stderr.contains("same secret"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_finishes_requests_in_flight_and_loses_no_count() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("drain");
    let url = cluster.url();
    let envs = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let service = start(&envs, &dir);
    let endpoint = format!("http://{}/check", service.addr);
    let body = json!({ "key": "drain", "limit": 1_000_000_000u64, "window": "1h" });

    // 16 clients send checks back to back until the service goes away: each
    // stops at its first request that gets no answer (so one such error per
    // client, of a kind `no_answer` accepts), or fails at a deadline.
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (endpoint, body) = (endpoint.clone(), body.clone());
            tokio::spawn(async move {
                let client = http_client();
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut admitted = 0u64;
                loop {
                    assert!(Instant::now() < deadline, "the service still answered after 60 s");
                    match client.post(&endpoint).json(&body).send().await {
                        Ok(reply) => {
                            let status = reply.status().as_u16();
                            let decision: Value = reply.json().await.expect("a whole JSON answer");
                            assert_eq!((status, decision["store"].as_str()), (200, Some("postgres")));
                            admitted += 1;
                        }
                        Err(e) => {
                            // The service has gone: this client's one error,
                            // never a timeout or a cut answer.
                            no_answer(&e);
                            return admitted;
                        }
                    }
                }
            })
        })
        .collect();
    common::wait_for_stored_count(&url, "drain", 101).await;
    let log = tokio::task::spawn_blocking(move || service.terminate()).await.unwrap();
    let mut answered = 0;
    for client in clients {
        answered += client.await.expect("client");
    }
    assert!(answered > 100, "only {answered} checks answered before SIGTERM");

    // Every check Postgres counted was answered, and none twice.
    assert_eq!(
        common::stored_count(&url, "drain").await,
        answered,
        "counted in postgres vs answered over HTTP"
    );
    assert_eq!(messages_containing(&log, "finishing requests in flight"), 1);
    drop(cluster);
}

/// Two processes on one database: an override set through the admin API of
/// one is applied by the other within the bound, and so is its removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_override_set_on_one_process_reaches_the_other_within_a_second() {
    let (dir, url) = (temp_dir("overrides"), common::fresh_database().await);
    let envs = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let (a, b) = (start(&envs, &dir), start(&envs, &dir));
    let bound = pglimit::storage::OVERRIDES_POLL_EVERY * 2;
    let peek = json!({ "policy": "login", "identifiers": { "email": "vip@example.com", "ip": "203.0.113.9" }, "cost": 0 });
    let set = json!({ "policy": "login", "when": { "email": "vip@example.com" }, "unlimited": true });
    let added = http_client().post(format!("http://{}/admin/overrides", a.addr)).json(&set).send().await;
    let added = added.expect("an answer");
    assert_eq!(added.status().as_u16(), 201);
    let id = added.json::<Value>().await.expect("JSON")["id"].clone();
    let took = until(&b, &peek, |body| body["override"]["id"] == id).await;
    assert!(took < bound, "applied after {took:?}");

    let path = format!("http://{}/admin/overrides/{}", a.addr, id.as_str().unwrap_or_default());
    assert_eq!(http_client().delete(path).send().await.expect("an answer").status().as_u16(), 200);
    let took = until(&b, &peek, |body| body.get("override").is_none()).await;
    assert!(took < bound, "removed after {took:?}");
    a.terminate();
    b.terminate();
}

/// Checks `body` on `service` until the answer satisfies `done`; how long that took.
async fn until(service: &Running, body: &Value, done: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let (_, reply) = service.check(body.clone()).await;
        if done(&reply) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(15), "never: {reply}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A monthly quota in a policy file, through the binary on today's date:
/// it resets on the 1st in its zone; a calendar window with another
/// algorithm stops the start with one line naming the bucket's setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monthly_quota_resets_on_the_first_in_its_zone_and_a_sliding_one_is_refused() {
    let url = common::fresh_database().await;
    let dir = temp_dir("calendar");
    let policy = |algorithm: &str| {
        format!(
            "[policies.api]\nidentifiers = {{ account = \"text\" }}\n[[policies.api.buckets]]\nname = \"monthly\"\n\
             on = [\"account\"]\nlimit = 2\nwindow = \"1 calendar month\"\ntimezone = \"Europe/Berlin\"\n\
             algorithm = \"{algorithm}\"\n"
        )
    };
    let file = dir.join("policies.toml");
    std::fs::write(&file, policy("fixed_window")).expect("policy file");
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_POLICIES", path(&file)),
    ];
    let service = start(&envs, &dir);
    let body = json!({ "policy": "api", "identifiers": { "account": "acct_42" }, "cost": 2 });
    let before = chrono::Utc::now();
    let (status, reply) = service.check(body.clone()).await;
    let after = chrono::Utc::now();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(service.check(body).await.0, 429, "the month's quota is used up");
    let reset: chrono::DateTime<chrono::Utc> =
        reply["reset_at"].as_str().expect("reset_at").parse().expect("time");
    let firsts = [before, after].map(next_first_in_berlin);
    assert!(firsts.contains(&reset), "reset {reset}, Berlin's next 1st {firsts:?}");
    service.terminate();

    std::fs::write(&file, policy("sliding_window")).expect("policy file");
    let (ok, stderr) = run_to_exit(&envs);
    assert!(!ok);
    assert!(stderr.contains("window") && stderr.contains("sliding_window"), "{stderr}");
}

fn next_first_in_berlin(now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    use chrono::{Datelike, TimeZone};
    let berlin = chrono_tz::Europe::Berlin;
    let today = now.with_timezone(&berlin).date_naive();
    let first = today.with_day(1).and_then(|d| d.checked_add_months(chrono::Months::new(1))).expect("date");
    let midnight = first.and_hms_opt(0, 0, 0).expect("midnight");
    berlin.from_local_datetime(&midnight).single().expect("a local time").with_timezone(&chrono::Utc)
}

/// A check held by `max_wait` is answered (its 429, at once) when the
/// process gets SIGTERM, rather than cut off or left to its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_check_held_by_max_wait_with_its_429_at_once() {
    let (dir, url) = (temp_dir("held"), common::fresh_database().await);
    let envs = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let service = start(&envs, &dir);
    // One token per window: the held check would be admitted a window later.
    let window = Duration::from_secs(10);
    let body =
        json!({ "key": "held", "limit": 1, "window": "10s", "algorithm": "token_bucket", "max_wait": "15s" });
    assert_eq!(service.check(body.clone()).await.0, 200);
    let endpoint = format!("http://{}/check", service.addr);
    let held = tokio::spawn(async move { http_client().post(endpoint).json(&body).send().await });
    while value(&scrape(&service).await, "pglimit_waiting", &[]) != 1.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = tokio::task::spawn_blocking(move || service.terminate()).await.expect("terminated");
    let reply = held.await.expect("held task").expect("an answer, not a cut connection");
    assert_eq!(reply.status().as_u16(), 429);
    let decision: Value = reply.json().await.expect("JSON");
    let waited = Duration::from_millis(decision["waited_ms"].as_u64().expect("waited_ms"));
    assert!(waited < window, "answered on SIGTERM, not at the refill: {decision}");
    assert_eq!(messages_containing(&log, "finishing requests in flight"), 1);
}

/// The denials counted since the last flush are written when the process
/// stops on SIGTERM: the top list loses none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_writes_the_denials_counted_since_the_last_flush() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("top-exit");
    let url = cluster.url();
    let service = start(&[("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)], &dir);
    let body = json!({ "key": "denied-at-exit", "limit": 1, "window": "1h" });
    let statuses: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(service.check(body.clone()).await.0);
        }
        statuses
    };
    assert_eq!(statuses, [200, 429, 429, 429]);
    tokio::task::spawn_blocking(move || service.terminate()).await.expect("terminated");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (denials,): (Option<i64>,) =
        sqlx::query_as("SELECT sum(count)::bigint FROM pglimit_denials WHERE key = $1")
            .bind(common::adhoc_key("denied-at-exit").as_slice())
            .fetch_one(&pool)
            .await
            .expect("the top list's table");
    assert_eq!(denials, Some(3));
    drop(cluster);
}
