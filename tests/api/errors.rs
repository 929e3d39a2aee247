//! Every error is a problem document (RFC 9457) that names what is wrong.

use crate::common::{app, instance, post_raw, send, Reply};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

fn assert_problem(reply: &Reply, status: StatusCode, field: Option<&str>) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.header("content-type"), "application/problem+json");
    assert_eq!(reply.body["status"], status.as_u16());
    assert!(reply.body["type"].as_str().unwrap().starts_with("urn:pglimit:problem:"));
    assert!(!reply.body["detail"].as_str().unwrap().is_empty());
    if let Some(field) = field {
        assert_eq!(reply.body["field"], field, "{}", reply.body);
    }
}

#[tokio::test]
async fn malformed_json_is_a_400() {
    let app = app().await;
    for body in ["{", "", "not json", "{\"key\":\"k\",\"limit\":1,\"window\":\"1s\"} trailing", "[]"] {
        let reply = post_raw(&app, body, None).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body:?}");
        assert_eq!(reply.header("content-type"), "application/problem+json", "{body:?}");
    }
}

#[tokio::test]
async fn a_body_that_is_not_utf8_is_a_400() {
    let app = app().await;
    let reply = post_raw(&app, vec![b'{', b'"', 0xff, 0xfe, b'"', b'}'], None).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, None);
}

#[tokio::test]
async fn wrong_types_name_the_field() {
    let app = app().await;
    let cases = [
        (json!({ "key": "k", "limit": "10", "window": "1h" }), "limit"),
        (json!({ "key": "k", "limit": 10, "window": 60 }), "window"),
        (json!({ "key": 5, "limit": 10, "window": "1h" }), "key"),
        (json!({ "key": "k", "limit": 10, "window": "1h", "cost": -1 }), "cost"),
        (json!({ "key": "k", "limit": 10, "window": "1h", "cost": 1.5 }), "cost"),
        (json!({ "policy": "login", "identifiers": ["a"] }), "identifiers"),
        (json!({ "policy": "login", "identifiers": { "email": 1, "ip": "1.2.3.4" } }), "identifiers.email"),
    ];
    for (body, field) in cases {
        let reply = crate::common::check(&app, body.clone()).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, Some(field));
    }
}

#[tokio::test]
async fn unknown_fields_are_refused_by_name() {
    let app = app().await;
    let reply =
        crate::common::check(&app, json!({ "key": "k", "limit": 1, "window": "1h", "limt": 2 })).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, None);
    assert!(reply.body["detail"].as_str().unwrap().contains("limt"));
}

#[tokio::test]
async fn an_unknown_policy_is_a_400_naming_it() {
    let app = app().await;
    let reply = crate::common::check(&app, json!({ "policy": "signup", "identifiers": {} })).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, Some("policy"));
    assert!(reply.body["detail"].as_str().unwrap().contains("signup"));
}

#[tokio::test]
async fn missing_or_invalid_identifiers_name_the_field() {
    let app = app().await;
    let cases = [
        (json!({ "policy": "login", "identifiers": { "email": "a@example.com" } }), "identifiers.ip"),
        (json!({ "policy": "login", "identifiers": { "ip": "1.2.3.4" } }), "identifiers.email"),
        (
            json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "1.2.3" } }),
            "identifiers.ip",
        ),
        (
            json!({ "policy": "login", "identifiers": { "email": "not-an-email", "ip": "1.2.3.4" } }),
            "identifiers.email",
        ),
        (
            json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "1.2.3.4", "user": "x" } }),
            "identifiers.user",
        ),
        (json!({ "policy": "login" }), "identifiers"),
    ];
    for (body, field) in cases {
        let reply = crate::common::check(&app, body).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, Some(field));
    }
}

#[tokio::test]
async fn out_of_range_limits_windows_and_costs_are_refused() {
    let app = app().await;
    let cases = [
        (json!({ "key": "k", "limit": 0, "window": "1h" }), "limit"),
        (json!({ "key": "k", "limit": 10_000_000_000u64, "window": "1h" }), "limit"),
        (json!({ "key": "k", "limit": 10, "window": "50ms" }), "window"),
        (json!({ "key": "k", "limit": 10, "window": "400d" }), "window"),
        (json!({ "key": "k", "limit": 10, "window": "1w" }), "window"),
        (json!({ "key": "k", "limit": 10, "window": "1h", "cost": 11 }), "cost"),
        (json!({ "key": "k", "limit": 10, "window": "1h", "cost": 99_999_999_999u64 }), "cost"),
        (json!({ "key": "", "limit": 10, "window": "1h" }), "key"),
        (json!({ "key": "k".repeat(257), "limit": 10, "window": "1h" }), "key"),
        (json!({ "key": "k", "window": "1h" }), "limit"),
        (json!({ "key": "k", "limit": 10 }), "window"),
        (
            json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "1.2.3.4" }, "cost": 6 }),
            "cost",
        ),
    ];
    for (body, field) in cases {
        let reply = crate::common::check(&app, body.clone()).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, Some(field));
    }
}

