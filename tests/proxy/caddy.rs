//! A real Caddy (Debian's package): `forward_auth` to `/auth/edge`.

use crate::common::backend::{self, Backend};
use crate::common::docs::{fenced_block, replaced};
use crate::common::process::temp_dir;
use crate::{
    assert_backend_saw_five, assert_counts_down, edge_policy_429, five_pass_then_429, pglimit, GUIDE, TOKEN,
};

/// The guide's Caddyfile, with pglimit's and the application's addresses
/// and the token filled in, and the site on a loopback port instead of
/// the guide's name.
fn site(port: u16, pglimit: &str, backend: &Backend) -> String {
    let config = fenced_block(GUIDE, "caddy", "forward_auth");
    let config = replaced(&config, "forward_auth pglimit:8080 {", &format!("forward_auth {pglimit} {{"));
    let config =
        replaced(&config, "reverse_proxy app:3000", &format!("reverse_proxy {}", backend.host_port()));
    let config = replaced(&config, "<one of PGLIMIT_API_TOKENS>", TOKEN);
    replaced(&config, "app.example.com {\n", &format!("http://127.0.0.1:{port} {{\n\tbind 127.0.0.1\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_caddy_gets_five_pages_then_429_whatever_headers_it_forges() {
    let dir = temp_dir("behind-caddy");
    let pglimit = pglimit(&edge_policy_429(), &dir).await;
    let backend = backend::start().await;
    let caddy = crate::common::caddy::start(|port| site(port, &pglimit.addr, &backend));

    let passed = five_pass_then_429(&caddy.url("/login"), "caddy").await;
    for reply in passed {
        assert_eq!(reply.text().await.expect("body"), backend::PAGE);
    }
    let seen = assert_backend_saw_five(&backend, "caddy");
    assert_counts_down(&seen, "caddy copies RateLimit to the application");
    for headers in &seen {
        let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
        assert_eq!(authorization, Some("Bearer forged-by-the-client"), "the application's own header");
    }
}
