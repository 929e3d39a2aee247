//! The single node's fixed-window upserts (`upsert.sql`, `hot_upsert.sql`,
//! `policy_upsert.sql`) written for one shard: they name the shard's tables and route, so that a
//! worker plans them once per connection and keeps the plans, where the
//! route function plans its dynamic statements on every call. They are the
//! segments of a worker's statement ([`super::joined`]).
//!
//! The texts are derived from the single node's, not written twice: each rewrite
//! below must match exactly once, and a test checks that they all do. A
//! segment writes only once `after` (an InitPlan, run before its first row)
//! has a value: once the earlier segments' rows are written and the
//! worker's statement has locked its shards as `pglimit_check_node` does
//! (`pglimit_lock_shards`, [`super::joined`]), so that a shard move waits
//! for it, and a call that finds a shard gone fails with the same
//! serialization error. The condition asks for a check of its own segment:
//! the planner runs a condition on no column before the first row, so
//! without one an empty segment would wait for the others for nothing.

use super::joined::Texts;
use crate::storage::postgres::cleanup::{DELETE_ENDED_BLOCKS, DELETE_EXPIRED};
use crate::storage::postgres::upsert::{HOT_UPSERT, ONE_BUCKET_UPSERT, POLICY_UPSERT};

/// A route's shards, as the coordinator names them.
#[derive(Debug, Clone)]
pub(in crate::storage::postgres) struct Shard {
    pub route: i32,
    pub buckets: i64,
    pub buckets_name: String,
    pub blocks_name: String,
}

