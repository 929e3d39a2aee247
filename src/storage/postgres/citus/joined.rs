//! One statement for all of a worker's shards: each shard's upsert
//! ([`super::shard`]) as a segment of one `WITH`, their answers as one
//! `UNION ALL`. A worker's batch then costs one statement and one commit
//! however many of its shards it touches, where a statement per shard cost
//! each its own (docs/scaling.md, "Design").
//!
//! Segment `i` has its own names (`req_i`, `up_i`, ...) and arguments: `$1`
//! is the clock of every segment, then come each segment's own (keys,
//! limits, ...: [`Numbering`]), the last of them the number of buckets
//! before its own, added to its positions. A shard with no checks is given
//! empty arrays: its segment writes nothing and takes no lock. A check's
//! buckets on several shards sit in several segments; `policy_upsert.sql`'s
//! segments decide together whether each such check fits (`multi_all`).
//!
//! Rows are locked shard by shard in the segments' order (the workers'
//! routes ascending), as `pglimit_check_node` does: segment `i` writes only
//! after `after_i` has read every earlier segment's upsert to its end, so
//! no part of an earlier shard is written after a later one, whatever plan
//! runs the `UNION ALL`. Before any of them, `after_0` locks the shards of
//! the segments with checks against a shard move, in one call for all
//! (`pglimit_lock_shards`: a PL/pgSQL call a segment was a ninth of a
//! worker's CPU).

use std::fmt::Write;

/// The names a segment gives its common table expressions; renamed per segment.
const NAMES: [&str; 8] = ["clock", "req", "grp", "blk", "multi", "snap", "up", "after"];

/// Where a shard's statement turns from its `WITH` to its answers.
const ANSWERS: &str = "\nSELECT r.pos AS o_pos";

/// How a shard's statement numbers its arguments: `$clock` is the clock,
/// shared by the segments, and the others, `$1` to `$last`, are each
/// segment's own; a segment's last argument is the offset of its positions.
#[derive(Debug, Clone, Copy)]
pub(in crate::storage::postgres) struct Numbering {
    pub clock: usize,
    pub last: usize,
}

/// `upsert.sql` and `hot_upsert.sql`: keys, limits, windows, costs, clock.
pub(in crate::storage::postgres) const ONE_BUCKET: Numbering = Numbering { clock: 5, last: 5 };

/// `policy_upsert.sql`: checks, keys, limits, windows, costs, clock,
/// algorithms, sizes.
pub(in crate::storage::postgres) const POLICY: Numbering = Numbering { clock: 6, last: 8 };

impl Numbering {
    /// Segment `i`'s number for the shard's argument `n`.
    fn of(self, n: usize, i: usize) -> usize {
        match n.cmp(&self.clock) {
            std::cmp::Ordering::Equal => 1,
            std::cmp::Ordering::Less => 1 + self.last * i + n,
            std::cmp::Ordering::Greater => self.last * i + n,
        }
    }

    /// Segment `i`'s offset: its last argument.
    fn offset(self, i: usize) -> usize {
        1 + self.last * (i + 1)
    }
}

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

/// One statement in each form: `one` of `upsert.sql`, `hot` of
/// `hot_upsert.sql` (which, a key once, answers as `upsert.sql`) and
/// `policy` of `policy_upsert.sql`.
#[derive(Debug)]
pub(in crate::storage::postgres) struct Texts {
    pub one: String,
    pub hot: String,
    pub policy: String,
    /// The shards it writes (their `pglimit_buckets` shard ids), one a segment.
    pub shards: Vec<i64>,
}

impl WorkerUpserts {
    /// The statements of the shards whose upserts are `shards`, in route order.
    pub(super) fn of(routes: Vec<i32>, shards: &[&Texts]) -> Result<Self, String> {
        let texts = |shards: &[&Texts]| -> Result<Texts, String> {
            let form = |f: fn(&Texts) -> &String| shards.iter().map(|t| f(t).as_str()).collect::<Vec<_>>();
            let locks: Vec<i64> = shards.iter().flat_map(|t| t.shards.iter().copied()).collect();
            Ok(Texts {
                one: joined(&form(|t| &t.one), &locks, ONE_BUCKET)?,
                hot: joined(&form(|t| &t.hot), &locks, ONE_BUCKET)?,
                policy: joined(&form(|t| &t.policy), &locks, POLICY)?,
                shards: locks,
            })
        };
        let each = shards.iter().map(|shard| texts(std::slice::from_ref(shard))).collect::<Result<_, _>>()?;
        Ok(WorkerUpserts { routes, all: texts(shards)?, each })
    }
}

