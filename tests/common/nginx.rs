//! A real nginx (Debian's package), started on loopback in a throwaway
//! directory with a configuration of the test's own. Never skipped: without
//! nginx the test fails saying what to install (`scripts/test` installs it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::process::{temp_dir, wait_until_listening, TempDir};

/// A running nginx; killed and reaped when dropped.
pub struct Nginx {
    child: Child,
    pub port: u16,
    pub dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx on PATH or where Debian puts it.
pub fn binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("nginx"));
    on_path.chain([PathBuf::from("/usr/sbin/nginx")]).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("nginx is not installed: `apt-get install nginx` (./scripts/test installs it when missing)")
    })
}

/// Starts nginx with the `server` block made by `server(port, dir)` (the
/// directory holds its logs and any files it serves). A port taken between
/// choosing and binding it is tried again with another.
pub fn start(server: impl Fn(u16, &Path) -> String) -> Nginx {
    for _ in 0..5 {
        let dir = temp_dir("nginx");
        let port = free_port();
        let config = dir.join("nginx.conf");
        std::fs::write(&config, wrap(&server(port, &dir), &dir)).expect("nginx.conf");
        let child = Command::new(binary())
            .args(["-p", path(&dir), "-e", path(&dir.join("error.log")), "-c", path(&config)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let mut nginx = Nginx { child, port, dir };
        if nginx.wait_until_listening() {
            return nginx;
        }
    }
    panic!("nginx could not listen on a free port five times");
}

impl Nginx {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn wait_until_listening(&mut self) -> bool {
        wait_until_listening(&mut self.child, self.port, &self.dir.join("error.log"), "nginx")
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// One process in the foreground, every file in `dir` (Debian's defaults
/// are under /var, which a test must not touch).
fn wrap(server: &str, dir: &Path) -> String {
    let d = path(dir);
    format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         {server}\n}}\n"
    )
}
