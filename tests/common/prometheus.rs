//! A real Prometheus (Debian's package), started on loopback in a throwaway
//! directory, scraping the targets a test names every [`SCRAPE_EVERY`] and
//! evaluating the rule files it names as often; and the text format of
//! `/metrics`, parsed. Never skipped: without Prometheus the test fails
//! saying what to install (`scripts/test` installs it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value as Metric};
use serde_json::Value;

use super::process::{http_client, temp_dir, Running, TempDir};

/// The scrape and evaluation interval of the configuration written here.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// How many intervals a sample may take to show: one is due every
/// interval; the rest is room for a loaded machine.
const PATIENCE: u32 = 30;

/// A running Prometheus; killed and reaped when dropped.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    pub dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Debian's `/usr/bin/prometheus`, or one on PATH.
pub fn binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("prometheus"));
    on_path.chain([PathBuf::from("/usr/bin/prometheus")]).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("prometheus is not installed: `apt-get install prometheus` (./scripts/test installs it when missing)")
    })
}

/// Starts Prometheus scraping pglimit's `/metrics` at each of `targets`
/// (`host:port`, job `pglimit`) and evaluating `rule_files`. A port taken
/// between choosing and binding it is tried again with another.
pub async fn start(targets: &[&str], rule_files: &[PathBuf]) -> Prometheus {
    for _ in 0..5 {
        let dir = temp_dir("prometheus");
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, configuration(targets, rule_files)).expect("prometheus.yml");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new(binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let mut prometheus = Prometheus { child, port, dir };
        if prometheus.wait_until_ready().await {
            return prometheus;
        }
    }
    panic!("prometheus could not listen on a free port five times");
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
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// True once `/-/ready` answers 200; false if Prometheus exited because
    /// its port was taken meanwhile. Any other exit fails the test.
    async fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http_client().get(self.url("/-/ready")).send().await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return true;
            }
            if let Some(status) = self.child.try_wait().expect("wait for prometheus") {
                let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
                assert!(log.contains("address already in use"), "prometheus exited ({status}): {log}");
                return false;
            }
            assert!(Instant::now() < deadline, "prometheus was not ready within 60 s");
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

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
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
