//! A private PostgreSQL cluster, for zero-config runs and for the tests.
//!
//! Started from the installed server binaries (`initdb`, `pg_ctl`) in a data
//! directory of its own, listening on 127.0.0.1 only, with a generated
//! password. PostgreSQL refuses to run as root, so when this process is root
//! every server command runs as the `postgres` account (via `runuser`).
//!
//! A small watchdog shell holds a pipe from this process; when this process
//! exits for any reason (even `kill -9`) the pipe closes and the watchdog
//! stops the cluster, so no postmaster outlives its owner.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

mod host;
mod private;

use private::load_or_create_password;
pub use private::read_or_create_private;

use host::{
    chown, cluster_dir, command_as, find_binaries, has_binaries, is_root, may, postgres_account,
    spawn_watchdog, Account,
};

const NO_BINARIES: &str =
    "PostgreSQL server binaries (initdb, pg_ctl) were not found in PGLIMIT_PG_BIN, on PATH or in \
/usr/lib/postgresql/<version>/bin: install them (Debian/Ubuntu: `apt-get install postgresql`) \
or set DATABASE_URL to an existing database";

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{NO_BINARIES}")]
    NoBinaries,
    #[error("{0}")]
    Io(String),
    #[error("{what} failed: {output}")]
    Command { what: String, output: String },
}

/// How a cluster is stopped: `Fast` closes sessions cleanly, `Immediate` is a crash.
#[derive(Debug, Clone, Copy)]
pub enum StopMode {
    Fast,
    Immediate,
}

pub struct Cluster {
    bin: PathBuf,
    pg_dir: PathBuf,
    port: u16,
    password: String,
    durable: bool,
    run_as: Option<Account>,
    _watchdog: Child,
}

impl Cluster {
    /// Starts (creating on first use) the cluster kept in `dir/pg`, durable.
    /// `bin` is where `initdb` and `pg_ctl` are; `None` searches for them.
    pub fn start(dir: &Path, bin: Option<&Path>) -> Result<Self, ClusterError> {
        let bin = match bin {
            Some(bin) if has_binaries(bin) => bin.to_owned(),
            Some(_) => return Err(ClusterError::NoBinaries),
            None => find_binaries().ok_or(ClusterError::NoBinaries)?,
        };
        private::own_directory(dir, data_dir_mode())?;
        // PostgreSQL resolves relative paths from inside its data directory.
        let dir = std::path::absolute(dir).map_err(|e| io(format!("cannot resolve {}", dir.display()), e))?;
        Self::launch(bin, &dir, true, false)
    }

    /// Starts a fresh cluster in a temporary directory that is deleted when
    /// this process exits. Not durable (fsync off): for tests only.
    pub fn throwaway() -> Result<Self, ClusterError> {
        let dir = std::env::temp_dir().join(format!(
            "pglimit-test-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        // Not create_dir_all: a directory already there is not ours.
        fs::DirBuilder::new()
            .mode(data_dir_mode())
            .create(&dir)
            .map_err(|e| io(format!("cannot create {}", dir.display()), e))?;
        let bin = find_binaries().ok_or(ClusterError::NoBinaries)?;
        Self::launch(bin, &dir, false, true)
    }

    /// A connection URL for `database`.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://pglimit:{}@127.0.0.1:{}/{database}", self.password, self.port)
    }

    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.pg_dir
    }

    /// The postmaster's process id, from `postmaster.pid`.
    pub fn pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.pg_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Stops the server; [`Cluster::restart`] brings it back on the same port.
    pub fn stop(&self, mode: StopMode) -> Result<(), ClusterError> {
        let mode = match mode {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        };
        self.pg_ctl(&["stop", "-w", "-m", mode])
    }

    pub fn restart(&self) -> Result<(), ClusterError> {
        self.pg_ctl_start()
    }

    fn launch(bin: PathBuf, dir: &Path, durable: bool, remove_on_exit: bool) -> Result<Self, ClusterError> {
        let run_as = if is_root() { Some(postgres_account()?) } else { None };
        let pg_dir = cluster_dir(dir, run_as)?;
        let password = load_or_create_password(dir)?;
        let cleanup = if remove_on_exit { dir } else { Path::new("") };
        let watchdog = spawn_watchdog(&bin, &pg_dir, cleanup, run_as)?;
        let port = free_port().map_err(|e| io("cannot find a free port".into(), e))?;
        let mut cluster = Self { bin, pg_dir, port, password, durable, run_as, _watchdog: watchdog };
        if remove_on_exit {
            chown(dir, run_as)?;
        }
        if !cluster.pg_dir.join("PG_VERSION").exists() {
            cluster.initdb(dir)?;
        } else if cluster.pg_ctl(&["status"]).is_ok() {
            // Left running by a process that died before its watchdog acted.
            cluster.stop(StopMode::Fast)?;
        }
        cluster.start_on_a_free_port()?;
        Ok(cluster)
    }

