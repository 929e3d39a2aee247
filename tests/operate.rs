//! Operating the real binary: exact metrics (one recorder per process),
//! shadow counts, and policies reloaded on SIGHUP and on a file write, with
//! a broken edit leaving the policies in force and a half-written file
//! never read.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::process::*;
use common::prometheus::{scrape, value};
use pglimit::policy::short_hash;
use prometheus_parse::{Scrape, Value as Metric};
use serde_json::{json, Value};

fn policy(mode: &str, limit: u64) -> String {
    format!(
        "[policies.signup]\nmode = \"{mode}\"\nidentifiers = {{ ip = \"ip\" }}\n\n\
         [[policies.signup.buckets]]\nname = \"per_ip\"\non = [\"ip\"]\nlimit = {limit}\nwindow = \"1h\"\n"
    )
}

fn signup(ip: &str) -> Value {
    json!({ "policy": "signup", "identifiers": { "ip": ip } })
}

async fn start_on_fresh_database(extra: &[(&str, &str)], dir: &Path) -> Running {
    let url = common::fresh_database().await;
    // A long timeout: the counts asserted here are by store, and a stall on
    // a busy machine must not switch a check to memory.
    let mut envs = vec![
        ("DATABASE_URL", url.as_str()),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_DB_TIMEOUT_MS", "5000"),
    ];
    envs.extend_from_slice(extra);
    start(&envs, dir)
}

