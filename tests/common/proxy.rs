//! A proxy as a real process (Envoy, Traefik, Caddy), started on a free
//! loopback port in a throwaway directory with a configuration of the
//! test's own, its output in a log there. Never skipped: without the binary
//! the test fails saying what to run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{temp_dir, TempDir};

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

/// The binary `name` on PATH, or fails with the line that installs it.
pub fn binary_on_path(name: &str, install: &str) -> PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| p.is_file());
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

    /// True once it accepts connections; false if it exited because the
    /// port was taken meanwhile. Any other exit fails the test with its
    /// output; so does no listener within 30 s.
    fn wait_until_listening(&mut self, name: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            if let Some(status) = self.child.try_wait().unwrap_or_else(|e| panic!("wait for {name}: {e}")) {
                let output = self.output();
                let taken = output.to_ascii_lowercase().contains("address already in use");
                assert!(taken, "{name} exited ({status}): {output}");
                return false;
            }
            assert!(Instant::now() < deadline, "{name} did not listen within 30 s: {}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A port nothing listens on now (the kernel's pick, then released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}
