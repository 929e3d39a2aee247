//! One PostgreSQL per test binary that its tests may stop, pause and
//! restart; they take [`SERIAL`] first, so they run one at a time.

use std::process::Command;
use std::sync::OnceLock;

use pglimit::pg_cluster::{Cluster, StopMode};
use tokio::sync::Mutex;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// Tests here stop the shared server, so they run one at a time.
pub static SERIAL: Mutex<()> = Mutex::const_new(());

async fn cluster() -> &'static Cluster {
    tokio::task::spawn_blocking(|| CLUSTER.get_or_init(|| Cluster::throwaway().expect("test cluster")))
        .await
        .expect("cluster start-up")
}

pub async fn database() -> String {
    super::create_database(&cluster().await.url()).await
}

/// The server's own database, to act on the server as a whole.
pub async fn admin_url() -> String {
    cluster().await.url()
}

pub async fn stop(mode: StopMode) {
    tokio::task::spawn_blocking(move || CLUSTER.get().expect("cluster").stop(mode))
        .await
        .unwrap()
        .expect("stop");
}

pub async fn restart() {
    tokio::task::spawn_blocking(|| CLUSTER.get().expect("cluster").restart())
        .await
        .unwrap()
        .expect("restart");
}

/// Restarts the stopped server as a standby (`standby.signal`): it
/// answers, read-only, as a primary being replaced does during a failover.
pub async fn restart_as_standby() {
    let cluster = cluster().await;
    std::fs::write(cluster.data_dir().join("standby.signal"), "").expect("standby.signal");
    restart().await;
}

/// Sends SIGSTOP or SIGCONT to the postmaster and all its children; true
/// if `kill` succeeded.
fn signal_all(signal: &str) -> bool {
    let pid = CLUSTER.get().and_then(Cluster::pid).expect("postmaster pid").to_string();
    let children = Command::new("pgrep").args(["-P", &pid]).output().expect("pgrep");
    let mut pids = vec![pid];
    pids.extend(String::from_utf8_lossy(&children.stdout).split_whitespace().map(String::from));
    Command::new("kill").arg(format!("-{signal}")).args(&pids).status().is_ok_and(|s| s.success())
}

/// The server stopped by SIGSTOP; sent SIGCONT when dropped, so that a
/// failed assertion does not leave it paused under the tests that follow.
pub struct Paused;

impl Paused {
    pub fn start() -> Self {
        assert!(signal_all("STOP"), "SIGSTOP to the server");
        Paused
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // No second panic while unwinding from a failed assertion.
        let resumed = signal_all("CONT");
        assert!(resumed || std::thread::panicking(), "SIGCONT to the server");
    }
}
