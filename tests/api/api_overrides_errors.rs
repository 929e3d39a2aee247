//! Bad overrides through the API: each a 4xx problem naming the field.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::api_overrides::PLANS;
use crate::common::{call, fresh_database, instance, policy_file, send, Reply};

async fn app_with_plans(extra: &[(&str, &str)]) -> pglimit::AppState {
    let file = policy_file(PLANS);
    let mut vars = vec![("PGLIMIT_POLICIES", file.to_str().unwrap())];
    vars.extend_from_slice(extra);
    instance(&fresh_database().await, &vars).await
}

fn assert_problem(reply: &Reply, status: StatusCode, field: Option<&str>) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.header("content-type"), "application/problem+json");
    assert!(!reply.body["detail"].as_str().unwrap_or_default().is_empty(), "{}", reply.body);
    assert_eq!(reply.body["field"].as_str(), field, "{}", reply.body);
}

/// A valid override with `field` replaced by `value` (removed for null).
fn with(field: &str, value: Value) -> Value {
    let mut body = json!({ "policy": "api", "when": { "account": "acct_42" }, "limits": { "monthly": 10 } });
    if value.is_null() {
        body.as_object_mut().unwrap().remove(field);
    } else {
        body[field] = value;
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_overrides_are_refused_with_a_problem_naming_the_field() {
    let app = app_with_plans(&[]).await;
    let cases = [
        (with("policy", json!("nope")), "policy"),
        (with("limits", json!({ "daily": 5 })), "limits.daily"),
        (with("limits", json!({ "monthly": 0 })), "limits.monthly"),
        (with("limits", json!({})), "limits"),
        (with("when", json!({ "ip": "10.0.0.0/33" })), "when.ip"),
        (with("when", json!({ "email": "*@*.example.com" })), "when.email"),
        (with("when", json!({ "account": "*@example.com" })), "when.account"),
        (with("when", json!({ "plan": "gold" })), "when"),
        (with("when", json!({})), "when"),
        (with("until", json!("2020-01-01T00:00:00Z")), "until"),
        (with("until", json!("next month")), "until"),
        (with("note", json!("n".repeat(501))), "note"),
        (with("limits", Value::Null), "limits"),
        (json!({ "policy": "api", "when": { "account": "a" }, "block": true }), "block"),
        (json!({ "policy": "api", "when": { "account": "a" }, "unlimited": false }), "unlimited"),
        (json!({ "policy": "api", "when": { "account": "a" }, "unlimited": true, "deny": true }), "deny"),
    ];
    for (body, field) in cases {
        let reply = call(&app, "POST", "/admin/overrides", body.clone()).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, Some(field));
    }
    let listed = call(&app, "GET", "/admin/overrides", Value::Null).await;
    assert_eq!(listed.body["overrides"], json!([]), "nothing was stored: {}", listed.body);
    let unknown = call(&app, "GET", "/admin/overrides?policy=nope", Value::Null).await;
    assert_problem(&unknown, StatusCode::BAD_REQUEST, Some("policy"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_unknown_override_is_a_404_problem() {
    let app = app_with_plans(&[]).await;
    let reply = call(&app, "DELETE", "/admin/overrides/ovr_000000000000000000000000", Value::Null).await;
    assert_problem(&reply, StatusCode::NOT_FOUND, None);
    assert_eq!(reply.body["type"], "urn:pglimit:problem:not-found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overrides_routes_take_an_admin_token() {
    let app = app_with_plans(&[("PGLIMIT_API_TOKENS", "app"), ("PGLIMIT_ADMIN_TOKENS", "ops")]).await;
    let post = |token: Option<&str>| {
        let mut request = Request::post("/admin/overrides").header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(Body::from(with("unused", Value::Null).to_string())).unwrap()
    };
    assert_problem(&send(&app, post(None)).await, StatusCode::UNAUTHORIZED, None);
    assert_problem(&send(&app, post(Some("app"))).await, StatusCode::UNAUTHORIZED, None);
    assert_eq!(send(&app, post(Some("ops"))).await.status, StatusCode::CREATED);
    let delete = Request::delete("/admin/overrides/ovr_x").body(Body::empty()).unwrap();
    assert_problem(&send(&app, delete).await, StatusCode::UNAUTHORIZED, None);
}
