//! The common batches as one plain multi-row upsert, no PL/pgSQL: no key
//! appears twice, every check costs at least 1, and no bucket has a lockout.
//!
//! The upsert resets an expired window or adds the cost only where it fits
//! (the conflict branch's `WHERE`), so each row is decided on its locked
//! state and a new key costs one write. A blocked key is read in the same
//! statement and left out (denied, nothing consumed). What the branch needs
//! beyond the stored row travels in the proposed row's columns that its
//! algorithm does not use (the limit, for a fixed window, in `prev_count`).
//! Rows are proposed in key order, the same lock order as the batch
//! functions.
//!
//! A denied row's figures are read from the statement's snapshot; another
//! instance may have changed the row between that snapshot and our lock, so
//! a one-bucket check's `remaining` is capped below the cost so that it
//! never contradicts the denial, and a row another instance created after
//! our snapshot (so absent from it) is reported as full. Those reads sit in
//! LATERAL subqueries that cannot be flattened (`OFFSET 0`), so that they run
//! only for denied rows: as a plain join they ran an index lookup for every
//! row.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::literal::Arg;
use super::statements::{buckets_of, fetch_rows, is_sqlstate, to_i64, Row};
use super::template;
use crate::algorithm::Algorithm;
use crate::storage::{BucketSpec, Check};

/// Every check one sliding-window, sliding-log or token bucket. A check its
/// locked row denies and the statement's snapshot admits (another instance
/// changed the row in between) raises `pglimit_retry_with_locks` too, as its
/// answer's figures come from that snapshot and would contradict the denial.
/// Faster than `pglimit_check_distinct` for each of the three
/// (`bench/results/2026-12-07-1811-ab-statement-paths.md`).
const ALGORITHMS_UPSERT: &str = include_str!("algorithms_upsert.sql");

/// Which upsert decides a batch.
#[derive(Clone, Copy)]
pub(super) enum Upsert {
    /// Every check one fixed-window bucket: the commonest batch, and the
    /// leanest statement (`upsert.sql`). Kept beside `hot_upsert.sql`, which answers such a
    /// batch alike, because it is the faster by more than 5% (and
    /// `pglimit_check_distinct` far slower):
    /// `bench/results/2026-12-07-1811-ab-statement-paths.md`.
    OneBucket,
    /// One-bucket fixed-window checks of which several share a key, each alike
    /// (a hot key, `hot_upsert.sql`): the key's checks proposed as one row, that decides how many
    /// of them fit. `pglimit_check_batch` decides such batches one bucket at a
    /// time, at two thirds of the throughput
    /// (`bench/results/2026-12-07-1811-ab-statement-paths.md`).
    HotKeys,
    /// [`ALGORITHMS_UPSERT`].
    Algorithms,
    /// Checks of several fixed-window buckets (a policy: `login` has three;
    /// `policy_upsert.sql`)
    /// among one-bucket fixed-window and token-bucket checks (a batch of
    /// token-bucket checks alone takes `Algorithms`). A check of
    /// several buckets is proposed only if every bucket fits as the statement's
    /// snapshot has it, and must then be written in every row: if another
    /// instance filled one of them between that snapshot and our lock, the
    /// statement raises `pglimit_retry_with_locks` (40001), which rolls it back
    /// whole, and the batch is decided again by `pglimit_check_distinct`, which
    /// locks before it reads. `pglimit_check_distinct` has two thirds of its
    /// throughput on `login` (`bench/results/2026-12-07-1811-ab-statement-paths.md`).
    /// The other algorithms have a statement of their own (`Algorithms`): a sliding
    /// branch here made every other check dearer (docs/performance.md).
    Policy,
}

/// How the keys of a batch repeat, which decides the statements that can
/// take it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keys {
    /// No key appears twice.
    Distinct,
    /// Some key does, and every bucket on it has the same limit, window and
    /// cost: a hot key.
    RepeatedAlike,
    /// Some key appears twice with different limits, windows or costs.
    Repeated,
}

impl Keys {
    /// How the keys of `checks`' buckets repeat.
    pub(super) fn of(checks: &[&Check]) -> Keys {
        let mut seen = HashMap::with_capacity(checks.len() * 3);
        let mut keys = Keys::Distinct;
        for (_, check, bucket) in buckets_of(checks) {
            let alike = (bucket.limit, bucket.window, check.cost);
            match seen.insert(bucket.key, alike) {
                Some(before) if before != alike => return Keys::Repeated,
                Some(_) => keys = Keys::RepeatedAlike,
                None => {}
            }
        }
        keys
    }
}

