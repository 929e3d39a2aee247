//! `/auth/{policy}`: forward-auth as nginx and Traefik ask it, identifiers
//! in headers, against a real PostgreSQL.

use axum::body::Body;
use axum::http::{Request, StatusCode};

use crate::common::{fresh_database, instance, policy_file, remaining, send, Reply};
use pglimit::AppState;

const POLICIES: &str = r#"
[policies.login]
identifiers = { email = "email", ip = "ip" }
[[policies.login.buckets]]
name = "email_ip"
on = ["email", "ip"]
limit = 5
window = "1m"
[[policies.login.buckets]]
name = "ip"
on = ["ip"]
limit = 20
window = "1m"
[policies.login.forward_auth]
ip = { header = "x-forwarded-for", trusted_hops = 1 }
email = { header = "x-user-email" }
cost_header = "x-ratelimit-cost"

[policies.edge]
identifiers = { ip = "ip" }
[[policies.edge.buckets]]
name = "ip"
on = ["ip"]
limit = 2
window = "1h"
[policies.edge.forward_auth]
ip = { header = "x-forwarded-for", trusted_hops = 2 }
deny_status = 403

[policies.internal]
identifiers = { account = "text" }
[[policies.internal.buckets]]
name = "account"
on = ["account"]
limit = 1
window = "1m"
"#;

async fn proxy_app(extra: &[(&str, &str)]) -> AppState {
    let file = policy_file(POLICIES);
    let mut vars = vec![("PGLIMIT_POLICIES", file.to_str().expect("a UTF-8 path"))];
    vars.extend_from_slice(extra);
    instance(&fresh_database().await, &vars).await
}

