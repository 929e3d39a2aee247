//! The slow-check log: `GET` and `DELETE /admin/slow-checks`.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use crate::common::{adhoc_key, call, check, fresh_database, instance, login, send, unique};

async fn slow_checks(app: &pglimit::AppState) -> Value {
    let reply = call(app, "GET", "/admin/slow-checks", Value::Null).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

fn entries(listing: &Value) -> &Vec<Value> {
    listing["checks"].as_array().unwrap_or_else(|| panic!("no checks in {listing}"))
}

fn us(entry: &Value, field: &str) -> u64 {
    entry[field].as_u64().unwrap_or_else(|| panic!("no {field} in {entry}"))
}

/// Asserts that an entry's phases add up to its total, and returns its total.
fn phases_add_up(entry: &Value) -> u64 {
    let total = us(entry, "total_us");
    assert_eq!(us(entry, "queue_us") + us(entry, "call_us") + us(entry, "rest_us"), total, "{entry}");
    total
}

/// An entry's store, decision and policy.
fn labels(entry: &Value) -> (Option<&str>, Option<&str>, Option<&str>) {
    (entry["store"].as_str(), entry["decision"].as_str(), entry["policy"].as_str())
}

#[tokio::test]
async fn each_check_is_listed_with_phases_that_add_up_to_its_total_and_the_store_that_decided_it() {
    let app = instance(&fresh_database().await, &[]).await;
    let before = chrono::Utc::now() - chrono::TimeDelta::milliseconds(1);
    assert_eq!(check(&app, login("alice@example.com", "203.0.113.7")).await.status, StatusCode::OK);
    let key = json!({ "key": unique("once"), "limit": 1, "window": "1h" });
    assert_eq!(check(&app, key.clone()).await.status, StatusCode::OK);
    // Repeats of a denial: Postgres denies the first, the deny cache the
    // next (a second one forgotten if the instance starts listening for
    // actions just then, which counts as everything stale).
    for _ in 0..3 {
        assert_eq!(check(&app, key.clone()).await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let after = chrono::Utc::now();

    let listing = slow_checks(&app).await;
    assert_eq!((listing["seen"].as_u64(), listing["capacity"].as_u64()), (Some(5), Some(128)), "{listing}");
    let checks = entries(&listing);
    assert_eq!(checks.len(), 5, "{listing}");
    let totals: Vec<u64> = checks.iter().map(phases_add_up).collect();
    assert!(totals.windows(2).all(|w| w[0] >= w[1]), "the slowest first: {totals:?}");
    let kinds: std::collections::BTreeSet<_> = checks.iter().map(labels).collect();
    let expected = [
        (Some("deny_cache"), Some("denied"), Some("_adhoc")),
        (Some("postgres"), Some("allowed"), Some("_adhoc")),
        (Some("postgres"), Some("allowed"), Some("login")),
        (Some("postgres"), Some("denied"), Some("_adhoc")),
    ];
    assert_eq!(kinds, expected.into_iter().collect(), "{listing}");
    for c in checks {
        let finished: chrono::DateTime<chrono::Utc> =
            c["finished_at"].as_str().and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("{c}"));
        assert!(before <= finished && finished <= after, "{c}");
        if c["store"] == "postgres" {
            assert!(us(c, "call_us") > 0 && us(c, "checks_in_call") >= 1, "a call decided it: {c}");
        } else {
            assert_eq!((us(c, "queue_us"), us(c, "call_us"), us(c, "checks_in_call")), (0, 0, 0), "{c}");
        }
    }
    let text = listing.to_string();
    assert!(!text.contains("alice") && !text.contains("203.0.113.7"), "no identifier is listed: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_log_keeps_the_slowest_and_a_check_held_on_a_row_lock_ranks_first_with_its_time_in_the_call() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_SLOW_CHECKS", "3")]).await;
    let name = unique("held");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::query(
        "INSERT INTO pglimit_buckets (key, count, expires_at) VALUES ($1, 0, now() + interval '1 hour')",
    )
    .bind(adhoc_key(&name).as_slice())
    .execute(&pool)
    .await
    .expect("the held key's row");
    // Another client takes the row and sits on it.
    let holder = crate::common::lock_row(&pool, &name).await;
    let held = {
        let app = app.clone();
        tokio::spawn(async move { check(&app, json!({ "key": name, "limit": 10, "window": "1h" })).await })
    };
    crate::common::wait_for_a_backend_waiting_on(&pool, "Lock").await;
    // Every other check starts and ends while the held one's call waits.
    for _ in 0..5 {
        let reply = check(&app, json!({ "key": unique("free"), "limit": 5, "window": "1h" })).await;
        assert_eq!((reply.status, reply.body["store"].as_str()), (StatusCode::OK, Some("postgres")));
    }
    assert!(!held.is_finished(), "the other checks went around the held one");
    holder.commit().await.expect("release the row");
    let reply = held.await.expect("the held check");
    assert_eq!((reply.status, reply.body["store"].as_str()), (StatusCode::OK, Some("postgres")));
    pool.close().await;

    let listing = slow_checks(&app).await;
    assert_eq!(listing["seen"], 6, "{listing}");
    let checks = entries(&listing);
    assert_eq!(checks.len(), 3, "only the 3 slowest are kept: {listing}");
    for c in checks {
        phases_add_up(c);
    }
    let slowest = &checks[0];
    for other in &checks[1..] {
        assert!(
            us(slowest, "call_us") >= us(other, "total_us"),
            "the held check's call alone outlasted every other check: {listing}"
        );
    }
    assert_eq!(us(slowest, "checks_in_call"), 1, "{slowest}");
}

