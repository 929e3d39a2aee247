//! `pglimit.check` and its siblings against a real service sharing the
//! database: transactions, grants, refusals, and the rules a check obeys
//! (overrides, lists, blocks, leases, resets) alike from SQL and HTTP.

use serde_json::{json, Value};
use sqlx::postgres::{PgDatabaseError, PgPool};
use sqlx::Row;

use pglimit::AppState;

use crate::common::{call, check, fresh_database, instance, policy_file};

pub const POLICIES: &str = r#"
[policies.contact]
identifiers = { recipient = "email", ip = "ip" }
[[policies.contact.buckets]]
name = "recipient"
on = ["recipient"]
limit = 3
window = "1h"
[[policies.contact.buckets]]
name = "ip"
on = ["ip"]
limit = 50
window = "1h"
[[policies.contact.overrides]]
when = { recipient = "*@blocked.example" }
deny = true
[[policies.contact.overrides]]
when = { ip = "10.0.0.0/8" }
unlimited = true

[policies.jobs]
identifiers = { user = "text" }
[[policies.jobs.buckets]]
name = "running"
on = ["user"]
limit = 1
algorithm = "concurrency"
lease = "1m"
"#;

/// A service on a fresh database (which installs the interface and writes
/// the policies) and a pool of the database's owner.
pub async fn service() -> (AppState, PgPool, String) {
    let url = fresh_database().await;
    let file = policy_file(POLICIES);
    let app =
        instance(&url, &[("PGLIMIT_POLICIES", file.to_str().expect("a path")), ("PGLIMIT_SQL", "on")]).await;
    let pool = PgPool::connect(&url).await.expect("connect");
    (app, pool, url)
}

/// `SELECT * FROM pglimit.check(policy, identifiers, cost)` as JSON.
pub async fn sql_check(db: impl sqlx::PgExecutor<'_>, policy: &str, identifiers: Value, cost: i64) -> Value {
    try_sql_check(db, policy, identifiers, cost).await.expect("pglimit.check")
}

pub async fn try_sql_check(
    db: impl sqlx::PgExecutor<'_>,
    policy: &str,
    identifiers: Value,
    cost: i64,
) -> Result<Value, sqlx::Error> {
    let row = sqlx::query("SELECT to_jsonb(d) FROM pglimit.check($1, $2, $3) AS d")
        .bind(policy)
        .bind(identifiers)
        .bind(cost)
        .fetch_one(db)
        .await?;
    Ok(row.get(0))
}

/// The SQLSTATE, message and COLUMN of a database error.
pub fn refusal(e: &sqlx::Error) -> (String, String, Option<String>) {
    let db = e.as_database_error().unwrap_or_else(|| panic!("a database error, not {e}"));
    let pg = db.try_downcast_ref::<PgDatabaseError>().expect("a PostgreSQL error");
    (pg.code().to_owned(), pg.message().to_owned(), pg.column().map(str::to_owned))
}

pub fn contact(recipient: &str, ip: &str) -> Value {
    json!({ "recipient": recipient, "ip": ip })
}

#[tokio::test]
async fn a_check_rolled_back_is_not_counted_and_one_committed_is() {
    let (_app, pool, _) = service().await;
    let who = contact("ann@example.com", "192.0.2.1");
    let mut tx = pool.begin().await.expect("begin");
    assert_eq!(sql_check(&mut *tx, "contact", who.clone(), 1).await["remaining"], 2);
    tx.rollback().await.expect("rollback");
    assert_eq!(sql_check(&pool, "contact", who.clone(), 0).await["remaining"], 3, "rolled back: uncounted");
    let mut tx = pool.begin().await.expect("begin");
    sql_check(&mut *tx, "contact", who.clone(), 1).await;
    tx.commit().await.expect("commit");
    assert_eq!(sql_check(&pool, "contact", who, 0).await["remaining"], 2, "committed: counted");
}

/// What docs/sql.md warns of: the bucket's row is locked until the caller
/// commits, so another check of that key waits (here, past its lock_timeout).
#[tokio::test]
async fn a_checked_bucket_stays_locked_until_the_caller_commits() {
    let (_app, pool, _) = service().await;
    let who = contact("bea@example.com", "192.0.2.2");
    let mut holder = pool.begin().await.expect("begin");
    sql_check(&mut *holder, "contact", who.clone(), 1).await;
    let mut other = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL lock_timeout = '50ms'").execute(&mut *other).await.expect("set");
    let waited = try_sql_check(&mut *other, "contact", who.clone(), 1).await.expect_err("the row is locked");
    assert_eq!(refusal(&waited).0, "55P03", "lock_not_available");
    other.rollback().await.expect("rollback");
    holder.commit().await.expect("commit");
    assert_eq!(sql_check(&pool, "contact", who, 1).await["remaining"], 1, "free once committed");
}