/// `method /auth/policy` with these headers and no body, as a proxy sends it.
async fn ask(app: &AppState, method: &str, policy: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = Request::builder().method(method).uri(format!("/auth/{policy}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(app, request.body(Body::empty()).expect("request")).await
}

async fn login(app: &AppState, forwarded: &str, email: &str) -> Reply {
    ask(app, "GET", "login", &[("x-forwarded-for", forwarded), ("x-user-email", email)]).await
}

fn assert_problem(reply: &Reply, status: StatusCode, member: &str, value: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.header("content-type"), "application/problem+json");
    assert_eq!(reply.body[member], value, "{}", reply.body);
}

#[tokio::test]
async fn an_allowed_request_is_a_200_with_the_rate_limit_headers_of_check() {
    let app = proxy_app(&[]).await;
    let reply = login(&app, "203.0.113.7", "alice@example.com").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.header("ratelimit-policy"), r#""email_ip";q=5;w=60, "ip";q=20;w=60"#);
    assert!(reply.header("ratelimit").starts_with(r#""email_ip";r=4;t="#), "{}", reply.header("ratelimit"));
    assert_eq!(reply.header("retry-after"), "");
    assert_eq!(
        (reply.body["allowed"].as_bool(), reply.body["store"].as_str()),
        (Some(true), Some("postgres"))
    );
}

#[tokio::test]
async fn the_sixth_request_is_denied_with_429_and_retry_after() {
    let app = proxy_app(&[]).await;
    for n in 1..=5 {
        assert_eq!(
            login(&app, "203.0.113.7", "alice@example.com").await.status,
            StatusCode::OK,
            "request {n}"
        );
    }
    let reply = login(&app, "203.0.113.7", "Alice+x@Example.com").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    let retry: u64 = reply.header("retry-after").parse().expect("a Retry-After in seconds");
    assert!((1..=60).contains(&retry), "Retry-After: {retry}");
    assert_eq!(reply.body["retry_after_s"], retry);
}

#[tokio::test]
async fn any_method_is_accepted_as_proxies_forward_the_original_one() {
    let app = proxy_app(&[]).await;
    for method in ["POST", "PUT", "DELETE", "HEAD", "PATCH"] {
        let reply = login(&app, "203.0.113.8", "bob@example.com").await;
        assert_eq!(reply.status, StatusCode::OK, "before {method}");
        let reply =
            ask(&app, method, "login", &[("x-forwarded-for", "198.51.100.2"), ("x-user-email", "b@c.d")])
                .await;
        assert_eq!(reply.status, StatusCode::OK, "{method}: {}", reply.body);
    }
}

#[tokio::test]
async fn a_policy_may_answer_403_for_nginx_auth_request() {
    let app = proxy_app(&[]).await;
    let edge = |forwarded: &'static str| {
        let app = app.clone();
        async move { ask(&app, "GET", "edge", &[("x-forwarded-for", forwarded)]).await }
    };
    assert_eq!(edge("192.0.2.1, 203.0.113.9").await.status, StatusCode::OK);
    assert_eq!(edge("192.0.2.1, 203.0.113.9").await.status, StatusCode::OK);
    let reply = edge("192.0.2.1, 203.0.113.9").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert!(reply.header("retry-after").parse::<u64>().is_ok_and(|s| s >= 1), "Retry-After is still sent");
    assert_eq!(reply.body["allowed"], false);
}

#[tokio::test]
async fn trusted_hops_picks_the_address_the_outermost_trusted_proxy_added() {
    let app = proxy_app(&[]).await;
    // With two trusted hops the client is second from the right; what the
    // client wrote further left does not change its bucket, nor does the
    // inner proxy's address on the right.
    for forwarded in
        ["203.0.113.50, 10.0.0.1", "1.1.1.1, 203.0.113.50, 10.0.0.2", "9.9.9.9,203.0.113.50,10.0.0.3"]
    {
        let reply = ask(&app, "GET", "edge", &[("x-forwarded-for", forwarded)]).await;
        let expected = if forwarded.starts_with("9.9.9.9") { StatusCode::FORBIDDEN } else { StatusCode::OK };
        assert_eq!(reply.status, expected, "{forwarded}: {}", reply.body);
    }
    // Fewer entries than trusted hops: no address a trusted proxy vouched for.
    let reply = ask(&app, "GET", "edge", &[("x-forwarded-for", "203.0.113.50")]).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-forwarded-for");
}

#[tokio::test]
async fn the_forwarded_address_is_normalised_like_an_ip_identifier() {
    let app = proxy_app(&[]).await;
    login(&app, "::ffff:203.0.113.60", "carol@example.com").await;
    let reply = login(&app, "203.0.113.60", "carol@example.com").await;
    assert_eq!(remaining(&reply.body, "email_ip"), 3, "the IPv4-mapped form is the same address");
    let reply = login(&app, "198.51.100.1, not-an-address", "carol@example.com").await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-forwarded-for");
    assert!(reply.body["detail"].as_str().is_some_and(|d| d.contains("not an IPv4 or IPv6 address")));
}

#[tokio::test]
async fn a_missing_header_is_a_400_problem_naming_it_never_a_shared_bucket() {
    let app = proxy_app(&[]).await;
    let reply = ask(&app, "GET", "login", &[("x-forwarded-for", "203.0.113.7")]).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-user-email");
    assert_eq!(reply.body["type"], "urn:pglimit:problem:invalid-header");
    assert_eq!(reply.body["detail"], "x-user-email: the header is missing");
    let reply = ask(&app, "GET", "login", &[("x-user-email", "a@b.c")]).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-forwarded-for");
    let twice = [("x-forwarded-for", "203.0.113.7"), ("x-user-email", "a@b.c"), ("x-user-email", "d@e.f")];
    let reply = ask(&app, "GET", "login", &twice).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-user-email");
}

#[tokio::test]
async fn the_cost_header_sets_the_units_taken() {
    let app = proxy_app(&[]).await;
    let headers = |cost| {
        [
            ("x-forwarded-for", "203.0.113.70"),
            ("x-user-email", "dave@example.com"),
            ("x-ratelimit-cost", cost),
        ]
    };
    let reply = ask(&app, "GET", "login", &headers("3")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(remaining(&reply.body, "email_ip"), 2);
    let reply = ask(&app, "GET", "login", &headers("3")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "3 more than the 2 remaining: {}", reply.body);
    for bad in ["three", "-1", "6", "0"] {
        let reply = ask(&app, "GET", "login", &headers(bad)).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-ratelimit-cost");
    }
}

#[tokio::test]
async fn a_cost_of_zero_is_refused_so_a_client_cannot_switch_the_limit_off() {
    let app = proxy_app(&[]).await;
    let headers = |cost| {
        [("x-forwarded-for", "203.0.113.71"), ("x-user-email", "zed@example.com"), ("x-ratelimit-cost", cost)]
    };
    for _ in 0..3 {
        let reply = ask(&app, "GET", "login", &headers("0")).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, "header", "x-ratelimit-cost");
        assert_eq!(
            reply.body["detail"],
            "x-ratelimit-cost: must be at least 1: forward-auth checks always count"
        );
    }
    let reply = ask(&app, "GET", "login", &headers("1")).await;
    assert_eq!((reply.status, remaining(&reply.body, "email_ip")), (StatusCode::OK, 4), "{}", reply.body);
}

#[tokio::test]
async fn an_unknown_policy_or_one_without_forward_auth_is_a_404_problem() {
    let app = proxy_app(&[]).await;
    let reply = ask(&app, "GET", "nope", &[]).await;
    assert_problem(&reply, StatusCode::NOT_FOUND, "type", "urn:pglimit:problem:not-found");
    assert_eq!(reply.body["detail"], r#"no policy named "nope" is configured"#);
    let reply = ask(&app, "GET", "internal", &[("x-account", "a")]).await;
    assert_problem(&reply, StatusCode::NOT_FOUND, "type", "urn:pglimit:problem:not-found");
    assert!(reply.body["detail"].as_str().is_some_and(|d| d.contains("[policies.internal.forward_auth]")));
}

#[tokio::test]
async fn with_api_tokens_the_proxy_sends_a_bearer_token_like_any_caller() {
    let app = proxy_app(&[("PGLIMIT_API_TOKENS", "proxy-token")]).await;
    let headers = [("x-forwarded-for", "203.0.113.80"), ("x-user-email", "erin@example.com")];
    let reply = ask(&app, "GET", "login", &headers).await;
    assert_problem(&reply, StatusCode::UNAUTHORIZED, "type", "urn:pglimit:problem:unauthorized");
    let reply = ask(&app, "GET", "login", &[headers[0], headers[1], ("authorization", "Bearer wrong")]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let reply =
        ask(&app, "GET", "login", &[headers[0], headers[1], ("authorization", "Bearer proxy-token")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}
