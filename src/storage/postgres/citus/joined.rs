//! One statement for all of a worker's shards: each shard's upsert
//! ([`super::shard`]) as a segment of one `WITH`, their answers as one
//! `UNION ALL`. A worker's batch then costs one statement and one commit
//! however many of its shards it touches, where a statement per shard cost
//! each its own (docs/scaling.md, "Design").
//!
//! Segment `i` has its own names (`req_i`, `up_i`, ...) and arguments: `$1`
//! is the clock of every segment; the shard's keys, limits, windows and
//! costs are `$5i+2` to `$5i+5`, and `$5i+6` is the number of checks before
//! its own, added to its positions. A shard with no checks is given empty
//! arrays: its segment writes nothing and takes no lock.
//!
//! Rows are locked shard by shard in the segments' order (the workers'
//! routes ascending), as `pglimit_check_node` does: segment `i` takes its
//! shard's lock only after `after_i` has read every earlier segment's
//! upsert to its end, so no part of an earlier shard is written after a
//! later one, whatever plan runs the `UNION ALL`.

use std::fmt::Write;

/// The names a segment gives its common table expressions; renamed per segment.
const NAMES: [&str; 5] = ["req", "grp", "blk", "up", "after"];

/// Where a shard's statement turns from its `WITH` to its answers.
const ANSWERS: &str = "\nSELECT r.pos AS o_pos";

/// The arguments of each segment, besides the shared clock.
const PER_SEGMENT: usize = 5;

/// A worker's statements: `routes` are its shards' routes in the segments'
/// order; `all` joins every shard's upserts, `each[i]` is shard `i`'s
/// alone, for a batch on that shard only (a hot key's, say), to which the
/// other shards' empty segments would only add cost.
#[derive(Debug)]
pub(in crate::storage::postgres) struct WorkerUpserts {
    pub routes: Vec<i32>,
    pub all: Texts,
    pub each: Vec<Texts>,
}

/// One statement in both forms: `one` joins the shards' `upsert.sql` and
/// `hot` their `hot_upsert.sql` (which, a key once, answers as `upsert.sql`).
#[derive(Debug)]
pub(in crate::storage::postgres) struct Texts {
    pub one: String,
    pub hot: String,
}

impl WorkerUpserts {
    /// The statements of the shards whose upserts are `shards` (one, hot),
    /// in route order.
    pub(super) fn of(routes: Vec<i32>, shards: &[(&str, &str)]) -> Result<Self, String> {
        let texts = |shards: &[(&str, &str)]| -> Result<Texts, String> {
            let (one, hot): (Vec<&str>, Vec<&str>) = shards.iter().copied().unzip();
            Ok(Texts { one: joined(&one)?, hot: joined(&hot)? })
        };
        let each = shards.iter().map(|shard| texts(std::slice::from_ref(shard))).collect::<Result<_, _>>()?;
        Ok(WorkerUpserts { routes, all: texts(shards)?, each })
    }
}

/// The shards' statements (each written by `super::shard` for one shard,
/// in lock order) joined into one; an error names what no longer has the
/// expected shape.
pub(super) fn joined(shards: &[&str]) -> Result<String, String> {
    let mut ctes = String::from("WITH after_0 AS (SELECT 0::bigint AS n)");
    let mut answers = Vec::with_capacity(shards.len());
    for (i, sql) in shards.iter().enumerate() {
        let sql = renamed(&without_comments(sql), i);
        let split = sql.find(ANSWERS).ok_or("a shard's upsert has no answers (`SELECT r.pos AS o_pos`)")?;
        let (with, select) = sql.split_at(split);
        let with = with.trim().strip_prefix("WITH ").ok_or("a shard's upsert does not begin with WITH")?;
        if !with.contains(&format!("FROM after_{i}")) {
            return Err("a shard's upsert does not lock its shard after the shards before".into());
        }
        let offset = PER_SEGMENT * i + 6;
        let select = select.replacen(
            "SELECT r.pos AS o_pos",
            &format!("SELECT r.pos + ${offset}::integer AS o_pos"),
            1,
        );
        let next = i + 1;
        let _ = write!(
            ctes,
            ",\n{with},\nafter_{next} AS (SELECT n + (SELECT count(*) FROM up_{i}) AS n FROM after_{i})"
        );
        answers.push(format!("({})", select.trim()));
    }
    Ok(format!("{ctes}\n{}", answers.join("\nUNION ALL\n")))
}

