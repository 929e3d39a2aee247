//! Citus mode: the counters distributed over a cluster, each call on one shard.
//!
//! Every row carries a *route*, a small integer derived from its key
//! ([`Routes::of`]); the tables are distributed by it, one route per shard.
//! A lane groups the checks of its batch by route and sends each group as one
//! call of `pglimit_check_route`, which Citus delegates to the worker holding
//! that route's shard and runs there, on that shard only: no two-phase
//! commit, no lock on another shard, so no distributed deadlock.
//!
//! A check whose buckets have different routes (a `login` check's three
//! buckets usually do) is split into one part per route, decided on each
//! shard at once; if any part is denied, the parts that were admitted give
//! back what they took ([`refund`]). All or nothing holds, and no limit is
//! ever exceeded: between the taking and the giving back, another check may
//! be denied by a bucket that is only momentarily full (README, "Scaling out").

mod parts;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::Connection;

use super::statements;
use crate::storage::{Answer, CheckBatch, Key};
pub(super) use parts::{merge, split, Part};

/// Citus mode (README, "Scaling out"): counters distributed by route, each
/// call on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Citus {
    /// On when the database has the citus extension.
    #[default]
    Auto,
    /// On, and start-up fails without the extension.
    On,
    /// Off even on a Citus coordinator (the tables stay local to it).
    Off,
}

/// Distributes the tables; run once, by whichever instance comes first.
const SETUP: &str = include_str!("setup.sql");
/// The functions each call runs on one shard; replaced at every start.
const FUNCTIONS: &str = include_str!("functions.sql");

/// Gives back what one part of a denied check took; see `functions.sql`.
const REFUND: &str = "SELECT pglimit_refund_route($1, $2, $3, $4, $5, $6, $7)";

/// Serialises the set-up between instances starting together.
const SETUP_LOCK: i64 = 0x7067_6c69_6d69_7401;

/// The route of every key: slot `s` (the key's first two bytes modulo the
/// number of slots) is stored on route `routes[s]`, the smallest integer
/// Citus places on the `s`-th shard. Read from `pglimit_routes`, which is
/// written once, so every instance routes a key the same way for ever.
#[derive(Debug)]
pub(super) struct Routes {
    routes: Vec<i32>,
}

impl Routes {
    pub fn of(&self, key: &Key) -> i32 {
        self.routes[self.slot(key)]
    }

    /// The slot of `key`, from 0 to the number of routes: lanes are chosen by it.
    pub fn slot(&self, key: &Key) -> usize {
        usize::from(u16::from_be_bytes([key[0], key[1]])) % self.routes.len()
    }

    pub fn all(&self) -> &[i32] {
        &self.routes
    }
}

/// Whether to use Citus mode, per `wanted` and the database; in Citus mode,
/// distributes the tables if no instance did yet, (re)creates the
/// functions, and returns the routes.
pub(super) async fn setup(conn: &mut PgConnection, wanted: Citus) -> Result<Option<Routes>, sqlx::Error> {
    let (installed,): (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(&mut *conn)
            .await?;
    match (wanted, installed) {
        (Citus::Off, _) | (Citus::Auto, false) => return Ok(None),
        (Citus::On, false) => {
            let msg = "PGLIMIT_CITUS=true but the database has no citus extension: \
                       run CREATE EXTENSION citus on the coordinator, or set PGLIMIT_CITUS=auto";
            return Err(sqlx::Error::Configuration(msg.into()));
        }
        (Citus::On | Citus::Auto, true) => {}
    }
    let mut tx = conn.begin().await?;
    // Distributing tables and functions in one transaction needs one
    // connection per worker throughout.
    sqlx::query("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'").execute(&mut *tx).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(SETUP_LOCK).execute(&mut *tx).await?;
    let (distributed,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'pglimit_buckets'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !distributed {
        tracing::info!("Citus: distributing pglimit_buckets and pglimit_blocks by route");
        sqlx::raw_sql(SETUP).execute(&mut *tx).await?;
    }
    sqlx::raw_sql(FUNCTIONS).execute(&mut *tx).await?;
    tx.commit().await?;
    let routes: Vec<(i32,)> =
        sqlx::query_as("SELECT route FROM pglimit_routes ORDER BY slot").fetch_all(conn).await?;
    if routes.is_empty() {
        return Err(sqlx::Error::Protocol("pglimit_routes is empty".into()));
    }
    tracing::info!(routes = routes.len(), "Citus mode: each check is decided on the shard of its keys");
    Ok(Some(Routes { routes: routes.into_iter().map(|(r,)| r).collect() }))
}

/// Decides `batches` (each on a single route) with one call per route, and
/// returns one answer per batch, in order.
pub(super) async fn decide(
    conn: &mut PgConnection,
    routes: &Routes,
    batches: &[&CheckBatch],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let mut by_route: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, batch) in batches.iter().enumerate() {
        let route = batch.buckets.first().map_or(routes.all()[0], |b| routes.of(&b.key));
        by_route.entry(route).or_default().push(i);
    }
    let mut answers: Vec<Option<Answer>> = vec![None; batches.len()];
    for (route, members) in by_route {
        let group: Vec<&CheckBatch> = members.iter().map(|&i| batches[i]).collect();
        let decided = statements::decide_on_route(conn, route, &group, now).await?;
        for (i, answer) in members.into_iter().zip(decided) {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|a| a.ok_or_else(|| sqlx::Error::Protocol("a check was left undecided".into())))
        .collect()
}

/// Gives back, on `route`, what `batch` took at `at`.
pub(super) async fn refund(
    conn: &mut PgConnection,
    route: i32,
    batch: &CheckBatch,
    at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let column =
        |f: fn(&crate::storage::BucketSpec) -> i64| batch.buckets.iter().map(f).collect::<Vec<i64>>();
    sqlx::query(REFUND)
        .bind(route)
        .bind(batch.buckets.iter().map(|b| b.key.as_slice()).collect::<Vec<_>>())
        .bind(column(|b| i64::try_from(b.limit).unwrap_or(i64::MAX)))
        .bind(column(|b| i64::try_from(b.window.as_millis()).unwrap_or(i64::MAX)))
        .bind(batch.buckets.iter().map(|b| b.algorithm.code()).collect::<Vec<_>>())
        .bind(vec![i64::try_from(batch.cost).unwrap_or(i64::MAX); batch.buckets.len()])
        .bind(at)
        .execute(conn)
        .await?;
    Ok(())
}
