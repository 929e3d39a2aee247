//! The real binary, as an operator runs it: processes with a JSON log in a
//! file, throwaway clusters to stop and restart, and clients that retry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pglimit::pg_cluster::{Cluster, StopMode};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_pglimit");

/// A running pglimit process, its JSON log in a file.
pub struct Running {
    pub child: Child,
    pub log: PathBuf,
    pub addr: String,
}

/// A directory removed when dropped, so that a failed test cleans up too.
pub struct TempDir(pub PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True once `child` accepts connections on loopback `port`; false if it
/// exited because the port was taken meanwhile (its `log` says so). Any
/// other exit fails the test with the log; so does no listener within 30 s.
pub fn wait_until_listening(child: &mut Child, port: u16, log: &Path, what: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("wait for {what}: {e}")) {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let taken = log.to_ascii_lowercase().contains("address already in use");
            assert!(taken, "{what} exited ({status}): {log}");
            return false;
        }
        if Instant::now() >= deadline {
            panic!("{what} did not listen within 30 s: {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A port nothing listens on now (the kernel's pick, then released).
pub fn free_port() -> u16 {
    pglimit::pg_cluster::free_port().expect("a free port")
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

pub fn temp_dir(prefix: &str) -> TempDir {
    let dir = std::env::temp_dir().join(super::unique(prefix));
    std::fs::create_dir_all(&dir).expect("temp dir");
    TempDir(dir)
}

pub fn command(envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PGLIMIT_BIND", "127.0.0.1:0")
        .env("PGLIMIT_LOG_FORMAT", "json")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// A client that gives up on an answer after 30 s, so that a hung service
/// fails the test instead of stalling it.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("HTTP client")
}

/// Why a request got no answer at all. A process going away (or not yet
/// there) refuses the connection or closes it before any response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAnswer {
    /// Could not connect: nothing listens at the address.
    Refused,
    /// The connection (often a kept-alive one) closed before a response head.
    ClosedEarly,
}

/// Classifies a send error, failing the test on any kind a process going
/// away has no business causing: a timeout (a hung service), an answer cut
/// mid-body, or anything else that is not a failed connection.
pub fn no_answer(e: &reqwest::Error) -> NoAnswer {
    assert!(!e.is_timeout(), "a request timed out: {e:?}");
    assert!(!e.is_body() && !e.is_decode(), "an answer was cut mid-body: {e:?}");
    if e.is_connect() {
        NoAnswer::Refused
    } else if e.is_request() {
        NoAnswer::ClosedEarly
    } else {
        panic!("a request failed, not its connection: {e:?}")
    }
}

pub fn log_lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

pub fn messages_containing(log: &Path, needle: &str) -> usize {
    log_lines(log)
        .iter()
        .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains(needle)))
        .count()
}

/// The level of the first log line whose message contains `needle`.
pub fn level_of(log: &Path, needle: &str) -> String {
    let line = log_lines(log)
        .into_iter()
        .find(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains(needle)))
        .unwrap_or_else(|| panic!("no log line contains {needle:?}"));
    line["level"].as_str().expect("a level").to_owned()
}

pub fn start(envs: &[(&str, &str)], dir: &Path) -> Running {
    let log = dir.join(super::unique("pglimit.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = command(envs).stderr(file).spawn().expect("spawn pglimit");
    // Owned at once, so that a failed start still kills and reaps the child.
    let mut running = Running { child, log, addr: String::new() };
    running.addr = wait_for_listening(&running.log);
    running
}

/// The address from the "listening" log line.
pub fn wait_for_listening(log: &Path) -> String {
    wait_for_address(log, "listening")
}

/// The address of the log line whose message is `message`, once written.
pub fn wait_for_address(log: &Path, message: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listening = log_lines(log).into_iter().find(|l| l["fields"]["message"] == message);
        if let Some(line) = listening {
            return line["fields"]["addr"].as_str().expect("addr").to_owned();
        }
        let log_text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(Instant::now() < deadline, "pglimit did not start: {log_text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Running {
    pub async fn check(&self, body: Value) -> (u16, Value) {
        let reply = http_client()
            .post(format!("http://{}/check", self.addr))
            .json(&body)
            .send()
            .await
            .expect("reply");
        (reply.status().as_u16(), reply.json().await.expect("JSON body"))
    }

    /// Sends `body` until it is decided by Postgres again.
    pub async fn wait_for_postgres(&self, body: &Value) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.check(body.clone()).await.1["store"] != "postgres" {
            assert!(Instant::now() < deadline, "did not return to postgres");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub fn terminate(mut self) -> PathBuf {
        let status =
            Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "exit status {status}: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
                return self.log.clone();
            }
            assert!(Instant::now() < deadline, "pglimit did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn throwaway_cluster() -> Cluster {
    tokio::task::spawn_blocking(|| Cluster::throwaway().expect("cluster")).await.unwrap()
}

pub async fn stop_cluster(cluster: Cluster, mode: StopMode) -> Cluster {
    tokio::task::spawn_blocking(move || cluster.stop(mode).map(|()| cluster)).await.unwrap().expect("stop")
}

pub async fn restart_cluster(cluster: Cluster) -> Cluster {
    tokio::task::spawn_blocking(move || cluster.restart().map(|()| cluster)).await.unwrap().expect("restart")
}

/// Runs the binary to completion; returns (success, stderr). For refusals
/// at start-up: one still running after a minute did not refuse, so it is
/// stopped and the test fails saying so, rather than waiting forever.
pub fn run_to_exit(envs: &[(&str, &str)]) -> (bool, String) {
    let log = std::env::temp_dir().join(super::unique("pglimit-exit.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let mut child =
        command(envs).env("PGLIMIT_LOG_FORMAT", "text").stderr(file).spawn().expect("run pglimit");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for pglimit") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("pglimit was still running after 60 s, so it did not refuse to start:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (status.success(), stderr)
}

/// As [`start`], with command-line arguments.
pub fn start_with_args(args: &[&str], envs: &[(&str, &str)], dir: &Path) -> Running {
    let log = dir.join(super::unique("pglimit.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = command(envs).args(args).stderr(file).spawn().expect("spawn pglimit");
    let mut running = Running { child, log, addr: String::new() };
    running.addr = wait_for_listening(&running.log);
    running
}

/// Runs the binary with `args` to completion, capturing stdout and stderr.
pub fn output_of(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    command(envs).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).output().expect("run pglimit")
}
