//! The single node's fixed-window upserts (`upsert.sql`, `hot_upsert.sql`,
//! `policy_upsert.sql`) and cleanup written for one shard: their slots
//! ([`template`]) filled with the shard's tables and route, so that a
//! worker plans them once per connection and keeps the plans, where the
//! route function plans its dynamic statements on every call. They are the
//! segments of a worker's statement ([`super::joined`]).
//!
//! A segment writes only once `after` (an InitPlan, run before its first
//! row) has a value: once the earlier segments' rows are written and the
//! worker's statement has locked its shards as `pglimit_check_node` does
//! (`pglimit_lock_shards`, [`super::joined`]), so that a shard move waits
//! for it, and a call that finds a shard gone fails with the same
//! serialization error. The condition asks for a check of its own segment:
//! the planner runs a condition on no column before the first row, so
//! without one an empty segment would wait for the others for nothing.

use super::joined::Texts;
use crate::storage::postgres::template::{
    self, Placement, DELETE_ENDED_BLOCKS, DELETE_EXPIRED, HOT_UPSERT, ONE_BUCKET_UPSERT, POLICY_UPSERT,
};

/// A route's shards, as the coordinator names them.
#[derive(Debug, Clone)]
pub(in crate::storage::postgres) struct Shard {
    pub route: i32,
    pub buckets: i64,
    pub buckets_name: String,
    pub blocks_name: String,
}

/// What a segment waits for before it writes (see the module's doc).
const IN_TURN: &str = "(SELECT n FROM after WHERE EXISTS (SELECT FROM req)) IS NOT NULL AND ";

impl Shard {
    /// Where a statement on this shard runs; a check of several buckets
    /// goes ahead only if they fit in every segment of the worker's
    /// statement (`multi_all`, which [`super::joined`] writes), as its
    /// buckets may sit on several of the worker's shards.
    fn placement(&self) -> Placement<'_> {
        Placement {
            buckets: &self.buckets_name,
            blocks: &self.blocks_name,
            route: Some(self.route),
            in_turn: IN_TURN,
            multi: "multi_all",
        }
    }
}

/// The upserts written for one shard: `upsert.sql` (keys distinct),
/// `hot_upsert.sql` (a key's alike checks as one row) and
/// `policy_upsert.sql` (checks of several buckets).
pub(super) fn upserts(shard: &Shard) -> Result<Texts, String> {
    let placement = shard.placement();
    Ok(Texts {
        one: template::fill("upsert.sql", ONE_BUCKET_UPSERT, &placement)?,
        hot: template::fill("hot_upsert.sql", HOT_UPSERT, &placement)?,
        policy: template::fill("policy_upsert.sql", POLICY_UPSERT, &placement)?,
        shards: vec![shard.buckets],
    })
}

/// The single node's deletes of expired rows and ended blocks on `shard`,
/// as one statement that returns how many rows it deleted. A worker keeps
/// its plan, where the route function plans its deletes on every call. A
/// shard holds one route's rows, so they are found by their end alone and
/// deleted by their primary key, `(route, key)`: with the route in the
/// condition, the planner scanned all of a shard's rows when its
/// statistics were stale. It takes no shard lock: a delete on a shard that
/// has just moved away deletes rows that no check reads.
pub(super) fn cleanup(shard: &Shard) -> Result<String, String> {
    let placement = shard.placement();
    let buckets = template::fill("DELETE_EXPIRED", DELETE_EXPIRED, &placement)?;
    let blocks = template::fill("DELETE_ENDED_BLOCKS", DELETE_ENDED_BLOCKS, &placement)?;
    Ok(format!(
        "WITH b AS ({buckets} RETURNING 1), k AS ({blocks} RETURNING 1)\n\
         SELECT (SELECT count(*) FROM b) + (SELECT count(*) FROM k)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Route 7's shards, as the coordinator would name them.
    fn route_7() -> Shard {
        Shard {
            route: 7,
            buckets: 102_008,
            buckets_name: "pglimit_buckets_102008".into(),
            blocks_name: "pglimit_blocks_102013".into(),
        }
    }

    #[test]
    fn every_upsert_is_written_for_a_shard_with_every_table_and_key_routed() {
        let shard = route_7();
        let texts = upserts(&shard).expect("every slot filled");
        assert_eq!(texts.shards, [102_008]);
        for sql in [&texts.one, &texts.hot, &texts.policy] {
            assert!(sql.contains("INSERT INTO pglimit_buckets_102008 AS b (route, key,"), "{sql}");
            assert!(sql.contains("SELECT 7, key,"), "{sql}");
            let locked = "(SELECT n FROM after WHERE EXISTS (SELECT FROM req)) IS NOT NULL AND cost <= lim";
            assert!(sql.contains(locked), "{sql}");
            assert!(sql.contains("ON CONFLICT (route, key)"), "{sql}");
            assert!(sql.contains("k.route = 7 AND k.key"), "blocks: {sql}");
        }
        for sql in [&texts.one, &texts.hot] {
            assert_eq!(sql.matches("route = 7 AND").count(), 2, "blocks and the denied row's read: {sql}");
        }
        assert_eq!(texts.policy.matches("route = 7 AND").count(), 3, "blocks, the snapshot, the denied row");
        assert!(texts.policy.contains("FROM multi_all GROUP BY chk"), "{}", texts.policy);
    }

    #[test]
    fn the_cleanup_is_written_for_a_shard_with_both_deletes_by_primary_key() {
        let shard = route_7();
        let sql = cleanup(&shard).expect("every slot filled");
        for table in ["pglimit_buckets_102008", "pglimit_blocks_102013"] {
            assert!(sql.contains(&format!("DELETE FROM {table} WHERE (route, key) IN (")), "{sql}");
            assert!(sql.contains(&format!("SELECT route, key FROM {table} WHERE ")), "{sql}");
        }
        assert!(sql.contains("expires_at <= now()") && sql.contains("until <= now()"), "{sql}");
        assert!(sql.ends_with("SELECT (SELECT count(*) FROM b) + (SELECT count(*) FROM k)"), "{sql}");
    }
}