/// What the upserts say of the single node's tables, and what they say on
/// `shard`'s: the shard's own tables, its route in every key, and the lock.
fn rewrites(shard: &Shard) -> [(&'static str, String); 5] {
    let Shard { route, buckets_name, blocks_name, .. } = shard;
    [
        (
            "FROM pglimit_blocks k\n    WHERE k.key",
            format!("FROM {blocks_name} k\n    WHERE k.route = {route} AND k.key"),
        ),
        ("INSERT INTO pglimit_buckets AS b (key,", format!("INSERT INTO {buckets_name} AS b (route, key,")),
        ("\n    SELECT key,", format!("\n    SELECT {route}, key,")),
        (
            "WHERE cost <= lim AND",
            "WHERE (SELECT n FROM after WHERE EXISTS (SELECT FROM req)) IS NOT NULL AND cost <= lim AND"
                .to_owned(),
        ),
        ("ON CONFLICT (key)", "ON CONFLICT (route, key)".to_owned()),
    ]
}

/// The one-bucket upserts' read of a denied row, on `shard`.
fn denied_read(shard: &Shard) -> Vec<(&'static str, String)> {
    let Shard { route, buckets_name, .. } = shard;
    vec![(
        "FROM pglimit_buckets s WHERE u.key IS NULL AND s.key",
        format!("FROM {buckets_name} s WHERE u.key IS NULL AND s.route = {route} AND s.key"),
    )]
}

/// The policy upsert's reads on `shard`; and a check of several buckets
/// goes ahead only if they all fit in every segment of the worker's
/// statement (`multi_all`, which [`super::joined`] writes), as its buckets
/// may sit on several of the worker's shards.
fn policy_reads(shard: &Shard) -> Vec<(&'static str, String)> {
    let Shard { route, buckets_name, .. } = shard;
    vec![
        (
            "FROM pglimit_buckets s WHERE s.key = r.key",
            format!("FROM {buckets_name} s WHERE s.route = {route} AND s.key = r.key"),
        ),
        (
            "LEFT JOIN pglimit_buckets s ON s.key = r.key",
            format!("LEFT JOIN {buckets_name} s ON s.route = {route} AND s.key = r.key"),
        ),
        ("FROM multi GROUP BY chk", "FROM multi_all GROUP BY chk".to_owned()),
    ]
}

/// The upserts written for one shard: `upsert.sql` (keys distinct),
/// `hot_upsert.sql` (a key's alike checks as one row) and
/// `policy_upsert.sql` (checks of several buckets); an error names a
/// rewrite that no longer matches a statement exactly once.
pub(super) fn upserts(shard: &Shard) -> Result<Texts, String> {
    let on_shard = |name: &str, single: &str, own: Vec<(&str, String)>| {
        rewritten(name, single, rewrites(shard).into_iter().chain(own))
    };
    Ok(Texts {
        one: on_shard("upsert.sql", ONE_BUCKET_UPSERT, denied_read(shard))?,
        hot: on_shard("hot_upsert.sql", HOT_UPSERT, denied_read(shard))?,
        policy: on_shard("policy_upsert.sql", POLICY_UPSERT, policy_reads(shard))?,
        shards: vec![shard.buckets],
    })
}

/// The single node's deletes of expired rows and ended blocks
/// (`cleanup.rs`) on `shard`, as one statement that returns how many rows it
/// deleted. A worker keeps its plan, where the route function plans its
/// deletes on every call. A shard holds one route's rows, so they are found
/// by their end alone and deleted by their primary key, `(route, key)`: with
/// the route in the condition, the planner scanned all of a shard's rows
/// when its statistics were stale (0.24 against 0.06 ms with none to
/// delete). It takes no shard lock: a delete on a shard that has just moved
/// away deletes rows that no check reads.
pub(super) fn cleanup(shard: &Shard) -> Result<String, String> {
    let Shard { buckets_name, blocks_name, .. } = shard;
    let routed = |table: &str, name: &str| {
        [
            (
                format!("DELETE FROM {table} WHERE key IN ("),
                format!("DELETE FROM {name} WHERE (route, key) IN ("),
            ),
            (format!("SELECT key FROM {table} WHERE"), format!("SELECT route, key FROM {name} WHERE")),
        ]
    };
    let buckets = rewritten("DELETE_EXPIRED", DELETE_EXPIRED, routed("pglimit_buckets", buckets_name))?;
    let blocks =
        rewritten("DELETE_ENDED_BLOCKS", DELETE_ENDED_BLOCKS, routed("pglimit_blocks", blocks_name))?;
    Ok(format!(
        "WITH b AS ({buckets} RETURNING 1), k AS ({blocks} RETURNING 1)\n\
         SELECT (SELECT count(*) FROM b) + (SELECT count(*) FROM k)"
    ))
}

/// `single` with each `(from, to)` of `rewrites` made; an error names a
/// rewrite that no longer matches exactly once, or a table left unrouted.
fn rewritten<F: AsRef<str>>(
    name: &str,
    single: &str,
    rewrites: impl IntoIterator<Item = (F, String)>,
) -> Result<String, String> {
    let mut sql = single.to_owned();
    for (from, to) in rewrites {
        let from = from.as_ref();
        if sql.matches(from).count() != 1 {
            return Err(format!("{name} no longer has `{from}` once"));
        }
        sql = sql.replace(from, &to);
    }
    if sql.contains("pglimit_buckets ") || sql.contains("pglimit_blocks ") {
        return Err(format!("{name} names a table the rewrites leave unchanged"));
    }
    Ok(sql)
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
        let texts = upserts(&shard).expect("every rewrite matches");
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
        let sql = cleanup(&shard).expect("every rewrite matches");
        for table in ["pglimit_buckets_102008", "pglimit_blocks_102013"] {
            assert!(sql.contains(&format!("DELETE FROM {table} WHERE (route, key) IN (")), "{sql}");
            assert!(sql.contains(&format!("SELECT route, key FROM {table} WHERE ")), "{sql}");
        }
        assert!(sql.contains("expires_at <= now()") && sql.contains("until <= now()"), "{sql}");
        assert!(sql.ends_with("SELECT (SELECT count(*) FROM b) + (SELECT count(*) FROM k)"), "{sql}");
    }
}
