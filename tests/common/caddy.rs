//! A real Caddy (Debian's package), in the foreground.

use std::path::Path;

use super::proxy::{binary_on_path, path, start as start_proxy, Proxy};

/// Starts Caddy with the sites of `sites(port)` (a Caddyfile), plain HTTP
/// only and without its admin endpoint.
pub fn start(sites: impl Fn(u16) -> String) -> Proxy {
    let caddy = binary_on_path(
        "caddy",
        "/usr/bin",
        "`apt-get install caddy` (./scripts/test installs it when missing)",
    );
    start_proxy("caddy", &caddy, |port, dir: &Path| {
        let config = dir.join("Caddyfile");
        let global = "{\n\tadmin off\n\tauto_https off\n}\n";
        std::fs::write(&config, format!("{global}{}", sites(port))).expect("Caddyfile");
        ["run", "--config", path(&config), "--adapter", "caddyfile"].map(str::to_owned).to_vec()
    })
}