/// The shards' statements (each written by `super::shard` for one shard,
/// in lock order, shard `locks[i]` for `shards[i]`) joined into one; an
/// error names what no longer has the expected shape. Each segment's
/// expressions that read its arguments and the snapshot only come first,
/// then `multi_all` (every segment's checks of several buckets, when the
/// form has them), the lock, then each segment's upsert in lock order.
pub(super) fn joined(shards: &[&str], locks: &[i64], numbering: Numbering) -> Result<String, String> {
    if shards.len() != locks.len() {
        return Err(format!("{} shards' statements for {} shards", shards.len(), locks.len()));
    }
    let mut ctes = Vec::new();
    let (mut upserts, mut multi, mut answers) = (Vec::new(), Vec::new(), Vec::new());
    for (i, sql) in shards.iter().enumerate() {
        let sql = renamed(&without_comments(sql), i, numbering);
        let split = sql.find(ANSWERS).ok_or("a shard's upsert has no answers (`SELECT r.pos AS o_pos`)")?;
        let (with, select) = sql.split_at(split);
        let with = with.trim().strip_prefix("WITH ").ok_or("a shard's upsert does not begin with WITH")?;
        if !with.contains(&format!("FROM after_{i}")) {
            return Err("a shard's upsert does not wait for the shards before (`FROM after`)".into());
        }
        let turn = [format!(" snap_{i} AS ("), format!(" up_{i} AS (")].iter().find_map(|cte| with.find(cte));
        let (reads, upsert) = with.split_at(turn.ok_or("a shard's upsert has no `up`")? + 1);
        ctes.push(reads.trim_end().trim_end_matches(',').to_owned());
        let next = i + 1;
        upserts.push(format!(
            "{upsert},\nafter_{next} AS (SELECT n + (SELECT count(*) FROM up_{i}) AS n FROM after_{i})"
        ));
        if with.contains(&format!("multi_{i} AS")) {
            multi.push(format!("SELECT chk, fits FROM multi_{i}"));
        }
        let offset = numbering.offset(i);
        let select =
            select.replacen(ANSWERS.trim_start(), &format!("SELECT r.pos + ${offset}::integer AS o_pos"), 1);
        answers.push(format!("({})", select.trim()));
    }
    if !multi.is_empty() {
        ctes.push(format!("multi_all AS ({})", multi.join(" UNION ALL ")));
    }
    ctes.push(lock(locks));
    ctes.extend(upserts);
    Ok(format!("WITH {}\n{}", ctes.join(",\n"), answers.join("\nUNION ALL\n")))
}

/// `after_0`: the shards of the segments with checks, locked in one call
/// and in shard order (the lock is taken only when a segment reads it).
fn lock(locks: &[i64]) -> String {
    let mut segments: Vec<(i64, usize)> = locks.iter().copied().zip(0..).collect();
    segments.sort_unstable();
    let shards: Vec<String> = segments
        .into_iter()
        .map(|(shard, i)| format!("CASE WHEN EXISTS (SELECT FROM req_{i}) THEN {shard} END"))
        .collect();
    format!("after_0 AS (SELECT pglimit_lock_shards(ARRAY[{}]::bigint[]) AS n)", shards.join(", "))
}

