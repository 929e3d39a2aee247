//! What a monitoring system sees of the real binary: on a fresh instance,
//! every series that can move and none that cannot; the heartbeat's count
//! of instances; and a real Prometheus scraping pglimit, computing the deny
//! share of docs/monitoring.md and evaluating deploy/prometheus/alerts.yml.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::process::*;
use common::prometheus::{self as prom, repository_file, scrape, value};
use pglimit::storage::{ALIVE_FOR, BEAT_EVERY};
use prometheus_parse::Scrape;
use serde_json::json;

/// A long Postgres timeout: the counts asserted here are by store, and a
/// stall on a busy machine must not switch a check to memory.
async fn start_on(url: &str, extra: &[(&str, &str)], dir: &Path) -> Running {
    let mut envs = vec![
        ("DATABASE_URL", url),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_DB_TIMEOUT_MS", "5000"),
    ];
    envs.extend_from_slice(extra);
    start(&envs, dir)
}

/// The `(policy, decision, store)` of every `pglimit_checks_total` series.
fn check_series(scrape: &Scrape) -> BTreeSet<(String, String, String)> {
    let series = scrape.samples.iter().filter(|s| s.metric == "pglimit_checks_total");
    let label = |s: &prometheus_parse::Sample, name: &str| s.labels.get(name).unwrap_or_default().to_owned();
    series.map(|s| (label(s, "policy"), label(s, "decision"), label(s, "store"))).collect()
}

/// `policy`'s series for these `(decision, store)` pairs.
fn series_of(policy: &str, outcomes: &[(&str, &str)]) -> BTreeSet<(String, String, String)> {
    outcomes.iter().map(|(d, s)| (policy.to_owned(), (*d).to_owned(), (*s).to_owned())).collect()
}

/// A policy that enforces and falls back to memory, as the built-ins do
/// and as ad hoc keys do.
const ENFORCED_IN_MEMORY: &[(&str, &str)] = &[
    ("allowed", "postgres"),
    ("denied", "postgres"),
    ("denied", "deny_cache"),
    ("allowed", "memory"),
    ("denied", "memory"),
];