fn without_comments(sql: &str) -> String {
    sql.lines().filter(|line| !line.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n")
}

/// `sql` with segment `i`'s names and arguments: each of [`NAMES`] as a
/// word gets `_i`, `$5` (the clock) becomes `$1` and `$n` (n from 1 to 4)
/// becomes `$5i+1+n`.
fn renamed(sql: &str, i: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
        out.push_str(&rest[..start]);
        let word = &rest[start..];
        let body =
            word[1..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(word.len(), |e| e + 1);
        let (token, after) = word.split_at(body);
        match token.strip_prefix('$').map(str::parse::<usize>) {
            Some(Ok(5)) => out.push_str("$1"),
            Some(Ok(n)) => {
                let _ = write!(out, "${}", PER_SEGMENT * i + 1 + n);
            }
            _ if NAMES.contains(&token) => {
                let _ = write!(out, "{token}_{i}");
            }
            _ => out.push_str(token),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARD: &str = "-- a comment naming req\nWITH req AS (SELECT $1::bytea[] AS key, $5 AS at), up AS (\n    \
                         INSERT INTO t SELECT key FROM req WHERE (SELECT lock(1) FROM after) IS NOT NULL RETURNING key\n)\n\
                         SELECT r.pos AS o_pos, r.upkeep FROM req r LEFT JOIN up u ON u.key = r.key ORDER BY r.pos";

    #[test]
    fn each_segment_gets_its_own_names_and_arguments_and_shares_the_clock() {
        let sql = renamed(SHARD, 2);
        assert!(sql.contains("WITH req_2 AS (SELECT $12::bytea[] AS key, $1 AS at), up_2 AS ("), "{sql}");
        assert!(sql.contains("FROM req_2 WHERE (SELECT lock(1) FROM after_2)"), "{sql}");
        assert!(sql.contains("r.upkeep FROM req_2 r LEFT JOIN up_2 u"), "only whole words: {sql}");
    }

    #[test]
    fn shards_are_joined_in_order_each_locked_after_the_ones_before() {
        let sql = joined(&[SHARD, SHARD]).expect("the shape is known");
        assert!(!sql.contains("a comment"), "{sql}");
        assert_eq!(sql.matches("WITH").count(), 1, "{sql}");
        assert!(
            sql.contains("after_1 AS (SELECT n + (SELECT count(*) FROM up_0) AS n FROM after_0)"),
            "{sql}"
        );
        assert!(
            sql.contains("after_2 AS (SELECT n + (SELECT count(*) FROM up_1) AS n FROM after_1)"),
            "{sql}"
        );
        assert!(sql.contains("(SELECT r.pos + $6::integer AS o_pos"), "{sql}");
        assert!(sql.contains("\nUNION ALL\n(SELECT r.pos + $11::integer AS o_pos"), "{sql}");
        assert!(sql.contains("$7::bytea[]"), "the second segment's keys: {sql}");
    }

    #[test]
    fn both_upserts_of_two_real_shards_join_with_every_name_and_argument_their_own() {
        let shard = |route: i32, id: i64| super::super::shard::Shard {
            route,
            buckets: id,
            buckets_name: format!("pglimit_buckets_{id}"),
            blocks_name: format!("pglimit_blocks_{}", id + 5),
        };
        let (a, b) = (
            super::super::shard::upserts(&shard(1, 102_008)),
            super::super::shard::upserts(&shard(3, 102_010)),
        );
        let (a, b) = (a.expect("shard 1"), b.expect("shard 3"));
        let upserts = WorkerUpserts::of(vec![1, 3], &[(&a.one, &a.hot), (&b.one, &b.hot)]).expect("joined");
        for sql in [&upserts.all.one, &upserts.all.hot] {
            assert!(sql.contains("INSERT INTO pglimit_buckets_102010 AS b (route, key,"), "{sql}");
            assert!(sql.contains(
                "(SELECT pglimit_lock_shard(102010) FROM after_1 WHERE EXISTS (SELECT FROM req_1))"
            ));
            assert!(sql.contains("unnest($7::bytea[], $8::bigint[], $9::bigint[], $10::bigint[])"), "{sql}");
            assert!(sql.contains("$11::integer AS o_pos") && !sql.contains("$12"), "{sql}");
            let clock = !sql.contains("$5::timestamptz") && !sql.contains("$10::timestamptz");
            assert!(
                clock && sql.contains("coalesce($1::timestamptz, now())"),
                "the clock is $1 in both: {sql}"
            );
        }
        assert_eq!(upserts.each.len(), 2);
        assert!(
            upserts.each[1].one.contains("pglimit_buckets_102010") && !upserts.each[1].one.contains("102008")
        );
    }

    #[test]
    fn a_statement_of_another_shape_is_refused_with_what_it_lacks() {
        let unlocked = SHARD.replace("FROM after", "");
        assert!(joined(&[&unlocked]).is_err_and(|e| e.contains("lock its shard after")));
        assert!(joined(&["SELECT 1"]).is_err_and(|e| e.contains("no answers")));
    }
}
