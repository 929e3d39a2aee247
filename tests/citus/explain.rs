//! Explain in Citus mode: the coordinator reads each bucket's row and block
//! on whatever shard holds it, and the answer foretells the next check.

use axum::http::StatusCode;
use serde_json::json;

use crate::common::{call, check, login, unique};
use crate::{three_instances, ALGORITHMS};

#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn explain_reads_rows_and_blocks_on_every_shard_and_foretells_the_check() {
    let apps = three_instances().await;
    for algorithm in ALGORITHMS {
        // Keys of their own land on shards of their own.
        for n in 0..8 {
            let body = json!({ "key": unique(&format!("{algorithm}-{n}")), "limit": 2, "window": "1h", "algorithm": algorithm });
            assert_eq!(check(&apps[n % 3], body.clone()).await.status, StatusCode::OK);
            let told = call(&apps[(n + 1) % 3], "POST", "/admin/explain", body.clone()).await;
            assert_eq!(told.status, StatusCode::OK, "{}", told.body);
            assert_eq!(told.body["store"], "postgres", "{}", told.body);
            assert_eq!(told.body["buckets"][0]["remaining"], 1, "{algorithm}: {}", told.body);
            assert_eq!(told.body["allowed"], true);
            assert_eq!(check(&apps[n % 3], body.clone()).await.status, StatusCode::OK);
            let told = call(&apps[(n + 2) % 3], "POST", "/admin/explain", body.clone()).await;
            assert_eq!(told.body["reason"], "denied", "{algorithm}: {}", told.body);
            assert_eq!(check(&apps[n % 3], body).await.status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    let alice = login(&format!("{}@example.com", unique("alice")), "198.51.100.23");
    let target = json!({ "policy": "login", "identifiers": { "email": alice["identifiers"]["email"] }, "for": "10m", "reason": "chargeback" });
    assert_eq!(call(&apps[0], "POST", "/admin/blocks", target.clone()).await.status, StatusCode::OK);
    let told = call(&apps[1], "POST", "/admin/explain", alice.clone()).await;
    assert_eq!(told.body["reason"], "blocked", "{}", told.body);
    assert_eq!(told.body["buckets"][2]["block"]["reason"], "chargeback", "{}", told.body);
    assert_eq!(call(&apps[0], "DELETE", "/admin/blocks", target).await.status, StatusCode::OK);
    assert_eq!(call(&apps[2], "POST", "/admin/explain", alice).await.body["reason"], "allowed");
}
