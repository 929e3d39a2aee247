//! A real nginx (Debian's package), started on loopback in a throwaway
//! directory with a configuration of the test's own. Never skipped: without
//! nginx the test fails saying what to install (`scripts/test` installs it).

use std::path::Path;

use super::proxy::{binary_on_path, path, start as start_proxy, Proxy};

/// Starts nginx with the `server` block made by `server(port, dir)` (the
/// directory holds its logs and any files it serves).
pub fn start(server: impl Fn(u16, &Path) -> String) -> Proxy {
    let nginx = binary_on_path(
        "nginx",
        "/usr/sbin",
        "`apt-get install nginx` (./scripts/test installs it when missing)",
    );
    start_proxy("nginx", &nginx, |port, dir: &Path| {
        let config = dir.join("nginx.conf");
        std::fs::write(&config, wrap(&server(port, dir), dir)).expect("nginx.conf");
        ["-p", path(dir), "-e", "stderr", "-c", path(&config)].map(str::to_owned).to_vec()
    })
}

/// One process in the foreground, every file in `dir` (Debian's defaults
/// are under /var, which a test must not touch); errors to the log the
/// starter keeps.
fn wrap(server: &str, dir: &Path) -> String {
    let d = path(dir);
    format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log stderr info;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         {server}\n}}\n"
    )
}
