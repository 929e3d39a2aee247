//! Citus mode: the counters distributed over a cluster, each call on one shard.
//!
//! Every row carries a *route*, a small integer derived from its key
//! ([`Routes::of`]); the tables are distributed by it, one route per shard.
//! The service knows which worker holds each route (`pg_dist_placement`).
//! A lane groups the checks of its batch by worker and sends each group as
//! one call of `pglimit_check_node`, which Citus delegates to that worker,
//! where it runs on that worker's shards only: no two-phase commit, no lock
//! on another node, so no distributed deadlock. If a shard has moved since
//! the service last looked, the call fails before writing anything; the
//! service reads the placements again and sends the group anew.
//!
//! A check whose buckets are on different workers (a `login` check's three
//! buckets often are) is split into one part per worker, decided on each at
//! once; if any part is denied, the parts that were admitted give back what
//! they took. All or nothing holds, and no limit is ever
//! exceeded: between the taking and the giving back, another check may be
//! denied by a bucket that is only momentarily full (docs/scaling.md, "Design").
//!
//! This module sets the cluster up and places the keys; the statements of
//! Citus mode are in `layout.rs` here, the Citus side of the layout.

pub(super) use super::node::Node;

pub(super) mod across;
mod joined;
pub(super) mod layout;
mod parts;
mod plan;
mod shard;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Executor};

use crate::storage::Key;
pub(super) use joined::{Texts, WorkerUpserts};
pub(super) use parts::{split, WorkerCheck};

/// Citus mode (docs/scaling.md, "When and how"): counters distributed by
/// route, each call on one shard.
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

/// `PGLIMIT_CITUS_CHECKS`: where an instance sends its checks in Citus mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CitusChecks {
    /// Straight to the worker that holds their shard, on connections of
    /// their own: the coordinator is off the check path.
    #[default]
    Workers,
    /// Through the coordinator, which delegates each call to its worker.
    Coordinator,
}

/// Leases are kept in one table on a single node (`sql/leases.sql`), so a
/// store in Citus mode refuses concurrency buckets
/// ([`Layout::takes_leases`](super::layout::Layout::takes_leases)).
pub const CONCURRENCY_ON_CITUS: &str = "concurrency buckets are not supported in Citus mode";

/// Says which worker a connection at start-up failed to reach, and what to
/// do; errors from the URL's server pass unchanged.
pub(super) fn unreachable_worker(node: Option<&Node>, e: sqlx::Error) -> sqlx::Error {
    let Some(node) = node else { return e };
    sqlx::Error::Configuration(
        format!(
            "PGLIMIT_CITUS_CHECKS=workers: cannot connect to Citus worker {}:{} (group {}) with the \
             coordinator's credentials: {e}; make the workers reachable from pglimit as pg_dist_node \
             names them, or set PGLIMIT_CITUS_CHECKS=coordinator",
            node.host, node.port, node.group
        )
        .into(),
    )
}

/// Distributes the tables; run once, by whichever instance comes first.
const SETUP: &str = include_str!("setup.sql");
/// The functions each call runs on one shard; replaced at every start.
pub(super) const FUNCTIONS: &str = include_str!("functions.sql");

/// The worker (Citus group) holding each route's shard, in slot order.
const PLACEMENTS: &str = "
SELECT (SELECT min(p.groupid) FROM pg_dist_placement p
        WHERE p.shardid = get_shard_id_for_distribution_column('pglimit_buckets', r.route))
FROM pglimit_routes r ORDER BY r.slot";

/// Each slot's route and its shards: the counters' (id and name) and the blocks'.
const SHARDS: &str = "
SELECT r.route, b.shard, shard_name('pglimit_buckets', b.shard),
       shard_name('pglimit_blocks', get_shard_id_for_distribution_column('pglimit_blocks', r.route))
FROM pglimit_routes r, LATERAL (SELECT get_shard_id_for_distribution_column('pglimit_buckets', r.route) AS shard) b
ORDER BY r.slot";

