//! The audit log in Citus mode: a plain table on the coordinator, written
//! in the same transaction as a block of distributed rows, and kept
//! within its retention by the cleanup (which goes to the coordinator for
//! it even when its counters' deletes go straight to the workers).

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{self, instance, unique};
use crate::{cluster, direct};

#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn a_block_writes_its_row_to_a_plain_table_on_the_coordinator() {
    let url = cluster().0;
    let app = instance(&url, &[]).await;
    let ip = format!("198.51.100.{}", rand::random::<u8>());
    let target = json!({ "policy": "login", "identifiers": { "ip": ip }, "for": "1m" });
    let blocked = common::call(&app, "POST", "/admin/blocks", target.clone()).await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    let key = blocked.body["blocked"][0]["key"].as_str().expect("a key")[..16].to_owned();
    let listed =
        common::call(&app, "GET", "/admin/audit?action=block&target=login%2Fip&limit=1000", Value::Null)
            .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let rows = listed.body["entries"].as_array().expect("entries");
    assert!(rows.iter().any(|e| e["detail"]["keys"][0]["key"] == key.as_str()), "{}", listed.body);

    let pool = direct(&url).await;
    let (distributed,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pglimit_audit'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .expect("ask Citus");
    assert!(!distributed, "pglimit_audit stays a local table");
    sqlx::query("INSERT INTO pglimit_audit (at, actor, action, target) VALUES (now() - interval '100 days', 'x', 'block', $1)")
        .bind(unique("old"))
        .execute(&pool)
        .await
        .expect("an old row");
    let store = pglimit::storage::PgStore::connect(&url, common::store_options(Default::default()))
        .await
        .expect("connect");
    store.cleanup().await.expect("a cleanup");
    let (old,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pglimit_audit WHERE at < now() - interval '90 days'")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(old, 0, "the cleanup deleted the row past retention");
    common::call(&app, "DELETE", "/admin/blocks", target).await;
}
