//! Checks from SQL and from HTTP on one key stay exact together: the SQL
//! functions lock the same row, in the same order, as the service does.

use serde_json::json;
use sqlx::postgres::PgPoolOptions;

use crate::common::{check, fresh_database, instance, policy_file};
use crate::sql_interface::sql_check;

const POLICIES: &str = r#"
[policies.shared]
identifiers = { account = "text" }
[[policies.shared.buckets]]
name = "hourly"
on = ["account"]
limit = 25
window = "1h"
[[policies.shared.buckets]]
name = "daily"
on = ["account"]
limit = 1000
window = "1d"
algorithm = "sliding_window"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_sql_callers_on_three_instances_admit_exactly_the_limit() {
    let url = fresh_database().await;
    let file = policy_file(POLICIES);
    let vars = [("PGLIMIT_POLICIES", file.to_str().expect("a path")), ("PGLIMIT_SQL", "on")];
    let apps = [instance(&url, &vars).await, instance(&url, &vars).await, instance(&url, &vars).await];
    let pool = PgPoolOptions::new().max_connections(12).connect(&url).await.expect("connect");
    let body = json!({ "policy": "shared", "identifiers": { "account": "acct_9" } });
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..60 {
        let (app, pool, body) = (apps[n % 3].clone(), pool.clone(), body.clone());
        calls.spawn(async move {
            if n % 2 == 0 {
                let reply = check(&app, body).await;
                assert!(matches!(reply.status.as_u16(), 200 | 429), "{}", reply.body);
                reply.body["allowed"] == true
            } else {
                sql_check(&pool, "shared", json!({ "account": "acct_9" }), 1).await["allowed"] == true
            }
        });
    }
    let admitted = calls.join_all().await.into_iter().filter(|&allowed| allowed).count();
    assert_eq!(admitted, 25, "one limit of 25 across three instances and SQL");
    let peek = sql_check(&pool, "shared", json!({ "account": "acct_9" }), 0).await;
    assert_eq!((peek["remaining"].as_i64(), peek["buckets"][1]["remaining"].as_i64()), (Some(0), Some(975)));
}

/// Who is being limited counts denials from SQL as from HTTP: one list,
/// one count per key and bucket, identifiers marked `show` in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_from_sql_and_http_are_counted_together_in_the_top_list() {
    let url = fresh_database().await;
    let shown = POLICIES.replace(
        r#"identifiers = { account = "text" }"#,
        r#"identifiers = { account = { kind = "text", show = true } }"#,
    );
    let file = policy_file(&shown.replace("limit = 25", "limit = 1"));
    let app =
        instance(&url, &[("PGLIMIT_POLICIES", file.to_str().expect("a path")), ("PGLIMIT_SQL", "on")]).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let body = json!({ "policy": "shared", "identifiers": { "account": "acct_7" } });
    assert_eq!(check(&app, body.clone()).await.status, 200);
    assert_eq!(check(&app, body).await.status, 429);
    for _ in 0..3 {
        assert_eq!(sql_check(&pool, "shared", json!({ "account": "acct_7" }), 1).await["allowed"], false);
    }
    let top = crate::common::call(&app, "GET", "/admin/top?policy=shared", serde_json::Value::Null).await;
    let keys = top.body["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{}", top.body);
    assert_eq!((keys[0]["bucket"].as_str(), keys[0]["denials"].as_u64()), (Some("hourly"), Some(4)));
    assert_eq!(keys[0]["shown"], json!({ "account": "acct_7" }));
}
