//! Overrides, allow and deny lists, for every algorithm.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{call, check, fresh_database, instance, policy_file};

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"];

fn override_policy(algorithm: &str) -> String {
    format!(
        r#"[policies.api]
identifiers = {{ email = "email", ip = "ip" }}
[[policies.api.buckets]]
name = "email"
on = ["email"]
limit = 2
window = "1h"
algorithm = "{algorithm}"
[[policies.api.overrides]]
when = {{ email = "*@partner.example" }}
limits = {{ email = 6 }}
[[policies.api.overrides]]
when = {{ ip = "10.0.0.0/8" }}
unlimited = true
[[policies.api.overrides]]
when = {{ ip = "203.0.113.66" }}
deny = true
"#
    )
}

fn api(email: &str, ip: &str) -> Value {
    json!({ "policy": "api", "identifiers": { "email": email, "ip": ip } })
}

/// How many of `n` checks of `body` are admitted.
async fn admitted(app: &pglimit::AppState, body: &Value, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(check(app, body.clone()).await.status == StatusCode::OK);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_give_their_own_limit_an_allow_list_and_a_deny_list_for_every_algorithm() {
    for algorithm in ALGORITHMS {
        let file = policy_file(&override_policy(algorithm));
        let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
        assert_eq!(
            admitted(&app, &api("a@example.com", "192.0.2.1"), 5).await,
            2,
            "{algorithm}: the policy's limit"
        );
        let partner = api("b@partner.example", "192.0.2.1");
        assert_eq!(admitted(&app, &partner, 9).await, 6, "{algorithm}: the partner's limit");
        assert_eq!(check(&app, partner).await.body["override"], json!({ "index": 0, "action": "limits" }));

        let internal = api("c@example.com", "10.1.2.3");
        assert_eq!(admitted(&app, &internal, 20).await, 20, "{algorithm}: allow-listed, never denied");
        let reply = check(&app, internal).await;
        assert_eq!(
            (reply.body["store"].as_str(), reply.body["override"]["action"].as_str()),
            (Some("none"), Some("unlimited"))
        );

        let refused = check(&app, api("d@example.com", "203.0.113.66")).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: deny-listed");
        assert_eq!(refused.body["override"]["action"], "deny");
        assert_eq!((refused.header("retry-after"), &refused.body["retry_after_s"]), ("", &Value::Null));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_block_beats_the_allow_list_for_every_algorithm() {
    for algorithm in ALGORITHMS {
        let file = policy_file(&override_policy(algorithm));
        let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
        let (blocked, neighbour) = (api("e@example.com", "10.9.9.9"), api("f@example.com", "10.9.9.10"));
        let target = json!({ "policy": "api", "identifiers": { "email": "e@example.com" }, "for": "10m" });
        let reply = call(&app, "POST", "/admin/blocks", target.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

        let denied = check(&app, blocked.clone()).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: {}", denied.body);
        assert_eq!(
            (denied.body["blocked_by"].as_str(), denied.body["store"].as_str()),
            (Some("email"), Some("postgres"))
        );
        assert_eq!(
            admitted(&app, &neighbour, 5).await,
            5,
            "{algorithm}: the rest of the range stays unlimited"
        );

        assert_eq!(call(&app, "DELETE", "/admin/blocks", target).await.status, StatusCode::OK);
        assert_eq!(admitted(&app, &blocked, 5).await, 5, "{algorithm}: unlimited again once lifted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_further_down_the_file_beats_an_earlier_override_that_also_matches() {
    let file = policy_file(&override_policy("fixed_window"));
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let partner_from_the_denied_address = api("b@partner.example", "203.0.113.66");
    let refused = check(&app, partner_from_the_denied_address).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(refused.body["override"], json!({ "index": 2, "action": "deny" }));
}