    /// A port found free can be taken before the server binds it (by any
    /// process on the machine), so a start that lost its port tries another.
    fn start_on_a_free_port(&mut self) -> Result<(), ClusterError> {
        const ATTEMPTS: usize = 5;
        for _ in 1..ATTEMPTS {
            match self.pg_ctl_start() {
                Err(ClusterError::Command { output, .. }) if output.contains("Address already in use") => {
                    self.port = free_port().map_err(|e| io("cannot find a free port".into(), e))?;
                }
                result => return result,
            }
        }
        self.pg_ctl_start()
    }

    /// When running as root, PostgreSQL runs as `postgres`, which must be
    /// able to enter every directory above the cluster's.
    fn check_reachable(&self, dir: &Path) -> Result<(), ClusterError> {
        if self.run_as.is_none() {
            return Ok(());
        }
        if may(self.run_as, "-w", &self.pg_dir) {
            return Ok(());
        }
        Err(ClusterError::Io(format!(
            "pglimit runs as root, so its private PostgreSQL runs as the `postgres` account, which cannot reach {}: \
             set PGLIMIT_DATA_DIR to a directory it can enter (e.g. /var/lib/pglimit/data), or set DATABASE_URL",
            dir.display()
        )))
    }

    fn initdb(&self, dir: &Path) -> Result<(), ClusterError> {
        fs::create_dir_all(&self.pg_dir).map_err(|e| io("cannot create the cluster directory".into(), e))?;
        chown(&self.pg_dir, self.run_as)?;
        self.check_reachable(dir)?;
        // Outside the data directory's parent, which `postgres` may not be
        // able to read; initdb reads it once and it is deleted at once.
        let pwfile = std::env::temp_dir().join(format!("pglimit-initdb-{:016x}", rand::random::<u64>()));
        read_or_create_private(&pwfile, || self.password.clone())?;
        chown(&pwfile, self.run_as)?;
        let result = self.run(
            "initdb",
            &[
                "-D".as_ref(),
                self.pg_dir.as_os_str(),
                "-U".as_ref(),
                "pglimit".as_ref(),
                format!("--pwfile={}", pwfile.display()).as_ref(),
                "--auth-local=trust".as_ref(),
                "--auth-host=scram-sha-256".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
            ],
        );
        let _ = fs::remove_file(&pwfile);
        result
    }

    fn pg_ctl_start(&self) -> Result<(), ClusterError> {
        let mut server = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' -c max_connections=200",
            self.port,
            self.pg_dir.display()
        );
        if !self.durable {
            // Safe to skip only because a test machine's OS does not crash
            // mid-test. synchronous_commit stays on: tests crash the server
            // itself and expect committed counters to survive.
            server.push_str(" -c fsync=off -c full_page_writes=off");
        }
        let log = self.pg_dir.join("server.log");
        let logged = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let started =
            self.pg_ctl(&["start", "-w", "-t", "60", "-l", &format!("{}", log.display()), "-o", &server]);
        started.map_err(|e| match e {
            // pg_ctl says only "Examine the log output": the reason is there.
            ClusterError::Command { what, output } => ClusterError::Command {
                what,
                output: format!("{output}\nserver log:\n{}", log_since(&log, logged)),
            },
            other => other,
        })
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), ClusterError> {
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        all.extend(["-D".as_ref(), self.pg_dir.as_os_str()]);
        self.run("pg_ctl", &all)
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> Result<(), ClusterError> {
        let mut cmd = command_as(self.run_as, &self.bin.join(program));
        cmd.args(args).stdin(Stdio::null());
        let what = format!("{program} {}", args.first().map(|a| a.to_string_lossy()).unwrap_or_default());
        let out = cmd.output().map_err(|e| io(format!("cannot run {what}"), e))?;
        if out.status.success() {
            return Ok(());
        }
        let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
        output.push_str(&String::from_utf8_lossy(&out.stdout));
        Err(ClusterError::Command { what, output: output.trim().to_owned() })
    }
}

/// A data directory's mode: this account's alone, but as root `postgres`
/// must pass through it to the cluster inside (it cannot list or write it).
fn data_dir_mode() -> u32 {
    if is_root() {
        0o711
    } else {
        0o700
    }
}

/// What the server wrote to `log` after its first `from` bytes, at most the
/// last 2 kB of it (the server may be the `postgres` account's, so root reads it).
fn log_since(log: &Path, from: u64) -> String {
    let text = fs::read(log).unwrap_or_default();
    let new = text.get(from as usize..).unwrap_or_default();
    let tail = &new[new.len().saturating_sub(2048)..];
    String::from_utf8_lossy(tail).trim().to_owned()
}

/// A free port on 127.0.0.1 for a server to listen on, chosen at random below
/// the kernel's ephemeral range: ports the kernel hands out (to `bind(0)` and
/// to every outgoing connection) would be taken again by the next connection
/// a busy test machine opens before the server binds it.
pub fn free_port() -> std::io::Result<u16> {
    let ephemeral_start = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000.min(ephemeral_start / 2);
    for _ in 0..100 {
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), low..ephemeral_start);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port())
}

fn io(what: String, e: std::io::Error) -> ClusterError {
    ClusterError::Io(format!("{what}: {e}"))
}
