//! A real nginx (Debian's package): `auth_request` to `/auth/edge`.

use std::path::Path;

use crate::common::docs::{fenced_block, replaced};
use crate::common::process::temp_dir;
use crate::{assert_counts_down, edge_policy, five_pass_then_429, pglimit, GUIDE, TOKEN};

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
    let pglimit = pglimit(&edge_policy(), &dir).await;
    let nginx = crate::common::nginx::start(|port, dir| server(&pglimit.addr, port, dir));

    let passed = five_pass_then_429(&nginx.url("/login"), "nginx").await;
    assert_counts_down(passed.iter().map(|reply| reply.headers()), "nginx");
    for reply in passed {
        assert_eq!(reply.text().await.expect("body"), "welcome\n");
    }
}