fn without_comments(sql: &str) -> String {
    sql.lines().filter(|line| !line.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n")
}

/// `sql` with segment `i`'s names and arguments: each of [`NAMES`] as a
/// word gets `_i`, and each `$n` becomes segment `i`'s number for it.
fn renamed(sql: &str, i: usize, numbering: Numbering) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
        out.push_str(&rest[..start]);
        let word = &rest[start..];
        let body =
            word[1..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(word.len(), |e| e + 1);
        let (token, after) = word.split_at(body);
        match token.strip_prefix('$').map(str::parse::<usize>) {
            Some(Ok(n)) => {
                let _ = write!(out, "${}", numbering.of(n, i));
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
        let sql = renamed(SHARD, 2, ONE_BUCKET);
        assert!(sql.contains("WITH req_2 AS (SELECT $12::bytea[] AS key, $1 AS at), up_2 AS ("), "{sql}");
        assert!(sql.contains("FROM req_2 WHERE (SELECT lock(1) FROM after_2)"), "{sql}");
        assert!(sql.contains("r.upkeep FROM req_2 r LEFT JOIN up_2 u"), "only whole words: {sql}");
    }

    #[test]
    fn shards_are_joined_in_order_each_locked_after_the_ones_before() {
        let sql = joined(&[SHARD, SHARD], &[102_010, 102_008], ONE_BUCKET).expect("the shape is known");
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
        let lock = "after_0 AS (SELECT pglimit_lock_shards(ARRAY[CASE WHEN EXISTS (SELECT FROM req_1) THEN 102008 END, \
                    CASE WHEN EXISTS (SELECT FROM req_0) THEN 102010 END]::bigint[]) AS n)";
        assert!(sql.contains(lock), "each segment's shard if it has checks, in shard order: {sql}");
        assert!(sql.find(lock) > sql.find("req_1 AS ("), "after every segment's arguments: {sql}");
        assert!(sql.find(lock) < sql.find("up_0 AS ("), "before any write: {sql}");
    }

    #[test]
    fn every_upsert_of_two_real_shards_joins_with_every_name_and_argument_its_own() {
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
        let upserts = WorkerUpserts::of(vec![1, 3], &[&a, &b]).expect("joined");
        for sql in [&upserts.all.one, &upserts.all.hot] {
            assert!(sql.contains("INSERT INTO pglimit_buckets_102010 AS b (route, key,"), "{sql}");
            assert!(sql.contains("(SELECT n FROM after_1 WHERE EXISTS (SELECT FROM req_1))"), "{sql}");
            assert!(sql.contains("THEN 102008 END, CASE WHEN EXISTS (SELECT FROM req_1) THEN 102010 END]"));
            assert!(sql.contains("unnest($7::bytea[], $8::bigint[], $9::bigint[], $10::bigint[])"), "{sql}");
            assert!(sql.contains("$11::integer AS o_pos") && !sql.contains("$12"), "{sql}");
            let clock = !sql.contains("$5::timestamptz") && !sql.contains("$10::timestamptz");
            assert!(
                clock && sql.contains("coalesce($1::timestamptz, now())"),
                "the clock is $1 in both: {sql}"
            );
        }
        let policy = &upserts.all.policy;
        let unnest = "unnest($10::integer[], $11::bytea[], $12::bigint[], $13::bigint[], $14::bigint[], \
                      $15::smallint[], $16::integer[])";
        assert!(policy.contains(unnest), "the second segment's arguments: {policy}");
        assert!(policy.contains("$17::integer AS o_pos") && !policy.contains("$18"), "{policy}");
        let at = |cte: &str| policy.find(cte).unwrap_or_else(|| panic!("{cte} in {policy}"));
        assert!(at("multi_1 AS") < at("multi_all AS (") && at("multi_all AS (") < at("\nsnap_0 AS ("));
        assert_eq!(policy.matches("FROM multi_all GROUP BY chk").count(), 2, "both segments' checks");
        assert_eq!(upserts.each.len(), 2);
        assert_eq!(
            (&upserts.all.shards[..], &upserts.each[1].shards[..]),
            (&[102_008, 102_010][..], &[102_010][..])
        );
        assert!(
            upserts.each[1].one.contains("pglimit_buckets_102010") && !upserts.each[1].one.contains("102008")
        );
    }

    #[test]
    fn a_statement_of_another_shape_is_refused_with_what_it_lacks() {
        let unlocked = SHARD.replace("FROM after", "");
        assert!(
            joined(&[&unlocked], &[1], ONE_BUCKET).is_err_and(|e| e.contains("wait for the shards before"))
        );
        assert!(joined(&["SELECT 1"], &[1], ONE_BUCKET).is_err_and(|e| e.contains("no answers")));
        assert!(
            joined(&[SHARD], &[1, 2], ONE_BUCKET).is_err_and(|e| e.contains("1 shards' statements for 2"))
        );
    }
}