#[tokio::test]
async fn a_reset_empties_the_log_and_answers_what_it_held() {
    let app = instance(&fresh_database().await, &[]).await;
    for _ in 0..2 {
        check(&app, json!({ "key": unique("r"), "limit": 5, "window": "1h" })).await;
    }
    let reset = call(&app, "DELETE", "/admin/slow-checks", Value::Null).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    assert_eq!((reset.body["seen"].as_u64(), entries(&reset.body).len()), (Some(2), 2), "{}", reset.body);

    let emptied = slow_checks(&app).await;
    assert_eq!((emptied["seen"].as_u64(), entries(&emptied).len()), (Some(0), 0), "{emptied}");
    let since = |listing: &Value| listing["since"].as_str().and_then(|t| t.parse().ok());
    let (was, now): (Option<chrono::DateTime<chrono::Utc>>, _) = (since(&reset.body), since(&emptied));
    assert!(was.is_some() && was <= now, "the log counts from the reset: {was:?}, {now:?}");
    check(&app, json!({ "key": unique("r"), "limit": 5, "window": "1h" })).await;
    let after = slow_checks(&app).await;
    assert_eq!((after["seen"].as_u64(), entries(&after).len()), (Some(1), 1), "{after}");
}

#[tokio::test]
async fn the_slow_check_routes_take_an_admin_token_and_are_off_on_a_network_bind_without_one() {
    let url = fresh_database().await;
    let app = instance(&url, &[("PGLIMIT_API_TOKENS", "app"), ("PGLIMIT_ADMIN_TOKENS", "ops")]).await;
    let request = |method: &str, token: Option<&str>| {
        let mut request = Request::builder().method(method).uri("/admin/slow-checks");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(Body::empty()).unwrap()
    };
    for method in ["GET", "DELETE"] {
        for token in [None, Some("app"), Some("wrong")] {
            let reply = send(&app, request(method, token)).await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method} with {token:?}: {}", reply.body);
        }
        assert_eq!(send(&app, request(method, Some("ops"))).await.status, StatusCode::OK, "{method}");
    }

    let exposed = instance(&url, &[("PGLIMIT_BIND", "0.0.0.0:0"), ("PGLIMIT_API_TOKENS", "app")]).await;
    for method in ["GET", "DELETE"] {
        let reply = send(&exposed, request(method, Some("app"))).await;
        assert_eq!(
            (reply.status, reply.body["type"].as_str()),
            (StatusCode::FORBIDDEN, Some("urn:pglimit:problem:admin-disabled")),
            "{method}"
        );
    }
}

#[tokio::test]
async fn with_a_capacity_of_zero_nothing_is_recorded() {
    let app = instance(&fresh_database().await, &[("PGLIMIT_SLOW_CHECKS", "0")]).await;
    assert_eq!(
        check(&app, json!({ "key": unique("z"), "limit": 5, "window": "1h" })).await.status,
        StatusCode::OK
    );
    let listing = slow_checks(&app).await;
    assert_eq!(
        (listing["capacity"].as_u64(), listing["seen"].as_u64(), entries(&listing).len()),
        (Some(0), Some(0), 0),
        "{listing}"
    );
}
