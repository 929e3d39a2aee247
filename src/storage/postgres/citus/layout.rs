//! The statements of Citus mode: each call confined to one worker, or to
//! one route's shard, as [`Routes`] places the keys (see [`super`]); the Citus
//! side of [`Layout`](crate::storage::postgres::layout::Layout).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::plan::{by_worker, statements_of, Segment, Shards, Statement};
use super::Routes;
use crate::storage::postgres::layout::writes::{AbsorbSql, Absorbing, Blocking};
use crate::storage::postgres::literal::Arg;
use crate::storage::postgres::statements;
use crate::storage::postgres::upsert::{self, Upsert};
use crate::storage::{Answer, BlockTarget, BucketSpec, Check, Held};

/// The batch function for buckets on one worker, given the route Citus
/// sends the call by (written into the statement, so that a generic plan
/// sends it too) and, as $11, each bucket's route. See `citus/functions.sql`.
fn check_node(route: i32) -> String {
    format!("SELECT * FROM pglimit_check_node({route}, $11, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
}

/// Gives back what one part of a denied check took; see `citus/functions.sql`.
const REFUND: &str = "SELECT pglimit_refund_node($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Both of the cleanup's deletes on one route's shard (a distributed
/// `FOR UPDATE SKIP LOCKED` is refused); each run takes the next route.
const DELETE_ON_ROUTE: &str = "SELECT pglimit_cleanup_route($1, $2::integer)";

/// An operator's block, whose row also carries its key's route ($6); the
/// update may use no `now()` of its own (Citus refuses functions that are
/// not IMMUTABLE there). Actions are rare, so they may span shards (a
/// two-phase commit).
const BLOCK_ROUTED: &str = "
INSERT INTO pglimit_blocks AS k (route, key, until, kind, policy, bucket, reason, created_at)
SELECT t.route, t.key, now() + $2 * interval '1 millisecond', 'admin', t.policy, t.bucket, $5, now()
FROM unnest($1::bytea[], $3::text[], $4::text[], $6::integer[]) AS t(key, policy, bucket, route)
ORDER BY t.route, t.key
ON CONFLICT (route, key) DO UPDATE SET until = EXCLUDED.until, kind = 'admin', policy = EXCLUDED.policy,
    bucket = EXCLUDED.bucket, reason = EXCLUDED.reason, created_at = EXCLUDED.created_at
RETURNING until";

/// The single node's write-back confined to one route ($7 in `write`, $2
/// in the others), so that each transaction is on one shard.
static ABSORB_ROUTE: AbsorbSql = AbsorbSql {
    lock: "
INSERT INTO pglimit_buckets AS t (route, key, count, expires_at)
SELECT $2, k, 0, timestamptz 'epoch' FROM unnest($1::bytea[]) AS k ORDER BY k
ON CONFLICT (route, key) DO UPDATE SET count = t.count WHERE false",
    read: "
SELECT key, count, prev_count, pglimit_us(expires_at), coalesce(tat_us, 0), coalesce(log, '{}'),
       pglimit_us(now())
FROM pglimit_buckets WHERE route = $2 AND key = ANY($1) ORDER BY key FOR UPDATE",
    write: "
UPDATE pglimit_buckets t SET
    count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt, log = s.lg::bigint[]
FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[])
     AS s(key, c, p, e, tt, lg)
WHERE t.route = $7 AND t.key = s.key",
};

/// Through the coordinator, Citus delegates a call to the worker of its
/// route only when it sees the route's value: a generic plan has a
/// parameter. Connections straight to a worker keep their generic plans.
pub(in crate::storage::postgres) async fn configure(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET plan_cache_mode = force_custom_plan").execute(conn).await?;
    Ok(())
}

/// Whether a call failed because a shard it expected had moved away: the
/// lock found it gone, or (a shard's upsert) its table is no longer here.
fn moved(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01")
        || db.code().as_deref() == Some("40001") && db.message().starts_with("pglimit: shard"))
}

