//! A server as a real process (nginx, Envoy, Traefik, Caddy, Prometheus),
//! started on a free loopback port in a throwaway directory with a
//! configuration of the test's own, its output in a log there. Never
//! skipped: without the binary the test fails saying what to run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub use super::process::path;
use super::process::{free_port, temp_dir, wait_until_listening, TempDir};

/// A running proxy; killed and reaped when dropped.
pub struct Proxy {
    child: Child,
    pub port: u16,
    pub dir: TempDir,
    pub log: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary named by the environment variable `var` (scripts/test sets
/// it), or fails with the line that installs it.
pub fn binary_from_env(var: &str, install: &str) -> PathBuf {
    match std::env::var_os(var).map(PathBuf::from) {
        Some(path) if path.is_file() => path,
        Some(path) => panic!("{var}={} is not a file: {install}", path.display()),
        None => panic!("{var} is not set: {install}"),
    }
}

/// The binary `name` on PATH, else in `also` (Debian puts some in /usr/sbin,
/// which a non-root PATH may lack), or fails with the line that installs it.
pub fn binary_on_path(name: &str, also: &str, install: &str) -> PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    let mut candidates = std::env::split_paths(&paths).chain([PathBuf::from(also)]).map(|dir| dir.join(name));
    let found = candidates.find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("{name} is not installed: {install}"))
}

/// Starts `binary` with the arguments `launch(port, dir)` returns (having
/// written any configuration into `dir`). Its home is `dir` too, so that
/// whatever state it keeps goes with it. A port taken between choosing and
/// binding it is tried again with another.
pub fn start(name: &str, binary: &Path, launch: impl Fn(u16, &Path) -> Vec<String>) -> Proxy {
    for _ in 0..5 {
        let dir = temp_dir(name);
        let port = free_port();
        let args = launch(port, &dir);
        let log = dir.join(format!("{name}.log"));
        let output = std::fs::File::create(&log).expect("proxy log");
        let child = Command::new(binary)
            .args(&args)
            .envs(["HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"].map(|var| (var, path(&dir))))
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("proxy log"))
            .stderr(output)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        let mut proxy = Proxy { child, port, dir, log };
        if proxy.wait_until_listening(name) {
            return proxy;
        }
    }
    panic!("{name} could not listen on a free port five times");
}

impl Proxy {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The proxy's own output so far, for a failure's message.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_until_listening(&mut self, name: &str) -> bool {
        wait_until_listening(&mut self.child, self.port, &self.log, name)
    }
}
