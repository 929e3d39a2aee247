//! Which statements decide a worker's checks in Citus mode: its shards'
//! upserts joined into one, each shard's own, or the route function.
//! An upsert's segment (one a shard) holds the buckets of the checks on its
//! shard: a check of several buckets may have them in several segments.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Routes, WorkerUpserts};
use crate::storage::postgres::upsert::{self, Keys, Upsert};
use crate::storage::Check;

/// A statement that decides some of a worker's checks: fixed-window checks
/// as the worker's shards' upserts joined into one (`Shards::All`) or as
/// one shard's (`upsert.sql`'s, `hot_upsert.sql`'s when a key repeats,
/// `policy_upsert.sql`'s when a check has several buckets), each segment
/// the `(check, bucket)`s on its shard; or checks through the route function.
pub(super) enum Statement {
    Upsert(Arc<WorkerUpserts>, Shards, Vec<Segment>, Upsert),
    Node(Vec<usize>),
}

/// The buckets on one shard, each as (check, its bucket's index).
pub(super) type Segment = Vec<(usize, usize)>;

/// Which of a worker's statements an upsert takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shards {
    All,
    One(usize),
}

impl Statement {
    /// The checks it decides, in the order it answers them.
    pub(super) fn members(&self) -> Vec<usize> {
        match self {
            Statement::Upsert(_, _, segments, _) => checks_of(segments.iter().flatten()),
            Statement::Node(members) => members.clone(),
        }
    }
}

/// A statement over all of a worker's shards is taken when at least one in
/// this many has checks: each empty segment costs its statement a few
/// relations opened and locked, and a statement per shard costs a commit;
/// one in 3 did best of the shares measured
/// (bench/results/2026-12-06-0632-ab-citus-joined.md).
pub(super) const FILLED_SHARE: usize = 3;

/// The statements that decide `members` (on one worker). On that worker's
/// own connection, when all of them are fixed-window checks that an upsert
/// takes: its shards' joined upsert, or each shard's own when no check has
/// buckets on two of them. Otherwise one call of the route function, which
/// costs about the same whatever it carries.
pub(super) fn statements_of(
    routes: &Routes,
    batches: &[&Check],
    members: Vec<usize>,
    direct: Option<i32>,
) -> Vec<Statement> {
    let Some((joined, segments, upsert)) = segments_of(routes, batches, &members, direct) else {
        return vec![Statement::Node(members)];
    };
    let filled: Vec<usize> = (0..segments.len()).filter(|&s| !segments[s].is_empty()).collect();
    // Every member has a bucket in some segment: more checks by segment than members is a check in two.
    let spans = filled.iter().map(|&s| checks_of(segments[s].iter()).len()).sum::<usize>() > members.len();
    if filled.len() > 1 && (spans || filled.len() * FILLED_SHARE >= segments.len()) {
        return vec![Statement::Upsert(joined, Shards::All, segments, upsert)];
    }
    let alone =
        |s: usize| Statement::Upsert(Arc::clone(&joined), Shards::One(s), vec![segments[s].clone()], upsert);
    filled.into_iter().map(alone).collect()
}

/// The checks that have one of `buckets`, ascending.
fn checks_of<'a>(buckets: impl Iterator<Item = &'a (usize, usize)>) -> Vec<usize> {
    let mut checks: Vec<usize> = buckets.map(|&(i, _)| i).collect();
    checks.sort_unstable();
    checks.dedup();
    checks
}

/// The buckets of `members` placed in the segments of the worker's
/// statement over its shards, with the upsert they take; `None` when they
/// need the route function.
fn segments_of(
    routes: &Routes,
    batches: &[&Check],
    members: &[usize],
    direct: Option<i32>,
) -> Option<(Arc<WorkerUpserts>, Vec<Segment>, Upsert)> {
    let on_worker =
        |&i: &usize| batches[i].buckets.first().is_some_and(|b| direct == Some(routes.worker(&b.key)));
    let joined = direct.and_then(|worker| routes.joined(worker)).filter(|_| members.iter().all(on_worker))?;
    // Only the fixed-window upserts are written for the shards.
    let group: Vec<&Check> = members.iter().map(|&i| batches[i]).collect();
    let fixed = |r: &Upsert| !matches!(r, Upsert::Algorithms);
    let upsert = upsert::choose(&group, Keys::of(&group)).filter(fixed)?;
    let mut segments = vec![Vec::new(); joined.routes.len()];
    for &i in members {
        for (j, bucket) in batches[i].buckets.iter().enumerate() {
            let route = routes.of(&bucket.key);
            // None: a shard that came to the worker since its statement was written.
            segments[joined.routes.iter().position(|&r| r == route)?].push((i, j));
        }
    }
    Some((joined, segments, upsert))
}

/// The batches among `members` grouped by the worker of their first bucket.
pub(super) fn by_worker(
    routes: &Routes,
    batches: &[&Check],
    members: impl Iterator<Item = usize>,
) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for i in members {
        let worker = batches[i].buckets.first().map_or(0, |b| routes.worker(&b.key));
        groups.entry(worker).or_default().push(i);
    }
    groups.into_values().collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