#[tokio::test]
async fn bad_input_is_refused_with_the_detail_and_field_of_the_apis_problem() {
    let (app, pool, _) = service().await;
    let cases = [
        ("nope", contact("a@example.com", "192.0.2.1"), 1),
        ("contact", json!({ "recipient": "a@example.com" }), 1),
        ("contact", json!({ "recipient": "a@example.com", "ip": "192.0.2.1", "x": "y" }), 1),
        ("contact", contact("not an address", "192.0.2.1"), 1),
        ("contact", contact("a@example.com", "300.1.1.1"), 1),
        ("contact", contact("a@example.com", "192.0.2.1"), 4),
        ("contact", contact("a@example.com", "192.0.2.1"), 2_000_000_000),
    ];
    for (policy, identifiers, cost) in cases {
        let reply = check(&app, json!({ "policy": policy, "identifiers": identifiers, "cost": cost })).await;
        assert_eq!(reply.status, 400, "{policy} {identifiers} {cost}: {}", reply.body);
        let e = try_sql_check(&pool, policy, identifiers.clone(), cost).await.expect_err("refused");
        let (state, message, column) = refusal(&e);
        assert_eq!(state, "22023", "{message}");
        assert_eq!(Some(message.as_str()), reply.body["detail"].as_str(), "{identifiers} {cost}");
        assert_eq!(column.as_deref(), reply.body["field"].as_str(), "{identifiers} {cost}");
    }
}

#[tokio::test]
async fn deny_and_allow_lists_blocks_and_api_overrides_apply_from_sql_as_over_http() {
    let (app, pool, _) = service().await;
    let denied = sql_check(&pool, "contact", contact("x@blocked.example", "192.0.2.9"), 1).await;
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["override"], json!({ "index": 0, "action": "deny" }));
    assert_eq!(denied["retry_after_s"], Value::Null, "a deny list has no end to wait for");
    let listed = contact("y@example.com", "10.1.1.1");
    for _ in 0..5 {
        assert_eq!(sql_check(&pool, "contact", listed.clone(), 1).await["allowed"], true, "allow list");
    }
    let over = json!({ "policy": "contact", "when": { "recipient": "vip@example.com" }, "limits": { "recipient": 5 } });
    assert_eq!(call(&app, "POST", "/admin/overrides", over).await.status, 201);
    let vip = sql_check(&pool, "contact", contact("VIP+a@example.com", "192.0.2.10"), 1).await;
    assert_eq!((vip["limit"].as_i64(), vip["override"]["action"].as_str()), (Some(5), Some("limits")));
    let block = json!({ "policy": "contact", "identifiers": { "ip": "192.0.2.11" }, "for": "10m" });
    assert_eq!(call(&app, "POST", "/admin/blocks", block).await.status, 200);
    let blocked = sql_check(&pool, "contact", contact("z@example.com", "192.0.2.11"), 1).await;
    assert_eq!((blocked["allowed"].as_bool(), blocked["blocked_by"].as_str()), (Some(false), Some("ip")));
}

