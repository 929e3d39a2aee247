//! Named policies end to end, against a real PostgreSQL.

use crate::common::{app, check, login, remaining};
use axum::http::StatusCode;
use serde_json::json;

#[tokio::test]
async fn login_checks_all_three_buckets_together() {
    let app = app().await;
    let reply = check(&app, login("alice@example.com", "203.0.113.7")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let names: Vec<&str> =
        reply.body["buckets"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["email_ip", "ip", "email"]);
    assert_eq!(remaining(&reply.body, "email_ip"), 4);
    assert_eq!(remaining(&reply.body, "ip"), 19);
    assert_eq!(remaining(&reply.body, "email"), 49);
    // The headline figures are the bucket with the least remaining.
    assert_eq!(reply.body["limit"], 5);
    assert_eq!(reply.body["remaining"], 4);
    assert_eq!(reply.body["store"], "postgres");
    assert_eq!(reply.body["degraded"], false);
}

#[tokio::test]
async fn the_sixth_attempt_from_one_ip_on_one_email_is_denied() {
    let app = app().await;
    for n in 1..=5 {
        let reply = check(&app, login("alice@example.com", "203.0.113.7")).await;
        assert_eq!(reply.status, StatusCode::OK, "attempt {n}");
    }
    let reply = check(&app, login("Alice@Example.com", "203.0.113.7")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.body["allowed"], false);
    assert_eq!(reply.body["limit"], 5, "headline is the denying bucket");
    assert_eq!(reply.body["buckets"][0]["allowed"], false);
    assert_eq!(reply.body["buckets"][1]["allowed"], true);
    let retry = reply.body["retry_after_s"].as_u64().unwrap();
    assert!((1..=60).contains(&retry), "retry_after_s = {retry}");
}

#[tokio::test]
async fn denied_login_attempts_do_not_consume_the_email_bucket() {
    let app = app().await;
    // An attacker hammers alice's address from one IP, far past the limit.
    for _ in 0..5 {
        check(&app, login("alice@example.com", "198.51.100.66")).await;
    }
    for _ in 0..40 {
        let reply = check(&app, login("alice@example.com", "198.51.100.66")).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    }
    // The real owner, from her own IP, still gets in: only the 5 admitted
    // attempts were counted against her address.
    let reply = check(&app, login("alice@example.com", "203.0.113.7")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(remaining(&reply.body, "email"), 50 - 5 - 1);
    // And the attacker's IP bucket counted only the admitted attempts too.
    let state = check(&app, json!({ "policy": "login", "identifiers": { "email": "bob@example.com", "ip": "198.51.100.66" }, "cost": 0 })).await;
    assert_eq!(remaining(&state.body, "ip"), 20 - 5);
}

#[tokio::test]
async fn one_ip_is_capped_across_all_emails() {
    let app = app().await;
    for n in 0..20 {
        let reply = check(&app, login(&format!("user{n}@example.com"), "192.0.2.1")).await;
        assert_eq!(reply.status, StatusCode::OK, "attempt {n}");
    }
    let reply = check(&app, login("someone.else@example.com", "192.0.2.1")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.body["buckets"][1]["name"], "ip");
    assert_eq!(reply.body["buckets"][1]["allowed"], false);
    // The same IP written as IPv4-mapped IPv6 is the same bucket.
    let reply = check(&app, login("other@example.com", "::ffff:192.0.2.1")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn ipv6_clients_in_one_64_share_the_ip_bucket() {
    let app = app().await;
    for n in 0..20 {
        check(&app, login(&format!("u{n}@example.com"), &format!("2001:db8:0:1::{n:x}"))).await;
    }
    let reply = check(&app, login("x@example.com", "2001:db8:0:1:ffff::1")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = check(&app, login("x@example.com", "2001:db8:0:2::1")).await;
    assert_eq!(reply.status, StatusCode::OK, "another /64 is another bucket");
}

#[tokio::test]
async fn contact_confirmations_are_capped_per_mailbox_however_it_is_written() {
    let app = app().await;
    let contact = |to: &str| json!({ "policy": "contact_confirmation", "identifiers": { "recipient": to } });
    for to in ["Alice@Example.com", " alice+contact@example.com ", "ALICE@EXAMPLE.COM"] {
        assert_eq!(check(&app, contact(to)).await.status, StatusCode::OK, "{to}");
    }
    let reply = check(&app, contact("alice+promo@Example.Com")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.body["limit"], 3);
    let retry = reply.body["retry_after_s"].as_u64().unwrap();
    assert!(retry > 86_000 && retry <= 86_400, "a day's window, got {retry}");
    assert_eq!(check(&app, contact("bob@example.com")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn cost_zero_reports_the_state_without_consuming() {
    let app = app().await;
    check(&app, login("carol@example.com", "203.0.113.9")).await;
    for _ in 0..3 {
        let mut body = login("carol@example.com", "203.0.113.9");
        body["cost"] = json!(0);
        let reply = check(&app, body).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(remaining(&reply.body, "email_ip"), 4);
    }
}

#[tokio::test]
async fn a_cost_takes_that_many_slots_from_every_bucket() {
    let app = app().await;
    let mut body = login("dan@example.com", "203.0.113.10");
    body["cost"] = json!(3);
    let reply = check(&app, body.clone()).await;
    assert_eq!(remaining(&reply.body, "email_ip"), 2);
    assert_eq!(remaining(&reply.body, "ip"), 17);
    let reply = check(&app, body).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "3 more do not fit in the 2 left");
    assert_eq!(remaining(&reply.body, "email_ip"), 2, "a denied check takes nothing");
}