/// The upsert that decides `checks` exactly, if one does, given how their
/// `keys` repeat. A calendar window takes a batch function: the upserts
/// know only windows of a fixed length, and stay as lean as they were.
pub(super) fn choose(checks: &[&Check], keys: Keys) -> Option<Upsert> {
    // A concurrency bucket takes a lease, which only the batch functions write.
    let plain = |check: &&Check| {
        check.cost > 0
            && check
                .buckets
                .iter()
                .all(|b| b.lockout.is_none() && b.calendar.is_none() && b.algorithm != Algorithm::Concurrency)
    };
    if keys == Keys::Repeated || !checks.iter().all(plain) {
        return None;
    }
    let fixed = |check: &&Check| check.buckets.iter().all(|b| b.algorithm == Algorithm::FixedWindow);
    let one = |check: &&Check| check.buckets.len() == 1;
    if keys == Keys::RepeatedAlike {
        return checks.iter().all(|b| one(b) && fixed(b)).then_some(Upsert::HotKeys);
    }
    let token = |check: &&Check| one(check) && check.buckets[0].algorithm == Algorithm::TokenBucket;
    let other = |check: &&Check| one(check) && check.buckets[0].algorithm != Algorithm::FixedWindow;
    if checks.iter().all(|b| one(b) && fixed(b)) {
        Some(Upsert::OneBucket)
    } else if checks.iter().all(other) {
        Some(Upsert::Algorithms)
    } else if checks.iter().all(|b| fixed(b) || token(b)) {
        Some(Upsert::Policy)
    } else {
        None
    }
}

/// Whether `e` is `pglimit_retry_with_locks`: decide the batch again with locks.
pub(super) fn must_retry_with_locks(e: &sqlx::Error) -> bool {
    is_sqlstate(e, "40001")
}

pub(super) async fn run(
    conn: &mut PgConnection,
    upsert: Upsert,
    checks: &[&Check],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Row>, sqlx::Error> {
    let sql = match upsert {
        Upsert::OneBucket => template::single("upsert.sql")?,
        Upsert::HotKeys => template::single("hot_upsert.sql")?,
        Upsert::Algorithms => ALGORITHMS_UPSERT,
        Upsert::Policy => template::single("policy_upsert.sql")?,
    };
    fetch_rows(conn, sql, args(upsert, checks, now), None).await
}

/// The arguments of `upsert`'s upsert for `checks`.
pub(super) fn args<'a>(upsert: Upsert, checks: &'a [&'a Check], now: Option<DateTime<Utc>>) -> Vec<Arg<'a>> {
    bucket_args(upsert, buckets_of(checks), now)
}

/// [`args`] for some of a batch's buckets, each `(i, batch, bucket)` a
/// bucket of check `i`: Citus mode splits a batch by shard.
pub(super) fn bucket_args<'a>(
    upsert: Upsert,
    buckets: impl Iterator<Item = (usize, &'a Check, &'a BucketSpec)> + Clone,
    now: Option<DateTime<Utc>>,
) -> Vec<Arg<'a>> {
    let buckets = || buckets.clone();
    let keys = Arg::Bytes(buckets().map(|(_, _, b)| b.key.as_slice()).collect());
    let limits = Arg::Bigints(buckets().map(|(_, _, b)| to_i64(b.limit)).collect());
    let windows = Arg::Bigints(buckets().map(|(_, _, b)| to_i64(b.window.as_millis())).collect());
    let costs = Arg::Bigints(buckets().map(|(_, check, _)| to_i64(check.cost)).collect());
    let algorithms = || Arg::Smallints(buckets().map(|(_, _, b)| b.algorithm.code()).collect());
    match upsert {
        Upsert::OneBucket | Upsert::HotKeys => vec![keys, limits, windows, costs, Arg::Clock(now)],
        Upsert::Algorithms => vec![keys, limits, windows, costs, Arg::Clock(now), algorithms()],
        Upsert::Policy => {
            let positions = Arg::Ints(buckets().map(|(i, _, _)| i as i32).collect());
            let sizes = Arg::Ints(buckets().map(|(_, check, _)| check.buckets.len() as i32).collect());
            vec![positions, keys, limits, windows, costs, Arg::Clock(now), algorithms(), sizes]
        }
    }
}