fn has(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> bool {
    scrape.samples.iter().any(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_shows_the_series_its_built_in_policies_can_move_and_no_other() {
    let dir = temp_dir("fresh-metrics");
    let service = start_on(&common::fresh_database().await, &[], &dir).await;
    let scrape = scrape(&service).await;
    let mut expected = BTreeSet::new();
    for policy in ["login", "contact_confirmation", "_adhoc"] {
        expected.extend(series_of(policy, ENFORCED_IN_MEMORY));
    }
    assert_eq!(check_series(&scrape), expected, "15 series, every one at 0");
    assert_eq!(value(&scrape, "pglimit_checks_total", &[]), 0.0);
    for store in ["postgres", "memory", "deny_cache"] {
        assert!(has(&scrape, "pglimit_check_duration_seconds", &[("store", store)]), "{store}");
    }
    assert!(!has(&scrape, "pglimit_check_duration_seconds", &[("store", "none")]), "no check is uncounted");
    assert!(!has(&scrape, "pglimit_policy_reloads_total", &[]), "no policy file, nothing to reload");
    for (name, labels) in [
        ("pglimit_fallback_switches_total", &[("direction", "to_memory")][..]),
        ("pglimit_fallback_switches_total", &[("direction", "to_postgres")]),
        ("pglimit_postgres_refused_total", &[]),
        ("pglimit_cleanup_deleted_rows_total", &[]),
        ("pglimit_degraded", &[]),
        ("pglimit_top_lost_total", &[]),
    ] {
        assert!(has(&scrape, name, labels), "{name} {labels:?} is at 0 from the start");
    }
    service.terminate();
}

/// `payout` fails closed; `signup` is in shadow, admits uncounted when
/// Postgres is away, and has a deny list and an allow list.
const SHAPES: &str = r#"
[policies.payout]
on_store_error = "deny"
identifiers = { account = "text" }
[[policies.payout.buckets]]
name = "account"
on = ["account"]
limit = 3
window = "1d"

[policies.signup]
mode = "shadow"
on_store_error = "allow"
identifiers = { ip = "ip" }
[[policies.signup.buckets]]
name = "ip"
on = ["ip"]
limit = 2
window = "1h"
[[policies.signup.overrides]]
when = { ip = "192.0.2.66" }
deny = true
[[policies.signup.overrides]]
when = { ip = "10.0.0.0/8" }
unlimited = true
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_shows_the_outcomes_it_can_have_and_a_shadow_deny_list_is_a_would_be_denial() {
    let dir = temp_dir("shaped-metrics");
    let file = dir.join("policies.toml");
    std::fs::write(&file, SHAPES).expect("policy file");
    let url = common::fresh_database().await;
    let service = start_on(&url, &[("PGLIMIT_POLICIES", file.to_str().unwrap())], &dir).await;
    let mut expected = series_of(
        "payout",
        &[("allowed", "postgres"), ("denied", "postgres"), ("denied", "deny_cache"), ("error", "none")],
    );
    expected.extend(series_of(
        "signup",
        &[
            ("allowed", "postgres"),
            ("shadow_denied", "postgres"),
            ("shadow_denied", "deny_cache"),
            ("allowed", "none"),
            ("shadow_denied", "none"),
        ],
    ));
    expected.extend(series_of("_adhoc", ENFORCED_IN_MEMORY));
    assert_eq!(check_series(&scrape(&service).await), expected);

    let (status, denied) =
        service.check(json!({ "policy": "signup", "identifiers": { "ip": "192.0.2.66" } })).await;
    assert_eq!((status, denied["would_allow"].as_bool()), (200, Some(false)), "{denied}");
    let scrape = scrape(&service).await;
    let signup = |decision, store| {
        value(
            &scrape,
            "pglimit_checks_total",
            &[("policy", "signup"), ("decision", decision), ("store", store)],
        )
    };
    assert_eq!((signup("shadow_denied", "none"), signup("error", "none")), (1.0, 0.0));
    assert_eq!(check_series(&scrape), expected, "no series beyond those registered");
    for result in ["ok", "error"] {
        assert!(has(&scrape, "pglimit_policy_reloads_total", &[("result", result)]), "{result} at 0");
    }
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pglimit_shadow_no_check_can_be_denied_only_would_be() {
    let dir = temp_dir("shadow-all-metrics");
    let service = start_on(&common::fresh_database().await, &[("PGLIMIT_SHADOW", "true")], &dir).await;
    let series = check_series(&scrape(&service).await);
    assert_eq!(series.len(), 15);
    assert!(series.iter().all(|(_, decision, _)| decision != "denied"), "{series:?}");
    assert!(series.contains(&("_adhoc".into(), "shadow_denied".into(), "deny_cache".into())));
    service.terminate();
}

/// Waits until `service` reports `n` instances in `pglimit_instances`.
async fn wait_for_instances(service: &Running, n: f64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let seen = value(&scrape(service).await, "pglimit_instances", &[]);
        if seen == n {
            return;
        }
        assert!(Instant::now() < deadline, "pglimit_instances stayed {seen}, not {n}, for {within:?}");
        tokio::time::sleep(BEAT_EVERY / 4).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pglimit_instances_counts_the_instances_sharing_the_database_and_drops_when_one_stops() {
    let dir = temp_dir("instances");
    let url = common::fresh_database().await;
    let first = start_on(&url, &[], &dir).await;
    let second = start_on(&url, &[], &dir).await;
    // A beat every BEAT_EVERY; a few more for a slow start.
    wait_for_instances(&first, 2.0, BEAT_EVERY * 5).await;
    wait_for_instances(&second, 2.0, BEAT_EVERY * 5).await;
    second.terminate();
    // Forgotten ALIVE_FOR after its last beat, at the next beat of `first`.
    wait_for_instances(&first, 1.0, ALIVE_FOR + BEAT_EVERY * 5).await;
    first.terminate();
}

fn login() -> serde_json::Value {
    json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "198.51.100.4" } })
}

/// Every rule of alerts.yml evaluates without error, and the six alerts
/// are among them.
async fn every_shipped_rule_evaluates(prometheus: &prom::Prometheus) {
    let rules = prometheus.rules().await;
    assert!(rules.iter().all(|r| r["health"] == "ok"), "every rule evaluates: {rules:?}");
    let alerts = rules.iter().filter(|r| r["type"] == "alerting").filter_map(|r| r["name"].as_str());
    let six = ["AnsweringFromMemory", "PostgresRefusingChecks", "PolicyReloadFailing", "DenyShareJump"];
    let six = six.into_iter().chain(["SlowChecks", "InstancesDropped"]).map(|a| format!("Pglimit{a}"));
    assert_eq!(alerts.map(str::to_owned).collect::<BTreeSet<_>>(), six.collect());
}

/// The value of the element of `result` whose `policy` is `policy`.
fn of_policy(result: &[(std::collections::HashMap<String, String>, f64)], policy: &str) -> Option<f64> {
    result.iter().find(|(labels, _)| labels.get("policy").map(String::as_str) == Some(policy)).map(|e| e.1)
}

fn is_two_sevenths(value: Option<f64>) -> bool {
    value.is_some_and(|v| (v - 2.0 / 7.0).abs() < 1e-9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_pglimit_computes_the_documented_deny_share_with_the_shipped_rules_loaded() {
    let dir = temp_dir("prometheus-scrape");
    let service = start_on(&common::fresh_database().await, &[], &dir).await;
    let rules = repository_file("deploy/prometheus/alerts.yml");
    let prometheus = prom::start(&[service.addr.as_str()], &[rules]).await;
    // The first scrape sees login's five series at 0, before any check:
    // rate() then counts every check that follows.
    prometheus
        .wait_for(r#"count(pglimit_checks_total{policy="login"})"#, |r| r.first().is_some_and(|e| e.1 == 5.0))
        .await;

    for _ in 0..5 {
        assert_eq!(service.check(login()).await.0, 200);
    }
    assert_eq!(service.check(login()).await.0, 429);
    assert_eq!(service.check(login()).await.0, 429, "the repeat is answered by the deny cache");
    prometheus
        .wait_for(r#"sum(pglimit_checks_total{policy="login"})"#, |r| r.first().is_some_and(|e| e.1 == 7.0))
        .await;

    let query = common::docs::fenced_block("docs/monitoring.md", "promql", r#"decision="denied""#);
    let share = of_policy(&prometheus.query(query.trim()).await, "login");
    assert!(is_two_sevenths(share), "2 of 7 login checks denied, not {share:?}: {query}");
    let recorded = "job_policy:pglimit_deny_share:ratio_rate5m";
    prometheus.wait_for(recorded, |r| is_two_sevenths(of_policy(r, "login"))).await;

    every_shipped_rule_evaluates(&prometheus).await;
    service.terminate();
}
