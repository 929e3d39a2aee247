//! The support console: `/console` and its files, served only with
//! `PGLIMIT_CONSOLE=on` and under strict headers, and `GET /admin/overview`,
//! the one call of its first page. (The page itself is walked in a real
//! browser by tests/console/.)

use std::collections::HashMap;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use pglimit::Config;
use serde_json::{json, Value};

use crate::common::{check, fresh_database, instance, send, unique, Reply, SECRET};

/// A named admin token, as configured; the bearer token is its secret.
const TOKEN: &str = "alice:console-test-token";
const BEARER: &str = "console-test-token";
const CONSOLE_ON: &[(&str, &str)] = &[("PGLIMIT_CONSOLE", "on"), ("PGLIMIT_ADMIN_TOKENS", TOKEN)];

async fn get(app: &pglimit::AppState, path: &str, token: Option<&str>) -> Reply {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    send(app, request.body(Body::empty()).expect("request")).await
}

#[tokio::test]
async fn the_console_is_a_404_unless_turned_on() {
    let app = instance(&fresh_database().await, &[("PGLIMIT_ADMIN_TOKENS", TOKEN)]).await;
    for path in ["/console", "/console/console.js", "/console/console.css"] {
        let reply = get(&app, path, Some(BEARER)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}: {}", reply.body);
        assert_eq!(
            reply.body["type"].as_str().map(|t| t.ends_with("not-found")),
            Some(true),
            "{}",
            reply.body
        );
    }
}

#[test]
fn turning_the_console_on_without_admin_tokens_is_a_start_up_error_naming_both_variables() {
    let vars = HashMap::from([
        ("DATABASE_URL", "postgres://localhost/x"),
        ("PGLIMIT_KEY_SECRET", SECRET),
        ("PGLIMIT_CONSOLE", "on"),
    ]);
    let error = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string())).map(|_| ()).unwrap_err();
    let line = error.to_string();
    assert!(line.starts_with("PGLIMIT_CONSOLE: "), "{line}");
    assert!(line.contains("PGLIMIT_ADMIN_TOKENS"), "{line}");
    assert!(!line.contains('\n'), "one line: {line}");
}

#[tokio::test]
async fn the_page_and_its_files_are_served_without_a_token_under_strict_headers() {
    let app = instance(&fresh_database().await, CONSOLE_ON).await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let reply = get(&app, path, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        assert!(reply.header("content-type").starts_with(kind), "{path}: {}", reply.header("content-type"));
        assert_eq!(reply.header("content-security-policy"), "default-src 'self'; frame-ancestors 'none'");
        assert_eq!(reply.header("x-content-type-options"), "nosniff");
        assert_eq!(reply.header("referrer-policy"), "no-referrer");
        assert_eq!(reply.header("cache-control"), "no-store");
        assert!(reply.header("set-cookie").is_empty(), "{path} sets no cookie");
    }
    let page = get(&app, "/console", None).await.body;
    let page = page.as_str().expect("the page is text");
    assert!(page.contains(r#"src="/console/console.js""#) && page.contains(r#"href="/console/console.css""#));
    assert!(
        !page.contains("<script>") && !page.contains("<style") && !page.contains(" style="),
        "nothing inline"
    );
    assert_eq!(get(&app, "/console/other.js", None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_overview_takes_an_admin_token() {
    let app = instance(&fresh_database().await, CONSOLE_ON).await;
    assert_eq!(get(&app, "/admin/overview", None).await.status, StatusCode::UNAUTHORIZED);
    let wrong = get(&app, "/admin/overview", Some("alice:wrong")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{}", wrong.body);
    assert_eq!(wrong.body["detail"], "the bearer token is not valid", "{}", wrong.body);
    assert_eq!(get(&app, "/admin/overview", Some(BEARER)).await.status, StatusCode::OK);
}

fn login_bucket(overview: &Value, bucket: &str) -> Value {
    let policies = overview["policies"].as_array().unwrap_or_else(|| panic!("no policies in {overview}"));
    let login =
        policies.iter().find(|p| p["name"] == "login").unwrap_or_else(|| panic!("no login in {overview}"));
    assert_eq!(login["shadow"], false, "{login}");
    let buckets = login["buckets"].as_array().unwrap_or_else(|| panic!("no buckets in {login}"));
    buckets.iter().find(|b| b["name"] == bucket).cloned().unwrap_or_else(|| panic!("no {bucket} in {login}"))
}

#[tokio::test]
async fn the_overview_shows_the_store_the_policies_and_this_instances_checks_by_minute() {
    let app = instance(&fresh_database().await, CONSOLE_ON).await;
    let key = unique("overview");
    for _ in 0..3 {
        check(&app, json!({ "key": key, "limit": 2, "window": "1h" })).await;
    }
    let reply = get(&app, "/admin/overview", Some(BEARER)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let overview = reply.body;
    assert_eq!(
        overview["store"],
        json!({ "kind": "postgres", "degraded": false, "instances": 1 }),
        "{overview}"
    );
    let email_ip = json!({ "name": "email_ip", "algorithm": "fixed_window", "limit": 5, "window": "1m",
        "identifiers": ["email", "ip"] });
    assert_eq!(login_bucket(&overview, "email_ip"), email_ip);
    let minutes = overview["minutes"].as_array().unwrap_or_else(|| panic!("no minutes in {overview}"));
    assert_eq!(minutes.len(), 15, "{overview}");
    let starts: Vec<_> = minutes.iter().map(|m| minute_start(&m["minute"])).collect();
    assert!(
        starts.windows(2).all(|w| (w[1] - w[0]).num_seconds() == 60),
        "one a minute, oldest first: {starts:?}"
    );
    // Summed: the minute may turn between the checks and the overview.
    let sum = |field: &str| minutes.iter().map(|m| m[field].as_u64().expect("a count")).sum::<u64>();
    assert_eq!((sum("checks"), sum("denied")), (3, 1), "{overview}");
}

fn minute_start(text: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    let text = text.as_str().unwrap_or_else(|| panic!("no minute: {text}"));
    let at = chrono::DateTime::parse_from_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(chrono::Timelike::second(&at), 0, "{text} starts a minute");
    at
}