/// Decides `batches` (each on a single worker, as last read), and returns
/// one answer per batch, in order. On a connection straight to worker
/// `direct`, its fixed-window checks take its shards' joined upsert, or
/// their shards' own ([`plan::FILLED_SHARE`]); the rest, one call of the
/// route function per worker.
pub(in crate::storage::postgres) async fn decide(
    conn: &mut PgConnection,
    routes: &Routes,
    batches: &[&Check],
    now: Option<DateTime<Utc>>,
    direct: Option<i32>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let mut answers: Vec<Option<Answer>> = vec![None; batches.len()];
    for members in by_worker(routes, batches, 0..batches.len()) {
        for statement in statements_of(routes, batches, members, direct) {
            let members = statement.members();
            let decided = match run(conn, routes, batches, &statement, &members, now).await {
                Err(e) if moved(&e) => resend(conn, routes, batches, &members, now).await?,
                // A policy check found a bucket filled since the snapshot: locks first, then reads.
                Err(e) if upsert::must_retry_with_locks(&e) => {
                    let answers = decide_on_worker(conn, routes, batches, &members, now, false).await?;
                    members.into_iter().zip(answers).collect()
                }
                decided => members.into_iter().zip(decided?).collect(),
            };
            for (i, answer) in decided {
                answers[i] = Some(answer);
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.ok_or_else(|| sqlx::Error::Protocol("a check was left undecided".into())))
        .collect()
}

/// How long a call keeps sending checks after their shard when a move has
/// just ended: each node sees the move's end as its part of the move's
/// two-phase commit does, so for a moment the shard may be on neither.
const MOVE_PATIENCE: Duration = Duration::from_millis(128);

/// After a shard move (nothing was written): reads the placements again
/// and sends `members` through the route function, which Citus delegates to
/// each shard's new worker, until each is decided. The calls go with their
/// values written out: Citus cannot delegate a generic plan, and the
/// service's sessions force generic plans.
async fn resend(
    conn: &mut PgConnection,
    routes: &Routes,
    batches: &[&Check],
    members: &[usize],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<(usize, Answer)>, sqlx::Error> {
    let (mut decided, mut pending, mut pause) = (Vec::new(), members.to_vec(), Duration::from_millis(1));
    while !pending.is_empty() {
        routes.refresh(conn).await?;
        let mut left = Vec::new();
        for group in by_worker(routes, batches, pending.into_iter()) {
            match decide_on_worker(conn, routes, batches, &group, now, true).await {
                Ok(answers) => decided.extend(group.into_iter().zip(answers)),
                Err(e) if moved(&e) && pause <= MOVE_PATIENCE => left.extend(group),
                Err(e) => return Err(e),
            }
        }
        pending = left;
        if !pending.is_empty() {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Ok(decided)
}

async fn run(
    conn: &mut PgConnection,
    routes: &Routes,
    batches: &[&Check],
    statement: &Statement,
    members: &[usize],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let Statement::Upsert(joined, shards, segments, upsert) = statement else {
        return decide_on_worker(conn, routes, batches, members, now, false).await;
    };
    let texts = match shards {
        Shards::All => &joined.all,
        Shards::One(s) => &joined.each[*s],
    };
    let sql = match upsert {
        Upsert::HotKeys => &texts.hot,
        Upsert::Policy => &texts.policy,
        Upsert::OneBucket | Upsert::Algorithms => &texts.one,
    };
    let (mut args, mut before) = (vec![Arg::Clock(now)], 0);
    for segment in segments {
        let buckets = segment.iter().map(|&(i, j)| (i, batches[i], &batches[i].buckets[j]));
        let own = upsert::bucket_args(*upsert, buckets, None).into_iter();
        args.extend(own.filter(|arg| !matches!(arg, Arg::Clock(_))));
        args.push(Arg::Int(i32::try_from(before).unwrap_or(i32::MAX)));
        before += segment.len();
    }
    let mut rows = statements::fetch_rows(conn, sql, args, None).await?;
    statements::renumber(&mut rows, &answer_order(batches, members, segments))?;
    let group: Vec<&Check> = members.iter().map(|&i| batches[i]).collect();
    statements::answers(&group, rows)
}

/// Where each bucket of `segments`, in their order, goes among the answers
/// to `members` (from 1): their checks' buckets in the checks' order.
fn answer_order(batches: &[&Check], members: &[usize], segments: &[Segment]) -> Vec<i32> {
    let mut start = std::collections::HashMap::with_capacity(members.len());
    let mut next = 1;
    for &i in members {
        start.insert(i, next);
        next += batches[i].buckets.len();
    }
    let place = |&(i, j): &(usize, usize)| i32::try_from(start.get(&i).map_or(0, |s| s + j)).unwrap_or(0);
    segments.iter().flatten().map(place).collect()
}

async fn decide_on_worker(
    conn: &mut PgConnection,
    routes: &Routes,
    batches: &[&Check],
    members: &[usize],
    now: Option<DateTime<Utc>>,
    written_out: bool,
) -> Result<Vec<Answer>, sqlx::Error> {
    let group: Vec<&Check> = members.iter().map(|&i| batches[i]).collect();
    let bucket_routes: Vec<i32> =
        group.iter().flat_map(|b| b.buckets.iter().map(|bucket| routes.of(&bucket.key))).collect();
    let route = bucket_routes.first().copied().unwrap_or(routes.all()[0]);
    let mut args = statements::check_args(&group, now);
    args.push(Arg::Ints(bucket_routes));
    let rows = statements::fetch_rows(conn, &check_node(route), args, written_out.then_some("")).await?;
    statements::answers(&group, rows)
}

/// Gives back, on the worker of `batch`'s buckets, what it took, as `taken`
/// answered it.
pub(in crate::storage::postgres) async fn refund(
    conn: &mut PgConnection,
    routes: &Routes,
    batch: &Check,
    taken: &Answer,
) -> Result<(), sqlx::Error> {
    let bucket_routes: Vec<i32> = batch.buckets.iter().map(|b| routes.of(&b.key)).collect();
    let Some(&route) = bucket_routes.first() else { return Ok(()) };
    let column = |f: fn(&BucketSpec) -> i64| batch.buckets.iter().map(f).collect::<Vec<i64>>();
    sqlx::query(REFUND)
        .bind(route)
        .bind(&bucket_routes)
        .bind(batch.buckets.iter().map(|b| b.key.as_slice()).collect::<Vec<_>>())
        .bind(column(|b| i64::try_from(b.limit).unwrap_or(i64::MAX)))
        .bind(column(|b| i64::try_from(b.window.as_millis()).unwrap_or(i64::MAX)))
        .bind(batch.buckets.iter().map(|b| b.algorithm.code()).collect::<Vec<_>>())
        .bind(vec![i64::try_from(batch.cost).unwrap_or(i64::MAX); batch.buckets.len()])
        .bind(taken.now)
        .bind(taken.buckets.iter().map(|b| b.reset_at).collect::<Vec<_>>())
        .execute(conn)
        .await?;
    Ok(())
}

/// Cleans up on the next route in turn: `run` counts the cleanups before.
pub(in crate::storage::postgres) async fn cleanup(
    conn: &mut PgConnection,
    routes: &Routes,
    batch: i64,
    run: usize,
) -> Result<u64, sqlx::Error> {
    let (route, _) = routes.cleanup(run);
    let (deleted,): (i64,) = sqlx::query_as(DELETE_ON_ROUTE).bind(route).bind(batch).fetch_one(conn).await?;
    Ok(deleted.max(0) as u64)
}

pub(in crate::storage::postgres) fn block(routes: &Routes, targets: &[BlockTarget]) -> Blocking {
    Blocking { sql: BLOCK_ROUTED, routes: Some(targets.iter().map(|t| routes.of(&t.key)).collect()) }
}

/// A chunk holds one route's buckets only: sorted by route, they come together.
pub(in crate::storage::postgres) fn order_held(routes: &Routes, held: &mut [Held]) {
    held.sort_by_key(|h| routes.of(&h.key));
}

/// The first chunk of `held` (ordered, not empty): up to `most` buckets of the first one's route.
pub(in crate::storage::postgres) fn absorb(
    routes: &Routes,
    held: &[Held],
    most: usize,
) -> (usize, Absorbing) {
    let first = held.first().map_or(routes.all()[0], |h| routes.of(&h.key));
    let len = held[..held.len().min(most)].iter().take_while(|h| routes.of(&h.key) == first).count();
    (len, Absorbing { sql: &ABSORB_ROUTE, route: Some(first) })
}

/// Pings every route, each on its worker, through the coordinator.
pub(in crate::storage::postgres) async fn ping_workers(
    conn: &mut PgConnection,
    routes: &Routes,
) -> Result<(), sqlx::Error> {
    for &route in routes.all() {
        sqlx::query("SELECT pglimit_ping_route($1)").bind(route).execute(&mut *conn).await?;
    }
    Ok(())
}
