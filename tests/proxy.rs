//! pglimit behind a real nginx (Debian's package): `auth_request` to
//! `/auth/edge` of a real pglimit process on a real PostgreSQL, with the
//! policy and the configuration docs/proxies.md shows, read from it.

mod common;

use std::path::Path;

use common::docs::{fenced_block, replaced};
use common::process::{http_client, start, temp_dir};

const TOKEN: &str = "nginx-proxy-token";
const GUIDE: &str = "docs/proxies.md";

/// The guide's `edge` policy, limited to 5 a minute per client address.
fn policies() -> String {
    fenced_block(GUIDE, "toml", "[policies.edge.forward_auth]")
}

/// The guide's nginx configuration: every request to /login asks pglimit
/// first; a 403 from it becomes a 429 carrying pglimit's Retry-After. The
/// test adds where nginx listens and the page it protects, and fills in
/// pglimit's address and token.
fn server(pglimit: &str, port: u16, dir: &Path) -> String {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("welcome.txt"), "welcome\n").expect("the protected page");
    let root = www.to_str().expect("a UTF-8 path");
    let config = fenced_block(GUIDE, "nginx", "auth_request");
    let config = replaced(&config, "server 127.0.0.1:8080;", &format!("server {pglimit};"));
    let config = replaced(&config, "<one of PGLIMIT_API_TOKENS>", TOKEN);
    replaced(&config, "server {\n", &format!("server {{\n    listen 127.0.0.1:{port};\n    root {root};\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_nginx_gets_five_pages_then_429_whatever_headers_it_forges() {
    let dir = temp_dir("behind-nginx");
    let policy_file = dir.join("policies.toml");
    std::fs::write(&policy_file, policies()).expect("policy file");
    let url = common::fresh_database().await;
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_POLICIES", policy_file.to_str().expect("a UTF-8 path")),
        ("PGLIMIT_API_TOKENS", TOKEN),
    ];
    let pglimit = start(&envs, &dir);
    let nginx = common::nginx::start(|port, dir| server(&pglimit.addr, port, dir));

    let client = http_client();
    // Everything a client could write to change its count: a cost of 0 (a
    // peek, were it read), an identity header, an address left of nginx's.
    let login = |n: usize, forged: &str| {
        let request = client.get(nginx.url("/login")).header("x-ratelimit-cost", "0");
        let request = request.header("x-user-email", format!("fresh-{n}@example.com"));
        request.header("x-forwarded-for", forged).send()
    };
    for n in 1..=5 {
        let reply = login(n, "198.51.100.1").await.expect("an answer from nginx");
        assert_eq!(reply.status(), 200, "request {n}");
        let ratelimit = reply.headers()["ratelimit"].to_str().expect("ASCII").to_owned();
        assert_eq!(ratelimit.split(';').nth(1), Some(format!("r={}", 5 - n).as_str()), "{ratelimit}");
        assert_eq!(reply.text().await.expect("body"), "welcome\n");
    }
    let reply = login(6, "198.51.100.2").await.expect("an answer from nginx");
    assert_eq!(reply.status(), 429, "neither a cost of 0, a fresh identity nor a forged address escapes");
    let retry: u64 = reply.headers()["retry-after"].to_str().expect("ASCII").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "Retry-After: {retry}");
    assert!(reply.headers()["ratelimit"].to_str().is_ok_and(|r| r.contains("r=0")));
    assert_eq!(reply.text().await.expect("body"), "rate limited\n");
}