#[tokio::test]
async fn mixing_the_two_request_forms_is_refused() {
    let app = app().await;
    let both = json!({ "policy": "login", "key": "k", "limit": 1, "window": "1h" });
    assert_problem(&crate::common::check(&app, both).await, StatusCode::BAD_REQUEST, Some("key"));
    assert_problem(&crate::common::check(&app, json!({})).await, StatusCode::BAD_REQUEST, Some("policy"));
    let stray = json!({ "policy": "login", "identifiers": {}, "window": "1h" });
    assert_problem(&crate::common::check(&app, stray).await, StatusCode::BAD_REQUEST, Some("window"));
}

#[tokio::test]
async fn a_body_over_16_kib_is_a_413() {
    let app = app().await;
    let big = format!("{{\"key\":\"{}\",\"limit\":1,\"window\":\"1h\"}}", "x".repeat(17 * 1024));
    assert_problem(&post_raw(&app, big, None).await, StatusCode::PAYLOAD_TOO_LARGE, None);
}

#[tokio::test]
async fn with_tokens_configured_a_missing_or_wrong_token_is_a_401() {
    let url = crate::common::fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_API_TOKENS", "alpha-token,beta-token")]).await;
    let body = json!({ "key": "k", "limit": 5, "window": "1h" }).to_string();
    let missing = post_raw(&app, body.clone(), None).await;
    assert_problem(&missing, StatusCode::UNAUTHORIZED, None);
    assert_eq!(missing.header("www-authenticate"), "Bearer");
    assert_problem(&post_raw(&app, body.clone(), Some("alpha")).await, StatusCode::UNAUTHORIZED, None);
    assert_eq!(post_raw(&app, body.clone(), Some("alpha-token")).await.status, StatusCode::OK);
    assert_eq!(post_raw(&app, body.clone(), Some("beta-token")).await.status, StatusCode::OK);
    let lower = Request::post("/check")
        .header("authorization", "bearer alpha-token")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    assert_eq!(send(&app, lower).await.status, StatusCode::OK, "the auth scheme is case-insensitive");
}

#[tokio::test]
async fn unknown_paths_and_methods_are_problem_documents() {
    let app = app().await;
    let reply = send(&app, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_problem(&reply, StatusCode::NOT_FOUND, None);
    let reply = send(&app, Request::get("/check").body(Body::empty()).unwrap()).await;
    assert_problem(&reply, StatusCode::METHOD_NOT_ALLOWED, None);
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = app().await;
    let reply = send(&app, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(reply.status, StatusCode::OK);
    let reply = send(&app, Request::get("/readyz").body(Body::empty()).unwrap()).await;
    assert_eq!(reply.body["store"], "postgres");
    assert_eq!(reply.body["degraded"], false);
}

#[tokio::test]
async fn header_injection_in_keys_and_identifiers_goes_nowhere() {
    let app = app().await;
    let reply =
        crate::common::check(&app, json!({ "key": "k\r\nX-Injected: 1", "limit": 5, "window": "1h" })).await;
    assert_eq!(reply.status, StatusCode::OK, "a key is any string: it is hashed, never echoed");
    assert!(reply.headers.get("x-injected").is_none());
    assert!(!reply.body.to_string().contains("X-Injected"));
    let sneaky = json!({ "policy": "login", "identifiers": { "email": "a@example.com\r\nX-Injected: 1", "ip": "1.2.3.4" } });
    let reply = crate::common::check(&app, sneaky).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, Some("identifiers.email"));
    assert!(reply.headers.get("x-injected").is_none());
    assert!(!reply.body.to_string().contains("X-Injected"), "the value is not echoed back");
}

#[tokio::test]
async fn an_identifier_given_twice_is_refused() {
    let app = app().await;
    let body = r#"{"policy":"login","identifiers":{"email":"a@example.com","ip":"1.2.3.4","email":"b@example.com"}}"#;
    let reply = post_raw(&app, body, None).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, Some("identifiers"));
    assert!(reply.body["detail"].as_str().unwrap().contains("given twice"));
    let body = r#"{"key":"k","limit":5,"window":"1h","limit":500}"#;
    assert_eq!(post_raw(&app, body, None).await.status, StatusCode::BAD_REQUEST, "a field given twice too");
}
