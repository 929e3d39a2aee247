//! What a web page, or an application sharing loopback with pglimit (a
//! sidecar's neighbour, an SSRF in it), could make it do: nothing that
//! their tokens do not already allow.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use crate::common::{check, fresh_database, instance, login, remaining, send, Reply};

async fn with(
    app: &pglimit::AppState,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Reply {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(app, request.body(Body::from(body.to_string())).expect("request")).await
}

#[tokio::test]
async fn with_api_tokens_and_no_admin_tokens_the_admin_routes_are_off_even_on_loopback() {
    let app = instance(&fresh_database().await, &[("PGLIMIT_API_TOKENS", "app-token")]).await;
    let block = json!({ "policy": "login", "identifiers": { "ip": "192.0.2.7" }, "for": "1h" });
    let json = ("content-type", "application/json");
    for token in [None, Some("Bearer app-token")] {
        let headers: Vec<_> =
            [Some(json), token.map(|t| ("authorization", t))].into_iter().flatten().collect();
        for (method, path) in
            [("POST", "/admin/blocks"), ("DELETE", "/admin/blocks"), ("GET", "/admin/slow-checks")]
        {
            let reply = with(&app, method, path, &headers, &block).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path} with {token:?}: {}", reply.body);
            assert_eq!(reply.body["type"], "urn:pglimit:problem:admin-disabled");
        }
    }
    let reply = with(
        &app,
        "POST",
        "/check",
        &[json, ("authorization", "Bearer app-token")],
        &login("a@b.c", "192.0.2.7"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "the block was never made: {}", reply.body);
}

#[tokio::test]
async fn a_body_not_declared_json_is_refused_on_every_route_that_reads_one_and_counts_nothing() {
    let app = instance(&fresh_database().await, &[]).await;
    let alice = login("alice@example.com", "192.0.2.8");
    let block = json!({ "policy": "login", "identifiers": { "ip": "192.0.2.8" }, "for": "1h" });
    let routes = [
        ("POST", "/check", &alice),
        ("POST", "/reset", &alice),
        ("POST", "/admin/blocks", &block),
        ("DELETE", "/admin/blocks", &block),
    ];
    for (method, path, body) in routes {
        for declared in [
            &[("content-type", "text/plain")][..],
            &[("content-type", "application/x-www-form-urlencoded")],
            &[],
        ] {
            let reply = with(&app, method, path, declared, body).await;
            assert_eq!(
                reply.status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{method} {path} {declared:?}: {}",
                reply.body
            );
            assert_eq!(
                (reply.body["type"].as_str(), reply.body["header"].as_str()),
                (Some("urn:pglimit:problem:unsupported-media-type"), Some("content-type"))
            );
        }
    }
    let reply = check(&app, alice).await;
    assert_eq!(
        (reply.status, remaining(&reply.body, "email_ip")),
        (StatusCode::OK, 4),
        "nothing was counted or blocked before: {}",
        reply.body
    );
}

#[tokio::test]
async fn on_a_loopback_bind_a_request_addressed_to_a_foreign_name_is_refused() {
    let app = instance(&fresh_database().await, &[]).await;
    let alice = login("carol@example.com", "192.0.2.9");
    let json = ("content-type", "application/json");
    for host in ["attacker.example", "attacker.example:8080", "localhost.attacker.example"] {
        for (method, path) in
            [("GET", "/admin/slow-checks"), ("GET", "/admin/blocks"), ("POST", "/check"), ("GET", "/metrics")]
        {
            let reply = with(&app, method, path, &[json, ("host", host)], &alice).await;
            assert_eq!(
                reply.status,
                StatusCode::MISDIRECTED_REQUEST,
                "{method} {path} to {host}: {}",
                reply.body
            );
            assert_eq!(reply.body["header"], "host");
        }
    }
    for host in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"] {
        let reply = with(&app, "GET", "/admin/slow-checks", &[("host", host)], &Value::Null).await;
        assert_eq!(reply.status, StatusCode::OK, "{host}: {}", reply.body);
    }
    let reply = check(&app, alice).await;
    assert_eq!(remaining(&reply.body, "email_ip"), 4, "the refused checks counted nothing");
}

#[tokio::test]
async fn on_a_network_bind_any_host_is_served_as_tokens_guard_it() {
    let app =
        instance(&fresh_database().await, &[("PGLIMIT_BIND", "0.0.0.0:0"), ("PGLIMIT_API_TOKENS", "t")])
            .await;
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer t"),
        ("host", "pglimit.internal:8080"),
    ];
    let reply = with(&app, "POST", "/check", &headers, &login("dan@example.com", "192.0.2.10")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}