/// How many observations the histogram `name` holds, over all its labels.
fn observations(scrape: &Scrape, name: &str) -> f64 {
    let histograms = scrape.samples.iter().filter(|s| s.metric == name);
    histograms
        .map(|s| match &s.value {
            Metric::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

fn checks(scrape: &Scrape, policy: &str, decision: &str, store: &str) -> f64 {
    value(scrape, "pglimit_checks_total", &[("policy", policy), ("decision", decision), ("store", store)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_on_login_is_counted_under_its_policy_and_the_bucket_that_denied_it() {
    let dir = temp_dir("metrics");
    let service = start_on_fresh_database(&[], &dir).await;
    let login =
        json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "198.51.100.4" } });
    for _ in 0..5 {
        assert_eq!(service.check(login.clone()).await.0, 200);
    }
    assert_eq!(service.check(login.clone()).await.0, 429);
    assert_eq!(service.check(login).await.0, 429, "the repeat is answered by the deny cache");
    service.check(json!({ "key": "report", "limit": 9, "window": "1m" })).await;

    let scrape = scrape(&service).await;
    assert_eq!(checks(&scrape, "login", "allowed", "postgres"), 5.0);
    assert_eq!(checks(&scrape, "login", "denied", "postgres"), 1.0);
    assert_eq!(checks(&scrape, "login", "denied", "deny_cache"), 1.0);
    assert_eq!(checks(&scrape, "_adhoc", "allowed", "postgres"), 1.0);
    let denials =
        |bucket| value(&scrape, "pglimit_bucket_denials_total", &[("policy", "login"), ("bucket", bucket)]);
    assert_eq!((denials("email_ip"), denials("ip"), denials("email")), (2.0, 0.0, 0.0));
    assert_eq!(observations(&scrape, "pglimit_check_duration_seconds"), 8.0);
    let calls = observations(&scrape, "pglimit_db_call_duration_seconds");
    assert!((1.0..=7.0).contains(&calls), "{calls} calls for 7 checks that went to Postgres");
    assert_eq!(observations(&scrape, "pglimit_batch_size"), calls);
    assert_eq!(value(&scrape, "pglimit_degraded", &[]), 0.0);
    assert_eq!(value(&scrape, "pglimit_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert!(scrape.samples.iter().all(|s| s.labels.get("email").is_none() && s.labels.get("ip").is_none()));
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_over_its_limit_is_counted_as_shadow_denied() {
    let dir = temp_dir("shadow-metrics");
    let file = dir.join("policies.toml");
    std::fs::write(&file, policy("shadow", 1)).expect("policy file");
    let service = start_on_fresh_database(&[("PGLIMIT_POLICIES", file.to_str().unwrap())], &dir).await;
    let (status, first) = service.check(signup("192.0.2.1")).await;
    assert_eq!((status, first["would_allow"].as_bool()), (200, Some(true)));
    for _ in 0..2 {
        let (status, over) = service.check(signup("192.0.2.1")).await;
        assert_eq!(
            (status, over["shadow"].as_bool(), over["would_allow"].as_bool()),
            (200, Some(true), Some(false))
        );
    }

    let scrape = scrape(&service).await;
    assert_eq!(checks(&scrape, "signup", "allowed", "postgres"), 1.0);
    let shadow_denied = checks(&scrape, "signup", "shadow_denied", "postgres")
        + checks(&scrape, "signup", "shadow_denied", "deny_cache");
    assert_eq!(shadow_denied, 2.0);
    assert_eq!(
        value(&scrape, "pglimit_bucket_denials_total", &[("policy", "signup"), ("bucket", "per_ip")]),
        2.0
    );
    service.terminate();
}

/// The hash of the policies in force, as `/readyz` shows it.
async fn policies_in_force(service: &Running) -> String {
    let url = format!("http://{}/readyz", service.addr);
    let ready: Value = http_client().get(url).send().await.expect("readyz").json().await.expect("JSON");
    ready["policies"].as_str().expect("a hash").to_owned()
}

/// Waits until `/readyz` shows the policies of `text` in force.
async fn wait_for_policies(service: &Running, text: &str) {
    let wanted = short_hash(text);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let in_force = policies_in_force(service).await;
        if in_force == wanted {
            return;
        }
        assert!(Instant::now() < deadline, "policies {wanted} never in force, still {in_force}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_failed_reloads(service: &Running, count: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while value(&scrape(service).await, "pglimit_policy_reloads_total", &[("result", "error")]) < count {
        assert!(Instant::now() < deadline, "the broken file was not read {count} times");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn hang_up(service: &Running) {
    let pid = service.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
}

/// Limit 5, one check; the limit becomes 2 in the file (`reload` makes
/// the service read it); the 2nd check passes and the 3rd is refused.
async fn a_lowered_limit_applies_to_the_count_so_far(watch: &str, reload: impl Fn(&Running)) {
    let dir = temp_dir("reload");
    let file = dir.join("policies.toml");
    std::fs::write(&file, policy("enforce", 5)).expect("policy file");
    let envs = [("PGLIMIT_POLICIES", file.to_str().unwrap()), ("PGLIMIT_WATCH_POLICIES", watch)];
    let service = start_on_fresh_database(&envs, &dir).await;
    assert_eq!(service.check(signup("192.0.2.7")).await.1["remaining"], 4);

    std::fs::write(&file, policy("enforce", 2)).expect("rewrite");
    reload(&service);
    wait_for_policies(&service, &policy("enforce", 2)).await;
    let (status, second) = service.check(signup("192.0.2.7")).await;
    assert_eq!((status, second["limit"].as_u64(), second["remaining"].as_u64()), (200, Some(2), Some(0)));
    assert_eq!(service.check(signup("192.0.2.7")).await.0, 429, "the 3rd check is over the new limit");
    let scrape = scrape(&service).await;
    assert_eq!(value(&scrape, "pglimit_policy_reloads_total", &[("result", "ok")]), 1.0);
    assert_eq!(messages_containing(&service.log, "policies reloaded"), 1);
    let row = reload_row(&service).await;
    let trigger = if watch == "true" { "file change" } else { "SIGHUP" };
    assert_eq!((row["actor"].as_str(), row["detail"]["trigger"].as_str()), (Some("system"), Some(trigger)));
    let digests = (row["detail"]["before"].as_str(), row["detail"]["after"].as_str());
    let (before, after) = (short_hash(&policy("enforce", 5)), short_hash(&policy("enforce", 2)));
    assert_eq!(digests, (Some(before.as_str()), Some(after.as_str())));
    service.terminate();
}

/// The audit row of the service's one reload, once it is written (just
/// after the new policies are in force).
async fn reload_row(service: &Running) -> Value {
    let url = format!("http://{}/admin/audit?action=policies_reloaded", service.addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page: Value = http_client().get(&url).send().await.expect("audit").json().await.expect("JSON");
        if let Some(row) = page["entries"].get(0) {
            assert_eq!(page["entries"].as_array().map(Vec::len), Some(1), "{page}");
            return row.clone();
        }
        assert!(Instant::now() < deadline, "no reload row: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_in_the_file_is_enforced_after_sighup_without_a_restart() {
    a_lowered_limit_applies_to_the_count_so_far("false", hang_up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_by_a_plain_write_to_the_file_is_enforced_without_a_signal() {
    a_lowered_limit_applies_to_the_count_so_far("true", |_| {}).await;
}

/// A file whose first part alone parses: `limit = 10` of `limit = 1000`,
/// without the override that follows.
const LIMIT_LAST: &str = "[policies.signup]\nidentifiers = { ip = \"ip\" }\n\n\
    [[policies.signup.buckets]]\nname = \"per_ip\"\non = [\"ip\"]\nwindow = \"1h\"\nlimit = 1000\n\n\
    [[policies.signup.overrides]]\nwhen = { ip = \"192.0.2.66\" }\ndeny = true\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_in_two_parts_with_a_long_pause_is_never_in_force_half_written() {
    let dir = temp_dir("half-written");
    let file = dir.join("policies.toml");
    std::fs::write(&file, policy("enforce", 5)).expect("policy file");
    let service = start_on_fresh_database(&[("PGLIMIT_POLICIES", file.to_str().unwrap())], &dir).await;
    let before = policies_in_force(&service).await;
    let (head, tail) = LIMIT_LAST.split_at(LIMIT_LAST.find("limit = 10").expect("a limit") + 10);
    assert!(pglimit::policy::Policies::parse(head).is_ok(), "the first part alone is a valid file");

    let mut writer = std::fs::File::create(&file).expect("open the file to rewrite it");
    writer.write_all(head.as_bytes()).expect("first part");
    // Ten settle times, the file half written and still open.
    let resume = Instant::now() + 10 * pglimit::reload::SETTLE;
    while Instant::now() < resume {
        assert_eq!(policies_in_force(&service).await, before, "a half-written file was put in force");
        tokio::time::sleep(pglimit::reload::SETTLE / 4).await;
    }
    writer.write_all(tail.as_bytes()).expect("second part");
    drop(writer);
    wait_for_policies(&service, LIMIT_LAST).await;
    let scrape = scrape(&service).await;
    let reloads = |result| value(&scrape, "pglimit_policy_reloads_total", &[("result", result)]);
    assert_eq!((reloads("ok"), reloads("error")), (1.0, 0.0), "read once, whole");
    assert_eq!(service.check(signup("192.0.2.66")).await.0, 429, "the second part's override holds");
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_edit_keeps_the_policies_in_force_and_says_where_the_file_is_wrong() {
    let dir = temp_dir("broken-reload");
    let file = dir.join("policies.toml");
    std::fs::write(&file, policy("enforce", 1)).expect("policy file");
    let service = start_on_fresh_database(&[("PGLIMIT_POLICIES", file.to_str().unwrap())], &dir).await;

    std::fs::write(&file, policy("enforce", 0)).expect("a limit of 0 is invalid");
    wait_for_failed_reloads(&service, 1.0).await;
    hang_up(&service); // a signal reads the same broken file: still nothing changes
    wait_for_failed_reloads(&service, 2.0).await;
    wait_for_policies(&service, &policy("enforce", 1)).await;
    assert_eq!(service.check(signup("192.0.2.8")).await.0, 200);
    assert_eq!(service.check(signup("192.0.2.8")).await.0, 429, "the old limit of 1 holds");
    let failed = log_lines(&service.log)
        .into_iter()
        .find(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("policy reload failed")));
    let message = failed.expect("a log line for the failed reload")["fields"]["message"].to_string();
    assert!(message.contains("line 8, column 9"), "{message}");
    assert_eq!(level_of(&service.log, "policy reload failed"), "ERROR");
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_debug_each_request_logs_one_line_with_its_id_policy_and_decision_and_no_identifier() {
    let dir = temp_dir("request-log");
    let service = start_on_fresh_database(&[("RUST_LOG", "info,pglimit=debug,tower_http=debug")], &dir).await;
    let login =
        json!({ "policy": "login", "identifiers": { "email": "who@example.com", "ip": "198.51.100.77" } });
    let reply = http_client()
        .post(format!("http://{}/check", service.addr))
        .header("x-request-id", "trace-me-1")
        .json(&login)
        .send()
        .await
        .expect("reply");
    assert_eq!(
        (reply.status().as_u16(), reply.headers()["x-request-id"].to_str().ok()),
        (200, Some("trace-me-1"))
    );
    let log = service.terminate();

    let lines: Vec<Value> = log_lines(&log)
        .into_iter()
        .filter(|l| {
            l["fields"]["message"] == "finished processing request" && l["span"]["request_id"] == "trace-me-1"
        })
        .collect();
    assert_eq!(lines.len(), 1, "one line for the request");
    let (span, fields) = (&lines[0]["span"], &lines[0]["fields"]);
    assert_eq!((span["method"].as_str(), span["path"].as_str()), (Some("POST"), Some("/check")));
    assert_eq!((span["policy"].as_str(), span["decision"].as_str()), (Some("login"), Some("allowed")));
    assert_eq!((lines[0]["level"].as_str(), fields["status"].as_u64()), (Some("DEBUG"), Some(200)));
    assert!(fields["latency"].as_str().is_some_and(|l| l.ends_with("μs")), "{fields}");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains("who@example.com") && !text.contains("198.51.100.77"), "an identifier was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_without_a_policy_file_keeps_serving_the_built_in_policies() {
    let dir = temp_dir("hangup-builtin");
    let service = start_on_fresh_database(&[], &dir).await;
    hang_up(&service);
    let deadline = Instant::now() + Duration::from_secs(30);
    while messages_containing(&service.log, "no policy file (PGLIMIT_POLICIES) to reload") == 0 {
        assert!(Instant::now() < deadline, "SIGHUP was not caught");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let login =
        json!({ "policy": "login", "identifiers": { "email": "b@example.com", "ip": "198.51.100.5" } });
    assert_eq!(service.check(login).await.0, 200, "still serving after SIGHUP");
    service.terminate();
}
