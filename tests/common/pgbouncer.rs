//! A real PgBouncer (Debian's package) in front of a test's PostgreSQL, on
//! loopback, in a throwaway directory. Never skipped: without it the test
//! fails saying what to install (`scripts/test` installs it).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::process::{free_port, temp_dir, wait_until_listening, TempDir};

/// A running PgBouncer; killed and reaped when dropped.
pub struct PgBouncer {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pool modes pglimit supports behind a pooler.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Session,
    Transaction,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Transaction => "transaction",
        }
    }

    /// Session mode gives every client a server connection of its own;
    /// transaction mode gets fewer than the clients, so that transactions
    /// of different clients take turns on the same server connections.
    fn pool_size(self) -> u32 {
        match self {
            Mode::Session => 60,
            Mode::Transaction => 3,
        }
    }
}

fn binary() -> PathBuf {
    let found =
        ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].into_iter().map(PathBuf::from).find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("pgbouncer is not installed: `apt-get install pgbouncer` (./scripts/test installs it when missing)")
    })
}

/// PgBouncer in `mode` in front of the server of `url` (a URL of the test
/// harness: `postgres://user:password@127.0.0.1:port/db`), with the
/// configuration its users usually have: `ignore_startup_parameters =
/// extra_float_digits` and nothing more.
pub fn start(url: &str, mode: Mode) -> PgBouncer {
    let (user, password, server_port) = parts(url);
    for _ in 0..5 {
        let dir = temp_dir("pgbouncer");
        let port = free_port();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"{password}\"\n")).expect("users.txt");
        std::fs::write(&ini, config(&dir, port, server_port, mode)).expect("pgbouncer.ini");
        let mut command = Command::new(binary());
        command.arg(&ini).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // PgBouncer refuses to run as root.
        if let Some((uid, gid)) = postgres_account_if_root() {
            chown_all(&dir, uid, gid);
            command.uid(uid).gid(gid);
        }
        let mut bouncer = PgBouncer { child: command.spawn().expect("spawn pgbouncer"), port, dir };
        if bouncer.wait_until_listening() {
            return bouncer;
        }
    }
    panic!("pgbouncer could not listen on a free port five times");
}

impl PgBouncer {
    /// `url` with PgBouncer's address in place of the server's.
    pub fn url(&self, url: &str) -> String {
        let (head, rest) = url.rsplit_once('@').expect("a URL with credentials");
        let database = rest.split_once('/').map_or("", |(_, db)| db);
        format!("{head}@127.0.0.1:{}/{database}", self.port)
    }

    fn wait_until_listening(&mut self) -> bool {
        wait_until_listening(&mut self.child, self.port, &self.dir.join("pgbouncer.log"), "pgbouncer")
    }
}

fn config(dir: &Path, port: u16, server_port: u16, mode: Mode) -> String {
    let d = dir.to_str().expect("a UTF-8 path");
    format!(
        "[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = scram-sha-256\nauth_file = {d}/users.txt\n\
         pool_mode = {}\ndefault_pool_size = {}\nmax_client_conn = 500\n\
         ignore_startup_parameters = extra_float_digits\n\
         logfile = {d}/pgbouncer.log\nserver_login_retry = 1\n",
        mode.name(),
        mode.pool_size()
    )
}

/// User, password and port of a harness URL.
fn parts(url: &str) -> (String, String, u16) {
    let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
    let (credentials, address) = rest.split_once('@').expect("credentials");
    let (user, password) = credentials.split_once(':').expect("a password");
    let port = address.split(['/', '?']).next().and_then(|a| a.rsplit_once(':')).expect("a port").1;
    (user.to_owned(), password.to_owned(), port.parse().expect("a port number"))
}

fn postgres_account_if_root() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").ok()?.uid() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let line =
        passwd.lines().find(|l| l.starts_with("postgres:")).expect("a postgres account (running as root)");
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields[2].parse().expect("uid"), fields[3].parse().expect("gid")))
}

fn chown_all(dir: &Path, uid: u32, gid: u32) {
    for path in [dir.to_path_buf(), dir.join("users.txt"), dir.join("pgbouncer.ini")] {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown for pgbouncer");
    }
}