#[tokio::test]
async fn a_reset_from_sql_makes_every_instance_forget_its_remembered_denial() {
    let (app, pool, _) = service().await;
    let who = contact("dee@example.com", "192.0.2.20");
    let body = json!({ "policy": "contact", "identifiers": who });
    for _ in 0..3 {
        assert_eq!(check(&app, body.clone()).await.status, 200);
    }
    assert_eq!(check(&app, body.clone()).await.status, 429, "denied, and remembered");
    let reset = sqlx::query("SELECT to_jsonb(d) FROM pglimit.reset('contact', $1) AS d")
        .bind(&who)
        .fetch_one(&pool)
        .await
        .expect("pglimit.reset");
    assert_eq!(reset.get::<Value, _>(0)["remaining"], 3);
    // The instance hears the reset's notification: poll until it admits.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while check(&app, body.clone()).await.status != 200 {
        assert!(std::time::Instant::now() < deadline, "the deny cache never forgot the reset key");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_lease_taken_in_sql_is_released_over_http_and_one_taken_over_http_in_sql() {
    let (app, pool, _) = service().await;
    let taken = sql_check(&pool, "jobs", json!({ "user": "u1" }), 1).await;
    let lease = taken["lease"].as_str().expect("a lease").to_owned();
    assert_eq!(sql_check(&pool, "jobs", json!({ "user": "u1" }), 1).await["allowed"], false, "one slot");
    assert_eq!(call(&app, "POST", "/release", json!({ "lease": lease })).await.status, 200);
    let reply = check(&app, json!({ "policy": "jobs", "identifiers": { "user": "u1" } })).await;
    let lease = reply.body["lease"]["id"].as_str().expect("a lease").to_owned();
    let release = |lease: String| {
        sqlx::query_scalar::<_, Option<bool>>("SELECT pglimit.release($1)").bind(lease).fetch_one(&pool)
    };
    assert_eq!(release(lease.clone()).await.expect("release"), Some(true));
    assert_eq!(release(lease).await.expect("release"), Some(false), "released already");
    assert_eq!(release(format!("lease_{}", "0".repeat(32))).await.expect("release"), None, "no such lease");
    let malformed = release("lease_x".into()).await.expect_err("malformed");
    assert_eq!(refusal(&malformed).2.as_deref(), Some("lease"));
}

#[tokio::test]
async fn enforce_raises_rl429_with_the_retry_time_in_its_detail() {
    let (_app, pool, _) = service().await;
    let who = contact("eve@example.com", "192.0.2.30");
    let enforce = || sqlx::query("SELECT * FROM pglimit.enforce('contact', $1)").bind(&who).execute(&pool);
    for _ in 0..3 {
        enforce().await.expect("admitted");
    }
    let e = enforce().await.expect_err("denied");
    let pg = e.as_database_error().and_then(|d| d.try_downcast_ref::<PgDatabaseError>()).expect("pg");
    assert_eq!(pg.code(), "RL429");
    let detail: Value = serde_json::from_str(pg.detail().expect("a detail")).expect("JSON");
    let retry = detail["retry_after_s"].as_u64().expect("retry_after_s");
    assert!((3500..=3600).contains(&retry), "an hour's window: {retry}");
    assert!(pg.message().contains("recipient"), "{}", pg.message());
}

/// The payload the instances read (listener.rs): the generation, then the
/// keys in hex, or `*` past 100 of them.
#[tokio::test]
async fn an_announcement_names_up_to_a_hundred_keys_and_past_that_everything() {
    let (_app, _pool, url) = service().await;
    let functions = crate::common::functions_pool(&url).await;
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.expect("listen");
    listener.listen("pglimit_actions").await.expect("listen");
    for (keys, named) in [(2usize, true), (100, true), (101, false)] {
        let keys: Vec<Vec<u8>> = (0..keys).map(|i| vec![i as u8; 32]).collect();
        let generation: i64 = sqlx::query_scalar("SELECT pglimit_announce($1)")
            .bind(&keys)
            .fetch_one(&functions)
            .await
            .expect("announce");
        let heard = listener.recv().await.expect("a notification");
        let hex: Vec<String> = keys.iter().map(hex::encode).collect();
        let want = if named { format!("{generation} {}", hex.join(",")) } else { format!("{generation} *") };
        assert_eq!(heard.payload(), want);
    }
}

/// The policies in force reach the SQL functions at start-up and with
/// every reload, so SQL and HTTP callers never enforce two files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_policy_file_reaches_the_sql_functions() {
    let url = fresh_database().await;
    let file = policy_file(&POLICIES.replace("limit = 3", "limit = 30"));
    let vars = [("PGLIMIT_POLICIES", file.to_str().expect("a path")), ("PGLIMIT_SQL", "on")];
    let service = crate::common::try_service(&url, &vars).await.expect("starts");
    let pool = PgPool::connect(&url).await.expect("connect");
    let limit = || async {
        sql_check(&pool, "contact", contact("fay@example.com", "192.0.2.40"), 0).await["limit"].clone()
    };
    assert_eq!(limit().await, 30);
    std::fs::write(&file, POLICIES).expect("rewrite the policy file");
    let deadline =
        std::time::Instant::now() + 20 * pglimit::reload::SETTLE + std::time::Duration::from_secs(10);
    while limit().await != 3 {
        assert!(std::time::Instant::now() < deadline, "the reload never reached pglimit_policies");
        tokio::time::sleep(pglimit::reload::SETTLE).await;
    }
    drop(service);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_block_from_sql_denies_over_http_is_audited_and_lifted_from_sql() {
    let (app, pool, _) = service().await;
    let ip = json!({ "ip": "192.0.2.60" });
    let until: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT pglimit.block('contact', $1, interval '10 minutes', 'spam run')")
            .bind(&ip)
            .fetch_one(&pool)
            .await
            .expect("pglimit.block");
    assert!(until > chrono::Utc::now() + chrono::TimeDelta::minutes(9));
    let body = json!({ "policy": "contact", "identifiers": contact("hal@example.com", "192.0.2.60") });
    let denied = check(&app, body.clone()).await;
    assert_eq!((denied.status.as_u16(), denied.body["blocked_by"].as_str()), (429, Some("ip")));
    let audit = call(&app, "GET", "/admin/audit?action=block", Value::Null).await;
    let row = &audit.body["entries"][0];
    assert!(row["actor"].as_str().is_some_and(|a| a.starts_with("sql:")), "{row}");
    assert_eq!(
        (row["target"].as_str(), row["detail"]["reason"].as_str()),
        (Some("contact/ip"), Some("spam run"))
    );
    let lifted: i64 = sqlx::query_scalar("SELECT pglimit.unblock('contact', $1)")
        .bind(&ip)
        .fetch_one(&pool)
        .await
        .expect("pglimit.unblock");
    assert_eq!(lifted, 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while check(&app, body.clone()).await.status != 200 {
        assert!(std::time::Instant::now() < deadline, "the unblock was never heard");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let missing =
        sqlx::query("SELECT pglimit.block('contact', '{}', interval '1 minute')").execute(&pool).await;
    let (state, message, column) = refusal(&missing.expect_err("names nothing"));
    assert_eq!((state.as_str(), column.as_deref()), ("22023", Some("identifiers.recipient")), "{message}");
}
