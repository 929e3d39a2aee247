//! Deleting expired rows without a cron: a sample of checks starts a
//! bounded background delete, at most one at a time per instance.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use sqlx::postgres::PgConnection;

use super::kept::Kept;
use super::session::Session;
use crate::telemetry;

/// A row past `expires_at` is equivalent to no row for every algorithm,
/// so deleting it changes no answer. Rows locked by a check in progress are
/// skipped, never waited for.
const DELETE_EXPIRED: &str = "DELETE FROM pglimit_buckets WHERE key IN (
    SELECT key FROM pglimit_buckets WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Blocks past their end, likewise: an ended block is no block.
const DELETE_ENDED_BLOCKS: &str = "DELETE FROM pglimit_blocks WHERE key IN (
    SELECT key FROM pglimit_blocks WHERE until <= now()
    ORDER BY until LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Citus mode: both deletes on one route's shard (a distributed
/// `FOR UPDATE SKIP LOCKED` is refused); each run takes the next route.
const DELETE_ON_ROUTE: &str = "SELECT pglimit_cleanup_route($1, $2::integer)";

pub(super) struct Cleanup {
    /// Fraction of checks that start a cleanup.
    rate: f64,
    /// Most rows one cleanup deletes.
    batch: i64,
    running: AtomicBool,
    /// Citus mode: how many runs there have been, which picks the route.
    runs: AtomicUsize,
    /// Kept open between runs.
    conn: Kept,
}

impl Cleanup {
    pub fn new(rate: f64, batch: i64) -> Self {
        Self {
            rate,
            batch,
            running: AtomicBool::new(false),
            runs: AtomicUsize::new(0),
            conn: Kept::new("cleaning up"),
        }
    }

    /// Called after each check: on about `rate` of them, starts a cleanup
    /// unless one is running.
    pub fn maybe_start(self: &Arc<Self>, session: &Arc<Session>) {
        if rand::random::<f64>() >= self.rate || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, session) = (Arc::clone(self), Arc::clone(session));
        tokio::spawn(async move {
            match this.run(&session).await {
                Ok(n) => {
                    telemetry::cleanup_deleted(n);
                    tracing::debug!(deleted = n, "cleanup of expired buckets");
                }
                Err(e) => tracing::debug!(error = %e, "cleanup of expired buckets failed"),
            }
            this.running.store(false, Ordering::Release);
        });
    }

    /// Deletes up to `batch` expired rows, and as many ended blocks; returns
    /// how many rows it deleted.
    pub async fn run(&self, session: &Session) -> Result<u64, sqlx::Error> {
        let batch = self.batch;
        // Each statement is bounded by the server's `statement_timeout`
        // (below the hard limit): only a server gone silent meets this one.
        let limit = session.hard_limit() * 3;
        self.conn
            .within(session, limit, move |conn, session| match session.routes() {
                None => Box::pin(delete(session, conn, batch)),
                Some(routes) => {
                    let route = routes.all()[self.runs.fetch_add(1, Ordering::Relaxed) % routes.all().len()];
                    Box::pin(async move {
                        let query = sqlx::query_as(DELETE_ON_ROUTE).bind(route).bind(batch);
                        let (deleted,): (i64,) = query.fetch_one(conn).await?;
                        Ok(deleted.max(0) as u64)
                    })
                }
            })
            .await
    }
}

async fn delete(session: &Session, conn: &mut PgConnection, batch: i64) -> Result<u64, sqlx::Error> {
    let mut deleted = 0;
    let mut tx = session.begin(conn).await?;
    for statement in [DELETE_EXPIRED, DELETE_ENDED_BLOCKS] {
        let delete = sqlx::query(statement).persistent(session.keeps_statements()).bind(batch);
        deleted += delete.execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(deleted)
}
