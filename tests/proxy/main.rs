//! pglimit behind real proxies: nginx (`auth_request`), Traefik
//! (`forwardAuth`), Caddy (`forward_auth`) and Envoy (`ext_authz`, and the
//! gRPC rate limit service), each a real process in front of a real
//! pglimit on a real PostgreSQL. Every configuration and policy is read
//! from docs/proxies.md and docs/proxies-envoy.md, so that what a reader
//! copies is what ran here.

#[path = "../common/mod.rs"]
mod common;

mod caddy;
mod envoy;
mod nginx;
mod traefik;

use std::path::Path;

use common::docs::{fenced_block, replaced};
use common::process::{http_client, start, wait_for_address, Running};

/// The token each proxy sends pglimit.
const TOKEN: &str = "proxy-test-token";
const GUIDE: &str = "docs/proxies.md";
const ENVOY_GUIDE: &str = "docs/proxies-envoy.md";

/// The guide's `edge` policy (forward-auth), 5 a minute per client address.
fn edge_policy() -> String {
    fenced_block(GUIDE, "toml", "[policies.edge.forward_auth]")
}

/// The `edge` policy as every proxy but nginx takes it: without the 403
/// nginx needs, so that a denial is the default 429 (the guide says so).
fn edge_policy_429() -> String {
    let policy = edge_policy();
    let line =
        policy.lines().find(|l| l.starts_with("deny_status = 403")).expect("the guide's deny_status line");
    replaced(&policy, &format!("{line}\n"), "")
}

/// A pglimit with `policies` and [`TOKEN`], on a database of its own.
async fn pglimit(policies: &str, dir: &Path) -> Running {
    pglimit_with(policies, dir, &[]).await
}

/// As [`pglimit`], serving Envoy's rate limit service too; returns it and
/// its gRPC address.
async fn pglimit_with_grpc(policies: &str, dir: &Path) -> (Running, String) {
    let running = pglimit_with(policies, dir, &[("PGLIMIT_GRPC_BIND", "127.0.0.1:0")]).await;
    let grpc = wait_for_address(&running.log, "listening for gRPC (Envoy's rate limit service)");
    (running, grpc)
}

async fn pglimit_with(policies: &str, dir: &Path, extra: &[(&str, &str)]) -> Running {
    let policy_file = dir.join("policies.toml");
    std::fs::write(&policy_file, policies).expect("policy file");
    let url = common::fresh_database().await;
    let mut envs = vec![
        ("DATABASE_URL", url.as_str()),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_POLICIES", policy_file.to_str().expect("a UTF-8 path")),
        ("PGLIMIT_API_TOKENS", TOKEN),
    ];
    envs.extend_from_slice(extra);
    start(&envs, dir)
}

/// A login through the proxy at `url` by a client forging everything it
/// could write to change its count: a cost of 0 (a peek, were it read), a
/// fresh identity, an address left of the proxy's, and a token of its own.
async fn forged_login(url: &str, n: usize, forged_address: &str) -> reqwest::Response {
    let request = http_client().get(url).header("x-ratelimit-cost", "0");
    let request = request.header("x-user-email", format!("fresh-{n}@example.com"));
    let request = request.header("authorization", "Bearer forged-by-the-client");
    let reply = request.header("x-forwarded-for", forged_address).send().await;
    reply.unwrap_or_else(|e| panic!("login {n}: no answer from the proxy: {e}"))
}

/// The `r=` of a `RateLimit` header with one bucket: what is left.
fn remaining_in(ratelimit: &str) -> Option<u64> {
    ratelimit.split(';').find_map(|item| item.trim().strip_prefix("r=")?.parse().ok())
}

/// The `RateLimit` header of `headers`, which must be there.
fn ratelimit_of(headers: &reqwest::header::HeaderMap) -> String {
    let value = headers.get("ratelimit").unwrap_or_else(|| panic!("no RateLimit header in {headers:?}"));
    value.to_str().expect("ASCII").to_owned()
}

/// A denial as the client sees it: 429 with pglimit's `Retry-After`
/// (at most the policy's one-minute window) and `RateLimit` at 0.
fn assert_denied(reply: &reqwest::Response, what: &str) {
    assert_eq!(reply.status(), 429, "{what}: {:?}", reply.headers());
    let retry = reply.headers().get("retry-after").unwrap_or_else(|| panic!("{what}: no Retry-After"));
    let retry: u64 = retry.to_str().expect("ASCII").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "{what}: Retry-After: {retry}");
    assert_eq!(remaining_in(&ratelimit_of(reply.headers())), Some(0), "{what}");
}

/// Five forged logins through `url` pass and the sixth is denied: what
/// each proxy in front of the `edge` policy must give. Returns the replies
/// to the five, for the checks of each proxy's own.
async fn five_pass_then_429(url: &str, what: &str) -> Vec<reqwest::Response> {
    let mut passed = Vec::new();
    for n in 1..=5 {
        let reply = forged_login(url, n, "198.51.100.1").await;
        assert_eq!(reply.status(), 200, "{what}: request {n}: {:?}", reply.headers());
        passed.push(reply);
    }
    let reply = forged_login(url, 6, "198.51.100.2").await;
    assert_denied(
        &reply,
        &format!("{what}: neither a cost of 0, a fresh identity nor a forged address escapes"),
    );
    passed
}

/// Each of five answers (or requests passed on) says what was left after
/// it: 4, 3, 2, 1, 0.
fn assert_counts_down<'h>(headers: impl IntoIterator<Item = &'h reqwest::header::HeaderMap>, what: &str) {
    let left: Vec<Option<u64>> = headers.into_iter().map(|h| remaining_in(&ratelimit_of(h))).collect();
    assert_eq!(left, [4, 3, 2, 1, 0].map(Some), "{what}: RateLimit's r= of each allowed request");
}

/// The backend behind a forward-auth proxy saw the five allowed requests
/// and not the denied one, none of them carrying pglimit's token.
fn assert_backend_saw_five(
    backend: &common::backend::Backend,
    what: &str,
) -> Vec<reqwest::header::HeaderMap> {
    let seen = backend.requests_to("/login");
    assert_eq!(seen.len(), 5, "{what}: the five allowed requests, and not the denied one");
    let token = format!("Bearer {TOKEN}");
    for headers in &seen {
        let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
        assert_ne!(authorization, Some(token.as_str()), "{what}: pglimit's token reached the application");
    }
    seen
}
