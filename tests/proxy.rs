//! pglimit behind a real nginx (Debian's package): `auth_request` to
//! `/auth/edge` of a real pglimit process on a real PostgreSQL, with the
//! configuration the README shows.

mod common;

use std::path::Path;

use common::process::{http_client, start, temp_dir};

const TOKEN: &str = "nginx-proxy-token";

const POLICIES: &str = r#"
[policies.edge]
identifiers = { ip = "ip" }
[[policies.edge.buckets]]
name = "ip"
on = ["ip"]
limit = 5
window = "1m"
[policies.edge.forward_auth]
ip = { header = "x-forwarded-for", trusted_hops = 1 }
cost_header = "x-ratelimit-cost"
deny_status = 403
"#;

/// The README's nginx configuration: every request to /login asks pglimit
/// first; a 403 from it becomes a 429 carrying pglimit's Retry-After.
fn server(pglimit: &str, port: u16, dir: &Path) -> String {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("welcome.txt"), "welcome\n").expect("the protected page");
    let root = www.to_str().expect("a UTF-8 path");
    format!(
        r#"
  upstream pglimit {{ server {pglimit}; keepalive 8; }}
  server {{
    listen 127.0.0.1:{port};
    root {root};

    location = /login {{
      auth_request /_pglimit;
      auth_request_set $ratelimit $upstream_http_ratelimit;
      auth_request_set $retry_after $upstream_http_retry_after;
      add_header RateLimit $ratelimit always;
      error_page 403 = @rate_limited;
      try_files /welcome.txt =404;
    }}

    location = /_pglimit {{
      internal;
      proxy_pass http://pglimit/auth/edge;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host localhost;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header Authorization "Bearer {TOKEN}";
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Ratelimit-Cost 1;
    }}

    location @rate_limited {{
      add_header Retry-After $retry_after always;
      add_header RateLimit $ratelimit always;
      return 429 "rate limited\n";
    }}
  }}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_nginx_gets_five_pages_then_429_whatever_headers_it_forges() {
    let dir = temp_dir("behind-nginx");
    let policies = dir.join("policies.toml");
    std::fs::write(&policies, POLICIES).expect("policy file");
    let url = common::fresh_database().await;
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_POLICIES", policies.to_str().expect("a UTF-8 path")),
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
