//! The host a private cluster runs on: where the server binaries are,
//! which account runs them (PostgreSQL refuses root), and where its data
//! directory can live so that account can reach it.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{io, ClusterError};

#[derive(Debug, Clone, Copy)]
pub(super) struct Account {
    uid: u32,
    gid: u32,
}

/// Where root's clusters go when `postgres` cannot enter their directory.
const RELOCATED: &str = "/var/lib/pglimit";

/// Where the cluster of `dir` lives: `dir/pg`, or, when this process is
/// root and the `postgres` account cannot enter `dir` (root's home, a
/// 0700 `mktemp -d`), a directory named after `dir` under [`RELOCATED`],
/// the same on every start so that counters survive restarts. The
/// password and key secret stay in `dir`, which only root reads anyway.
pub(super) fn cluster_dir(dir: &Path, run_as: Option<Account>) -> Result<PathBuf, ClusterError> {
    if run_as.is_none() || may(run_as, "-x", dir) {
        return Ok(dir.join("pg"));
    }
    let name = hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(dir.as_os_str().as_encoded_bytes())[..8]);
    let base = Path::new(RELOCATED);
    // Entered by `postgres` to reach its clusters, written by root alone.
    super::private::own_directory(base, 0o755)?;
    let pg_dir = base.join(name);
    tracing::warn!(
        dir = %dir.display(),
        cluster = %pg_dir.display(),
        "the postgres account cannot enter the data directory, so the private PostgreSQL runs elsewhere"
    );
    Ok(pg_dir)
}

/// Whether `account` may do to `path` what `test`'s `access` flag asks
/// (`-w` write, `-x` enter), asked as that account.
pub(super) fn may(account: Option<Account>, access: &str, path: &Path) -> bool {
    let test = command_as(account, Path::new("test")).arg(access).arg(path).stdin(Stdio::null()).status();
    test.is_ok_and(|s| s.success())
}

/// A command that runs `program` as `account` when given (this process is root).
pub(super) fn command_as(account: Option<Account>, program: &Path) -> Command {
    match account {
        Some(_) => {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// The watchdog waits for its stdin to close (this process has exited or
/// dropped the cluster), then stops the server and removes `cleanup` if given.
/// It runs in a session of its own and ignores terminal signals, so that a
/// Ctrl-C or a signal to this process group reaches the service (which stops
/// the server itself) and not the watchdog.
pub(super) fn spawn_watchdog(
    bin: &Path,
    pg_dir: &Path,
    cleanup: &Path,
    run_as: Option<Account>,
) -> Result<Child, ClusterError> {
    let script = r#"trap '' INT TERM HUP; cat >/dev/null; $3 "$0/pg_ctl" stop -D "$1" -m immediate -w >/dev/null 2>&1; [ -n "$2" ] && rm -rf "$2"; exit 0"#;
    let as_postgres = if run_as.is_some() { "runuser -u postgres --" } else { "" };
    let mut cmd = Command::new("setsid");
    cmd.arg("/bin/sh").arg("-c").arg(script).arg(bin).arg(pg_dir).arg(cleanup).arg(as_postgres);
    cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null());
    cmd.spawn().map_err(|e| io("cannot start the cluster watchdog".into(), e))
}

pub(super) fn find_binaries() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|dir| has_binaries(dir));
    on_path.or_else(|| {
        let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
            .filter(|(_, bin)| has_binaries(bin))
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin)
    })
}

pub(super) fn has_binaries(dir: &Path) -> bool {
    dir.join("pg_ctl").is_file() && dir.join("initdb").is_file()
}

pub(super) fn is_root() -> bool {
    effective_uid() == Some(0)
}

/// The account this process acts as: `/proc/self` belongs to it (Linux, as
/// `runuser` and the rest of this module assume).
pub(super) fn effective_uid() -> Option<u32> {
    fs::metadata("/proc/self").map(|m| m.uid()).ok()
}

pub(super) fn postgres_account() -> Result<Account, ClusterError> {
    let passwd = fs::read_to_string("/etc/passwd").map_err(|e| io("cannot read /etc/passwd".into(), e))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres") && f.len() > 3)
        .and_then(|f| Some(Account { uid: f[2].parse().ok()?, gid: f[3].parse().ok()? }))
        .ok_or_else(|| {
            ClusterError::Io("running as root, PostgreSQL needs an unprivileged `postgres` account, and there is none (it comes with the postgresql package)".into())
        })
}

pub(super) fn chown(path: &Path, account: Option<Account>) -> Result<(), ClusterError> {
    match account {
        Some(a) => std::os::unix::fs::chown(path, Some(a.uid), Some(a.gid))
            .map_err(|e| io(format!("cannot chown {}", path.display()), e)),
        None => Ok(()),
    }
}
