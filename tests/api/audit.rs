//! The audit log: every administrative act writes exactly one row, with
//! who acted (a named token's name, an unnamed one's fingerprint, never a
//! token), the request's id and what changed; an act that fails writes
//! none. Pages, filters and retention are in `audit_pages.rs`.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use crate::common::{fresh_database, instance, send, Reply};

pub const ALICE: &str = "alice-secret-4f1d";
pub const UNNAMED: &str = "unnamed-secret-9c2e";
pub const API: &str = "api-token-77ab";

/// Admin tokens (one named alice, one without a name) and an API token.
pub fn tokens() -> String {
    format!("alice:{ALICE},{UNNAMED}")
}

pub async fn audited_instance(url: &str) -> pglimit::AppState {
    instance(url, &[("PGLIMIT_ADMIN_TOKENS", &tokens()), ("PGLIMIT_API_TOKENS", API)]).await
}

/// `method path` with `body` as JSON, the bearer `token` and `x-request-id: id`.
pub async fn act(
    app: &pglimit::AppState,
    method: &str,
    path: &str,
    body: Value,
    token: &str,
    id: &str,
) -> Reply {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .header("x-request-id", id);
    let body = if body.is_null() { Body::empty() } else { Body::from(body.to_string()) };
    send(app, request.body(body).expect("a request")).await
}

/// `GET /admin/audit?query` as alice.
pub async fn audit(app: &pglimit::AppState, query: &str) -> Reply {
    act(app, "GET", &format!("/admin/audit?{query}"), Value::Null, ALICE, "audit-read").await
}

/// Every row, the newest first, read a page of 1000.
pub async fn entries(app: &pglimit::AppState) -> Vec<Value> {
    let reply = audit(app, "limit=1000").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["entries"].as_array().cloned().unwrap_or_default()
}

/// The rows other than start-ups, the oldest first.
async fn acts(app: &pglimit::AppState) -> Vec<Value> {
    let mut acts: Vec<Value> = entries(app).await.into_iter().filter(|e| e["action"] != "started").collect();
    acts.reverse();
    acts
}

/// The whole table as text, to look for what must never be in it.
async fn table_text(url: &str) -> String {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let (text,): (Option<String>,) = sqlx::query_as("SELECT string_agg(a::text, ' ') FROM pglimit_audit a")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    text.unwrap_or_default()
}

