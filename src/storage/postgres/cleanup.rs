//! Deleting expired rows without a cron: a sample of checks starts a
//! bounded background delete, at most one at a time per instance. The
//! deletes themselves are the layout's ([`super::layout`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::kept::Kept;
use super::session::Session;
use crate::telemetry;

pub(super) struct Cleanup {
    /// Fraction of checks that start a cleanup.
    rate: f64,
    /// Most rows one cleanup deletes.
    batch: i64,
    running: AtomicBool,
    /// How many runs there have been, which in Citus mode picks the route.
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
            .within(session, limit, move |conn, session| {
                let run = self.runs.fetch_add(1, Ordering::Relaxed);
                Box::pin(session.layout().cleanup(session, conn, batch, run))
            })
            .await
    }
}
