//! The OpenAPI description served at /openapi.json matches the service:
//! every documented operation exists, every route is documented, and the
//! documented examples are accepted. (The response side is checked against
//! the live service by schemathesis: `faults/fuzz-api`.)

use crate::common::{app, send};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value;

fn spec() -> Value {
    serde_json::from_str(pglimit::server::OPENAPI).expect("openapi.json is JSON")
}

#[tokio::test]
async fn the_description_is_served_as_is() {
    let app = app().await;
    let reply = send(&app, Request::get("/openapi.json").body(Body::empty()).unwrap()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), "application/json");
    assert_eq!(reply.body, spec());
    assert_eq!(spec()["openapi"], "3.1.0");
}

#[tokio::test]
async fn every_documented_operation_exists_and_every_route_is_documented() {
    let app = app().await;
    let spec = spec();
    let paths = spec["paths"].as_object().expect("paths");
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in paths {
        for method in item.as_object().expect("path item").keys() {
            documented.push((method.to_uppercase(), path.clone()));
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
            let reply = send(
                &app,
                Request::builder().method(method.clone()).uri(path).body(Body::from("{}")).unwrap(),
            )
            .await;
            // A 404 of the route itself, not of a resource it names (no
            // policy "{policy}" on /auth/{policy}).
            let no_route = reply.status == StatusCode::NOT_FOUND
                && reply.body["detail"].as_str().is_some_and(|d| d.starts_with("no resource at"));
            assert!(
                !no_route && reply.status != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is documented but answers {}",
                reply.status
            );
        }
    }
    documented.sort();
    let routes = [
        ("DELETE", "/admin/blocks"),
        ("DELETE", "/admin/overrides/{id}"),
        ("DELETE", "/admin/slow-checks"),
        ("GET", "/admin/audit"),
        ("GET", "/admin/blocks"),
        ("GET", "/admin/overrides"),
        ("GET", "/admin/overview"),
        ("GET", "/admin/slow-checks"),
        ("GET", "/admin/top"),
        ("GET", "/auth/{policy}"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/readyz"),
        ("POST", "/admin/blocks"),
        ("POST", "/admin/explain"),
        ("POST", "/admin/overrides"),
        ("POST", "/auth/{policy}"),
        ("POST", "/check"),
        ("POST", "/release"),
        ("POST", "/renew"),
        ("POST", "/reset"),
    ];
    let routes: Vec<(String, String)> = routes.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    assert_eq!(documented, routes, "the router's routes (listed in src/server/mod.rs)");
}

#[tokio::test]
async fn the_documented_examples_are_accepted() {
    let app = app().await;
    let spec = spec();
    let examples = spec["paths"]["/check"]["post"]["requestBody"]["content"]["application/json"]["examples"]
        .as_object()
        .expect("examples");
    assert!(examples.len() >= 2);
    for (name, example) in examples {
        let reply = crate::common::check(&app, example["value"].clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "example {name}: {}", reply.body);
    }
}

#[test]
fn every_algorithm_and_request_field_is_in_the_description() {
    let text = pglimit::server::OPENAPI;
    for algorithm in pglimit::algorithm::Algorithm::ALL {
        assert!(text.contains(&format!("\"{}\"", algorithm.name())), "{}", algorithm.name());
    }
    for field in ["policy", "identifiers", "key", "limit", "window", "algorithm", "lease", "cost", "max_wait"]
    {
        assert!(text.contains(&format!("\"{field}\"")), "{field}");
    }
}
