//! Where the rows are: on a single node, or distributed over a Citus cluster
//! ([`super::citus`]). The layout owns each family of statements that
//! differs between the two (deciding, refunding, cleaning up, writing back
//! after an outage, blocking) and says how checks are spread over the lanes;
//! each variant's statements are in its own file: [`single`] here, and
//! Citus mode's with the rest of Citus ([`super::citus`]).

mod single;
pub(in crate::storage::postgres) mod writes;

pub(super) use writes::{Absorbing, Blocking, StoredRow};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::citus::{layout as citus, unreachable_worker, CitusChecks, Node, Routes, WorkerCheck};
use super::session::Session;
use crate::storage::{Answer, BlockTarget, Check, Held};

/// The layout of the rows, set once at start-up ([`Session::prepare`]).
pub(super) enum Layout {
    /// One PostgreSQL server (or a Citus coordinator in `PGLIMIT_CITUS=off`).
    Single,
    /// Citus mode: the rows distributed by route, each call on one worker.
    Citus(Routes),
}

impl Layout {
    /// Whether checks may take leases (concurrency buckets): their table
    /// is on a single node (`sql/leases.sql`), not distributed.
    pub fn takes_leases(&self) -> bool {
        matches!(self, Layout::Single)
    }

    /// Readies a newly opened connection for this layout's statements;
    /// `direct`: a connection straight to a Citus worker.
    pub async fn configure(&self, conn: &mut PgConnection, direct: bool) -> Result<(), sqlx::Error> {
        match self {
            Layout::Citus(_) if !direct => citus::configure(conn).await,
            _ => Ok(()),
        }
    }

    /// Says which node a connection at start-up failed to reach (in Citus
    /// mode, a worker), and what to do; other errors pass unchanged.
    pub fn unreachable(&self, node: Option<&Node>, e: sqlx::Error) -> sqlx::Error {
        match self {
            Layout::Citus(_) => unreachable_worker(node, e),
            Layout::Single => e,
        }
    }

    /// The lanes of `connections` connections for checks: one lane on a
    /// single node; in Citus mode one lane per worker, on connections to
    /// that worker, or through the coordinator one lane per connection,
    /// since each worker's checks go to a lane of their own.
    pub fn lanes(&self, connections: usize, checks: CitusChecks) -> Vec<LaneTarget> {
        let through = |width| LaneTarget { worker: None, node: None, width };
        match self {
            Layout::Single => vec![through(connections)],
            Layout::Citus(_) if checks == CitusChecks::Coordinator => vec![through(1); connections],
            Layout::Citus(routes) => {
                let width = connections.div_ceil(routes.nodes().len().max(1));
                let direct =
                    |node: &Node| LaneTarget { worker: Some(node.group), node: Some(node.clone()), width };
                routes.nodes().iter().map(direct).collect()
            }
        }
    }

    /// In Citus mode, `batch` split into one part per worker; `None` on a
    /// single node, where a check goes whole to the one lane.
    pub fn split(&self, batch: &Check) -> Option<Vec<WorkerCheck>> {
        match self {
            Layout::Single => None,
            Layout::Citus(routes) => Some(super::citus::split(routes, batch)),
        }
    }

    /// Decides `batches` in one call, at `now` (`None`: the database's
    /// clock), and returns one answer per batch, in order. `per_transaction`:
    /// behind a transaction pooler, the settings each transaction starts with;
    /// `node`: the Citus worker the connection goes straight to.
    pub async fn decide(
        &self,
        conn: &mut PgConnection,
        batches: &[&Check],
        now: Option<DateTime<Utc>>,
        per_transaction: Option<&str>,
        node: Option<&Node>,
    ) -> Result<Vec<Answer>, sqlx::Error> {
        match self {
            Layout::Single => single::decide(conn, batches, now, per_transaction).await,
            Layout::Citus(routes) => citus::decide(conn, routes, batches, now, node.map(|n| n.group)).await,
        }
    }

    /// Gives back what `batch` took, as `taken` answered it: only a part of
    /// a check split across workers is ever refunded.
    pub async fn refund(
        &self,
        conn: &mut PgConnection,
        batch: &Check,
        taken: &Answer,
    ) -> Result<(), sqlx::Error> {
        match self {
            Layout::Single => Err(sqlx::Error::Protocol("a refund outside Citus mode".into())),
            Layout::Citus(routes) => citus::refund(conn, routes, batch, taken).await,
        }
    }

    /// Deletes up to `batch` expired rows, and as many ended blocks; returns
    /// how many rows it deleted. `run` counts the cleanups before this one.
    pub async fn cleanup(
        &self,
        session: &Session,
        conn: &mut PgConnection,
        batch: i64,
        run: usize,
    ) -> Result<u64, sqlx::Error> {
        match self {
            Layout::Single => single::cleanup(session, conn, batch).await,
            Layout::Citus(routes) => citus::cleanup(conn, routes, batch, run).await,
        }
    }

    /// In Citus mode, the `run`-th cleanup's worker and the statement for
    /// its shard there; `None` when it goes through the URL's server.
    pub fn cleanup_on_worker(&self, run: usize) -> Option<(Node, String)> {
        match self {
            Layout::Single => None,
            Layout::Citus(routes) => routes.cleanup(run).1.map(|(node, sql)| (node, sql.to_owned())),
        }
    }

    /// The statement of an operator's block on `targets`.
    pub fn block(&self, targets: &[BlockTarget]) -> Blocking {
        match self {
            Layout::Single => single::block(),
            Layout::Citus(routes) => citus::block(routes, targets),
        }
    }

    /// Orders what memory admitted during an outage for [`Layout::absorb`].
    pub fn order_held(&self, held: &mut [Held]) {
        if let Layout::Citus(routes) = self {
            citus::order_held(routes, held);
        }
    }

    /// How many of `held` (ordered) to write back in the next transaction,
    /// at most `most`, and the statements that write them; `None` when
    /// nothing is left.
    pub fn absorb(&self, held: &[Held], most: usize) -> Option<(usize, Absorbing)> {
        if held.is_empty() {
            return None;
        }
        Some(match self {
            Layout::Single => (held.len().min(most), single::absorb()),
            Layout::Citus(routes) => citus::absorb(routes, held, most),
        })
    }

    /// Whether every worker answers, through the coordinator: the
    /// coordinator answering says nothing of the workers.
    pub async fn ping_workers(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        match self {
            Layout::Single => Ok(()),
            Layout::Citus(routes) => citus::ping_workers(conn, routes).await,
        }
    }
}

/// Where a lane connects, and with how many connections.
#[derive(Debug, Clone, Default)]
pub(super) struct LaneTarget {
    /// The Citus group whose checks the lane takes; `None`: any.
    pub worker: Option<i32>,
    /// The worker it connects to; `None`: the URL's server.
    pub node: Option<Node>,
    pub width: usize,
}