fn ip_target() -> Value {
    json!({ "policy": "login", "identifiers": { "ip": "198.51.100.23" }, "for": "15m", "reason": "abuse" })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_and_an_unblock_each_write_one_row_naming_the_token_and_the_request() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    let blocked = act(&app, "POST", "/admin/blocks", ip_target(), ALICE, "req-block-1").await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    let lifted = act(&app, "DELETE", "/admin/blocks", ip_target(), UNNAMED, "req-unblock-1").await;
    assert_eq!(lifted.status, StatusCode::OK, "{}", lifted.body);

    let acts = acts(&app).await;
    assert_eq!(acts.len(), 2, "{acts:#?}");
    let (block, unblock) = (&acts[0], &acts[1]);
    assert_eq!((block["actor"].as_str(), block["request_id"].as_str()), (Some("alice"), Some("req-block-1")));
    assert_eq!((block["action"].as_str(), block["target"].as_str()), (Some("block"), Some("login/ip")));
    let key = blocked.body["blocked"][0]["key"].as_str().expect("the key");
    assert_eq!(block["detail"]["keys"], json!([{ "bucket": "ip", "key": &key[..16] }]));
    assert_eq!(block["detail"]["until"], blocked.body["until"]);
    assert_eq!(
        (block["detail"]["reason"].as_str(), block["detail"]["for"].as_str()),
        (Some("abuse"), Some("15m"))
    );

    let fingerprint = unblock["actor"].as_str().expect("an actor");
    assert!(fingerprint.starts_with("token:") && fingerprint.len() == 14, "{fingerprint}");
    assert_eq!(unblock["request_id"], "req-unblock-1");
    assert_eq!((unblock["action"].as_str(), unblock["target"].as_str()), (Some("unblock"), Some("login/ip")));
    assert_eq!(unblock["detail"]["lifted"], 1);
    assert!(block["id"].is_string() && block["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{block}");

    let text = table_text(&url).await;
    for secret in [ALICE, UNNAMED, "198.51.100.23"] {
        assert!(!text.contains(secret), "{secret} is in the audit log: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setting_and_removing_an_override_each_write_one_row_targeting_its_id() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    let vip = json!({ "policy": "login", "when": { "email": "vip@example.com" }, "limits": { "email": 100 },
        "note": "plan upgrade" });
    let set = act(&app, "POST", "/admin/overrides", vip, ALICE, "req-set").await;
    assert_eq!(set.status, StatusCode::CREATED, "{}", set.body);
    let id = set.body["id"].as_str().expect("an id").to_owned();
    let removed =
        act(&app, "DELETE", &format!("/admin/overrides/{id}"), Value::Null, UNNAMED, "req-rm").await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);

    let acts = acts(&app).await;
    assert_eq!(acts.len(), 2, "{acts:#?}");
    let (added, gone) = (&acts[0], &acts[1]);
    assert_eq!(
        (added["action"].as_str(), added["target"].as_str()),
        (Some("override_set"), Some(id.as_str()))
    );
    assert_eq!((added["actor"].as_str(), added["request_id"].as_str()), (Some("alice"), Some("req-set")));
    let detail = &added["detail"];
    assert_eq!((detail["policy"].as_str(), detail["action"].as_str()), (Some("login"), Some("limits")));
    assert_eq!(detail["limits"], json!({ "email": 100 }));
    assert_eq!(detail["when"], set.body["when"], "exact values by their keyed hash only");
    assert_eq!((detail["note"].as_str(), detail["replaced"].clone()), (Some("plan upgrade"), json!([])));
    assert_eq!(
        (gone["action"].as_str(), gone["target"].as_str()),
        (Some("override_removed"), Some(id.as_str()))
    );
    assert_eq!(
        (gone["request_id"].as_str(), gone["detail"]["policy"].as_str()),
        (Some("req-rm"), Some("login"))
    );
    assert!(!table_text(&url).await.contains("vip@example.com"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_with_an_admin_token_is_audited_and_one_with_an_api_token_is_not() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    let mut alice =
        json!({ "policy": "login", "identifiers": { "email": "a@example.com", "ip": "192.0.2.8" } });
    let by_app = act(&app, "POST", "/reset", alice.clone(), API, "req-app").await;
    assert_eq!(by_app.status, StatusCode::OK, "{}", by_app.body);
    alice["buckets"] = json!(["email_ip"]);
    let by_operator = act(&app, "POST", "/reset", alice, ALICE, "req-op").await;
    assert_eq!(by_operator.status, StatusCode::OK, "{}", by_operator.body);
    let refused = act(&app, "POST", "/reset", json!({ "policy": "login" }), "no-such-token", "req-x").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);

    let acts = acts(&app).await;
    assert_eq!(acts.len(), 1, "{acts:#?}");
    let reset = &acts[0];
    assert_eq!((reset["action"].as_str(), reset["target"].as_str()), (Some("reset"), Some("login/email_ip")));
    assert_eq!((reset["actor"].as_str(), reset["request_id"].as_str()), (Some("alice"), Some("req-op")));
    assert_eq!(reset["detail"]["keys"][0]["bucket"], "email_ip");
    assert_eq!(reset["detail"]["keys"][0]["key"].as_str().map(str::len), Some(16));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_of_every_bucket_a_value_covers_names_them_all_in_one_row() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    let both = json!({ "policy": "login", "identifiers": { "email": "b@example.com", "ip": "192.0.2.9" }, "for": "1m" });
    let blocked = act(&app, "POST", "/admin/blocks", both, ALICE, "req-all").await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    let acts = acts(&app).await;
    assert_eq!(acts.len(), 1, "one act, one row: {acts:#?}");
    assert_eq!(acts[0]["target"], "login/email_ip,ip,email");
    assert_eq!(acts[0]["detail"]["keys"].as_array().map(Vec::len), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_act_that_fails_writes_no_row() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    let bad_body = json!({ "policy": "login", "identifiers": { "ip": "192.0.2.1" }, "for": "soon" });
    let refused = act(&app, "POST", "/admin/blocks", bad_body, ALICE, "req-bad").await;
    assert_eq!((refused.status, refused.body["field"].as_str()), (StatusCode::BAD_REQUEST, Some("for")));
    let unknown = act(&app, "DELETE", "/admin/overrides/ovr_nope", Value::Null, ALICE, "req-nope").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
    let stranger = act(&app, "POST", "/admin/blocks", ip_target(), API, "req-api").await;
    assert_eq!(stranger.status, StatusCode::UNAUTHORIZED, "an API token is no admin token");

    // A row that cannot be written undoes its act: they are one transaction.
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::query("ALTER TABLE pglimit_audit ADD CONSTRAINT no_blocks CHECK (action <> 'block')")
        .execute(&pool)
        .await
        .unwrap();
    let failed = act(&app, "POST", "/admin/blocks", ip_target(), ALICE, "req-fail").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE, "{}", failed.body);
    let (blocks,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pglimit_blocks").fetch_one(&pool).await.unwrap();
    assert_eq!(blocks, 0, "the block was not made without its row");
    pool.close().await;
    assert_eq!(acts(&app).await, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_refuses_to_update_a_row_and_the_cleanup_may_still_delete_one() {
    let url = fresh_database().await;
    let _app = audited_instance(&url).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let update = sqlx::query("UPDATE pglimit_audit SET actor = 'mallory'").execute(&pool).await;
    let refused = update.expect_err("an UPDATE is refused").to_string();
    assert!(refused.contains("never updated"), "{refused}");
    let (actors,): (Vec<String>,) =
        sqlx::query_as("SELECT array_agg(actor) FROM pglimit_audit").fetch_one(&pool).await.expect("read");
    assert_eq!(actors, ["system"], "the start-up row, unchanged");
    let deleted = sqlx::query("DELETE FROM pglimit_audit").execute(&pool).await.expect("delete");
    assert_eq!(deleted.rows_affected(), 1);
    pool.close().await;
}