/// The nodes holding a shard of the counters, by group.
const NODES: &str = "
SELECT DISTINCT n.groupid, n.nodename, n.nodeport FROM pg_dist_node n
JOIN pg_dist_placement p ON p.groupid = n.groupid
JOIN pg_dist_shard s ON s.shardid = p.shardid
WHERE s.logicalrelid = 'pglimit_buckets'::regclass AND n.noderole = 'primary' AND n.isactive
ORDER BY 1";

/// Serialises the set-up between instances starting together.
const SETUP_LOCK: i64 = 0x7067_6c69_6d69_7401;

/// The route of every key: slot `s` (the key's first two bytes modulo the
/// number of slots) is stored on route `routes[s]`, the smallest integer
/// Citus places on the `s`-th shard. Read from `pglimit_routes`, which is
/// written once, so every instance routes a key the same way for ever.
#[derive(Debug)]
pub(super) struct Routes {
    routes: Vec<i32>,
    /// The worker of each slot's route, as last read; may be stale after a
    /// shard move, which a call then reports.
    workers: ArcSwap<Vec<i32>>,
    /// The nodes that held a shard at start-up.
    nodes: Vec<Node>,
    /// Each slot's upserts, written for its route's shard.
    upserts: Vec<Texts>,
    /// Each slot's cleanup, written for its route's shard.
    cleanups: Vec<String>,
    /// Each worker's shards' upserts joined into one statement, as last read.
    joined: ArcSwap<HashMap<i32, Arc<WorkerUpserts>>>,
}

impl Routes {
    pub fn of(&self, key: &Key) -> i32 {
        self.routes[self.slot(key)]
    }

    /// The worker (Citus group id) that held `key`'s shard when last read.
    pub fn worker(&self, key: &Key) -> i32 {
        self.workers.load().get(self.slot(key)).copied().unwrap_or(0)
    }

    fn slot(&self, key: &Key) -> usize {
        usize::from(u16::from_be_bytes([key[0], key[1]])) % self.routes.len()
    }

    /// The upserts of all the shards `worker` held when last read.
    pub fn joined(&self, worker: i32) -> Option<Arc<WorkerUpserts>> {
        self.joined.load().get(&worker).cloned()
    }

    pub fn all(&self) -> &[i32] {
        &self.routes
    }

    /// The nodes that held a shard at start-up, in group order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The `run`-th cleanup's route (each in turn), and, if a node known
    /// at start-up held its shard when last read, that node and the
    /// shard's own cleanup statement.
    pub fn cleanup(&self, run: usize) -> (i32, Option<(Node, &str)>) {
        let slot = run % self.routes.len();
        let group = self.workers.load().get(slot).copied();
        let node = self.nodes.iter().find(|n| Some(n.group) == group);
        let direct = node.zip(self.cleanups.get(slot)).map(|(n, sql)| (n.clone(), sql.as_str()));
        (self.routes[slot], direct)
    }

    /// Reads again which worker holds each route.
    pub async fn refresh(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let rows: Vec<(Option<i32>,)> = sqlx::query_as(PLACEMENTS).fetch_all(conn).await?;
        let workers: Vec<i32> = rows.into_iter().map(|(g,)| g.unwrap_or(0)).collect();
        self.joined.store(Arc::new(self.join(&workers).map_err(sqlx::Error::Protocol)?));
        self.workers.store(Arc::new(workers));
        Ok(())
    }

