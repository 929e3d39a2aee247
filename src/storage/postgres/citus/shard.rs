//! The single node's one-bucket upsert (`upsert.sql`) written for one
//! shard: its statements name the shard's tables and route, so that a
//! worker plans them once per connection and keeps the plan, where the
//! route function plans its dynamic statements on every call.
//!
//! The text is derived from `upsert.sql`, not written twice: each rewrite
//! below must match exactly once, and a test checks that they all do. The
//! statement first locks the shard as `pglimit_check_node` does
//! (`pglimit_lock_shard`, in an InitPlan that runs before any row is
//! written), so a shard move waits for it, and a call that finds the shard
//! gone fails with the same serialization error.

use crate::storage::postgres::upsert::ONE_BUCKET_UPSERT;

/// A route's shards, as the coordinator names them.
#[derive(Debug, Clone)]
pub(in crate::storage::postgres) struct Shard {
    pub route: i32,
    pub buckets: i64,
    pub buckets_name: String,
    pub blocks_name: String,
}

/// What `upsert.sql` says of the single node's tables, and what it says on
/// `shard`'s: the shard's own tables, its route in every key, and the lock.
fn rewrites(shard: &Shard) -> [(&'static str, String); 5] {
    let Shard { route, buckets, buckets_name, blocks_name } = shard;
    [
        ("FROM pglimit_blocks k\n    WHERE k.key", format!("FROM {blocks_name} k\n    WHERE k.route = {route} AND k.key")),
        (
            "INSERT INTO pglimit_buckets AS b (key, count, expires_at, prev_count)\n    SELECT key,",
            format!("INSERT INTO {buckets_name} AS b (route, key, count, expires_at, prev_count)\n    SELECT {route}, key,"),
        ),
        ("WHERE cost <= lim AND", format!("WHERE (SELECT pglimit_lock_shard({buckets})) IS NOT NULL AND cost <= lim AND")),
        ("ON CONFLICT (key)", "ON CONFLICT (route, key)".to_owned()),
        (
            "FROM pglimit_buckets s WHERE u.key IS NULL AND s.key",
            format!("FROM {buckets_name} s WHERE u.key IS NULL AND s.route = {route} AND s.key"),
        ),
    ]
}

/// The one-bucket upsert on `shard`; an error names a rewrite that no
/// longer matches `upsert.sql` exactly once.
pub(super) fn one_bucket_upsert(shard: &Shard) -> Result<String, String> {
    let mut sql = ONE_BUCKET_UPSERT.to_owned();
    for (single, on_shard) in rewrites(shard) {
        if sql.matches(single).count() != 1 {
            return Err(format!("upsert.sql no longer has `{single}` once"));
        }
        sql = sql.replace(single, &on_shard);
    }
    if sql.contains("pglimit_buckets ") || sql.contains("pglimit_blocks ") {
        return Err("upsert.sql names a table the rewrites leave unchanged".into());
    }
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_bucket_upsert_is_written_for_a_shard_with_every_table_and_key_routed() {
        let shard = Shard {
            route: 7,
            buckets: 102_008,
            buckets_name: "pglimit_buckets_102008".into(),
            blocks_name: "pglimit_blocks_102013".into(),
        };
        let sql = one_bucket_upsert(&shard).expect("every rewrite matches");
        assert!(sql.contains("INSERT INTO pglimit_buckets_102008 AS b (route, key,"), "{sql}");
        assert!(sql.contains("SELECT 7, key,"), "{sql}");
        assert!(sql.contains("(SELECT pglimit_lock_shard(102008)) IS NOT NULL"), "{sql}");
        assert!(sql.contains("ON CONFLICT (route, key)"), "{sql}");
        assert_eq!(sql.matches("route = 7 AND").count(), 2, "blocks and the denied row's read: {sql}");
    }
}
