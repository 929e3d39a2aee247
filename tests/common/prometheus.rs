//! A real Prometheus (Debian's package), started on loopback in a throwaway
//! directory, scraping the targets a test names every [`SCRAPE_EVERY`] and
//! evaluating the rule files it names as often; and the text format of
//! `/metrics`, parsed. Never skipped: without Prometheus the test fails
//! saying what to install (`scripts/test` installs it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value as Metric};
use serde_json::Value;

use super::process::{http_client, Running};
use super::proxy::{binary_on_path, path, start as start_proxy, Proxy};

/// The scrape and evaluation interval of the configuration written here.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// How many intervals a sample may take to show: one is due every
/// interval; the rest is room for a loaded machine.
const PATIENCE: u32 = 30;

/// A running Prometheus; stopped when dropped.
pub struct Prometheus(Proxy);

/// Starts Prometheus scraping pglimit's `/metrics` at each of `targets`
/// (`host:port`, job `pglimit`) and evaluating `rule_files`, and waits until
/// it says it is ready.
pub async fn start(targets: &[&str], rule_files: &[PathBuf]) -> Prometheus {
    let binary = binary_on_path(
        "prometheus",
        "/usr/bin",
        "`apt-get install prometheus` (./scripts/test installs it when missing)",
    );
    let server = start_proxy("prometheus", &binary, |port, dir: &Path| {
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, configuration(targets, rule_files)).expect("prometheus.yml");
        vec![
            format!("--config.file={}", path(&config)),
            format!("--storage.tsdb.path={}", path(&dir.join("data"))),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ]
    });
    let prometheus = Prometheus(server);
    prometheus.wait_until_ready().await;
    prometheus
}

fn configuration(targets: &[&str], rule_files: &[PathBuf]) -> String {
    let every = format!("{}s", SCRAPE_EVERY.as_secs());
    let rules: Vec<String> = rule_files.iter().map(|f| format!("  - {}\n", f.display())).collect();
    format!(
        "global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\n\
         rule_files:\n{}\
         scrape_configs:\n  - job_name: pglimit\n    static_configs:\n      - targets: {targets:?}\n",
        if rules.is_empty() { "  []\n".to_owned() } else { rules.concat() },
    )
}

impl Prometheus {
    pub fn url(&self, path: &str) -> String {
        self.0.url(path)
    }

    /// Listening is not ready: the rules and the storage load first.
    async fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http_client().get(self.url("/-/ready")).send().await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return;
            }
            assert!(Instant::now() < deadline, "prometheus was not ready within 60 s: {}", self.0.output());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The instant vector `promql` evaluates to now: each element's labels
    /// and value.
    pub async fn query(&self, promql: &str) -> Vec<(HashMap<String, String>, f64)> {
        let reply = http_client().get(self.url("/api/v1/query")).query(&[("query", promql)]).send().await;
        let body: Value = reply.expect("query").json().await.expect("JSON");
        assert_eq!(body["status"], "success", "{promql}: {body}");
        let result = body["data"]["result"].as_array().cloned().unwrap_or_default();
        result
            .iter()
            .map(|element| {
                let labels = serde_json::from_value(element["metric"].clone()).expect("labels");
                let value = element["value"][1].as_str().expect("a value").parse().expect("a number");
                (labels, value)
            })
            .collect()
    }

    /// Every rule Prometheus has loaded, as `/api/v1/rules` describes it.
    pub async fn rules(&self) -> Vec<Value> {
        let reply = http_client().get(self.url("/api/v1/rules")).send().await.expect("rules");
        let body: Value = reply.json().await.expect("JSON");
        let groups = body["data"]["groups"].as_array().cloned().unwrap_or_default();
        groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect()
    }

    /// Polls `promql` until `done` holds for its result, for at most
    /// [`PATIENCE`] scrape intervals; returns that result.
    pub async fn wait_for(
        &self,
        promql: &str,
        done: impl Fn(&[(HashMap<String, String>, f64)]) -> bool,
    ) -> Vec<(HashMap<String, String>, f64)> {
        let deadline = Instant::now() + SCRAPE_EVERY * PATIENCE;
        loop {
            let result = self.query(promql).await;
            if done(&result) {
                return result;
            }
            assert!(Instant::now() < deadline, "{promql} never came true: {result:?}");
            tokio::time::sleep(SCRAPE_EVERY / 4).await;
        }
    }
}

/// A file of the repository, by its path from the root.
pub fn repository_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// pglimit's `/metrics`, parsed by a Prometheus text parser.
pub async fn scrape(service: &Running) -> Scrape {
    let reply = http_client().get(format!("http://{}/metrics", service.addr)).send().await.expect("scrape");
    assert_eq!(reply.status(), 200);
    let text = reply.text().await.expect("text");
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the Prometheus text format")
}

/// The value of the counter or gauge `name` with these labels, summed over
/// the others (0 if absent).
pub fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let wanted: HashMap<&str, &str> = labels.iter().copied().collect();
    let matching = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && wanted.iter().all(|(k, v)| s.labels.get(k) == Some(*v)));
    matching
        .map(|s| match &s.value {
            Metric::Counter(v) | Metric::Gauge(v) | Metric::Untyped(v) => *v,
            other => panic!("{name} is not a single value: {other:?}"),
        })
        .sum()
}