    /// Each worker's statement over its shards, in route order (the order
    /// everything locks rows in).
    fn join(&self, workers: &[i32]) -> Result<HashMap<i32, Arc<WorkerUpserts>>, String> {
        let mut slots: BTreeMap<i32, BTreeMap<i32, usize>> = BTreeMap::new();
        for (slot, &worker) in workers.iter().enumerate() {
            slots.entry(worker).or_default().insert(self.routes[slot], slot);
        }
        let join_one = |(worker, by_route): (i32, BTreeMap<i32, usize>)| {
            let shards: Vec<&Texts> = by_route.values().map(|&slot| &self.upserts[slot]).collect();
            let upserts = WorkerUpserts::of(by_route.keys().copied().collect(), &shards)?;
            Ok((worker, Arc::new(upserts)))
        };
        slots.into_iter().map(join_one).collect()
    }
}

#[cfg(test)]
impl Routes {
    /// LaneConnection `s` on route `routes[s]`, held by worker `workers[s]`.
    pub fn for_tests(routes: Vec<i32>, workers: Vec<i32>) -> Self {
        let text = || Texts {
            one: "upsert".into(),
            hot: "hot upsert".into(),
            policy: "policy".into(),
            shards: Vec::new(),
        };
        let mut joined: HashMap<i32, WorkerUpserts> = HashMap::new();
        for (&route, &worker) in routes.iter().zip(&workers) {
            let new = || WorkerUpserts { routes: Vec::new(), all: text(), each: Vec::new() };
            let on = joined.entry(worker).or_insert_with(new);
            on.routes.push(route);
            on.routes.sort_unstable();
            on.each.push(text());
        }
        let joined = joined.into_iter().map(|(worker, upserts)| (worker, Arc::new(upserts))).collect();
        let workers = ArcSwap::new(Arc::new(workers));
        Routes {
            routes,
            workers,
            nodes: Vec::new(),
            upserts: Vec::new(),
            cleanups: Vec::new(),
            joined: ArcSwap::new(Arc::new(joined)),
        }
    }
}

/// Whether to use Citus mode, per `wanted` and the database; in Citus mode,
/// distributes the tables if no instance did yet, (re)creates the
/// functions in the schema first on `search_path`, and returns the routes.
pub(super) async fn setup(
    conn: &mut PgConnection,
    wanted: Citus,
    search_path: &str,
) -> Result<Option<Routes>, sqlx::Error> {
    // A simple-protocol query prepares nothing, so it is safe behind any pooler.
    let installed =
        conn.fetch_one("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')").await?;
    let installed: bool = sqlx::Row::try_get(&installed, 0)?;
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
    sqlx::query("SELECT set_config('search_path', $1, true)").bind(search_path).execute(&mut *tx).await?;
    sqlx::raw_sql(FUNCTIONS).execute(&mut *tx).await?;
    tx.commit().await?;
    let shards: Vec<(i32, i64, String, String)> = sqlx::query_as(SHARDS).fetch_all(&mut *conn).await?;
    if shards.is_empty() {
        return Err(sqlx::Error::Protocol("pglimit_routes is empty".into()));
    }
    let shards = shards.into_iter().map(|(route, buckets, buckets_name, blocks_name)| shard::Shard {
        route,
        buckets,
        buckets_name,
        blocks_name,
    });
    let written = shards
        .map(|shard| Ok((shard.route, (shard::upserts(&shard)?, shard::cleanup(&shard)?))))
        .collect::<Result<(Vec<i32>, (Vec<Texts>, Vec<String>)), String>>();
    let (routes, (upserts, cleanups)) = written.map_err(sqlx::Error::Protocol)?;
    let nodes: Vec<(i32, String, i32)> = sqlx::query_as(NODES).fetch_all(&mut *conn).await?;
    let nodes = nodes
        .into_iter()
        .map(|(group, host, port)| Node { group, host, port: u16::try_from(port).unwrap_or(5432) })
        .collect();
    let (workers, joined) = (ArcSwap::default(), ArcSwap::default());
    let routes = Routes { routes, workers, nodes, upserts, cleanups, joined };
    routes.refresh(conn).await?;
    tracing::info!(
        routes = routes.routes.len(),
        "Citus mode: each check is decided on the workers of its keys"
    );
    Ok(Some(routes))
}
