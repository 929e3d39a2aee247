//! Which statements decide a worker's checks in Citus mode: its shards'
//! upserts joined into one, each shard's own, or the route function.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::storage::postgres::citus::{Routes, WorkerUpserts};
use crate::storage::postgres::upsert::{self, Keys, Road};
use crate::storage::CheckBatch;

/// A statement that decides some of a worker's checks: one-bucket checks
/// as the worker's shards' upserts joined into one (`Shards::All`, each
/// segment's checks in the segments' order) or as one shard's
/// (`upsert.sql`'s, or `hot_upsert.sql`'s when a key repeats), or checks
/// through the route function.
pub(super) enum Statement {
    Upsert(Arc<WorkerUpserts>, Shards, Vec<Vec<usize>>, Road),
    Node(Vec<usize>),
}

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
            Statement::Upsert(_, _, segments, _) => segments.concat(),
            Statement::Node(members) => members.clone(),
        }
    }
}

/// A statement over all of a worker's shards is taken when at least one in
/// this many has checks: each empty segment costs its statement a few
/// relations opened and locked, and a statement per shard costs a commit.
/// With 16 shards a worker, at 8 and 32 clients: always all shards 1,800
/// and 4,800 checks/s, never 2,000 and 2,700, one in 3 2,000 and 4,100
/// (bench/results/2026-12-06-0632-ab-citus-joined.md).
pub(super) const FILLED_SHARE: usize = 3;

/// The statements that decide `members` (on one worker). On that worker's
/// own connection, when all of them are one-bucket fixed-window checks, a
/// key's checks alike: its shards' joined upsert, or each shard's own.
/// Otherwise one call of the route function, which costs about the same
/// whatever it carries.
pub(super) fn statements_of(
    routes: &Routes,
    batches: &[&CheckBatch],
    members: Vec<usize>,
    direct: Option<i32>,
) -> Vec<Statement> {
    let Some((joined, segments, road)) = segments_of(routes, batches, &members, direct) else {
        return vec![Statement::Node(members)];
    };
    let filled: Vec<usize> = (0..segments.len()).filter(|&s| !segments[s].is_empty()).collect();
    if filled.len() > 1 && filled.len() * FILLED_SHARE >= segments.len() {
        return vec![Statement::Upsert(joined, Shards::All, segments, road)];
    }
    let alone =
        |s: usize| Statement::Upsert(Arc::clone(&joined), Shards::One(s), vec![segments[s].clone()], road);
    filled.into_iter().map(alone).collect()
}

/// `members` placed in the segments of the worker's statement over its
/// shards, with the upsert they take; `None` when they need the route function.
fn segments_of(
    routes: &Routes,
    batches: &[&CheckBatch],
    members: &[usize],
    direct: Option<i32>,
) -> Option<(Arc<WorkerUpserts>, Vec<Vec<usize>>, Road)> {
    let on_worker =
        |&i: &usize| batches[i].buckets.first().is_some_and(|b| direct == Some(routes.worker(&b.key)));
    let joined = direct.and_then(|worker| routes.joined(worker)).filter(|_| members.iter().all(on_worker))?;
    // Only the one-bucket fixed-window upserts are written for the shards.
    let group: Vec<&CheckBatch> = members.iter().map(|&i| batches[i]).collect();
    let road =
        upsert::road(&group, Keys::of(&group)).filter(|r| matches!(r, Road::OneBucket | Road::HotKeys))?;
    let mut segments = vec![Vec::new(); joined.routes.len()];
    for &i in members {
        let route = routes.of(&batches[i].buckets[0].key);
        // None: a shard that came to the worker since its statement was written.
        segments[joined.routes.iter().position(|&r| r == route)?].push(i);
    }
    Some((joined, segments, road))
}

/// The batches among `members` grouped by the worker of their first bucket.
pub(super) fn by_worker(
    routes: &Routes,
    batches: &[&CheckBatch],
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
#[path = "citus_tests.rs"]
mod tests;
