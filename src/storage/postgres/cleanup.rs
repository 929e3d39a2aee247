//! Deleting expired rows without a cron: a sample of checks starts a
//! bounded background delete, at most one at a time per instance. The
//! deletes are below; the layout runs them ([`super::layout`]), and in
//! Citus mode with checks straight to the workers, each shard's own
//! ([`super::citus`]) goes to its worker on a connection kept for it.
//! Each run also deletes audit rows past their retention and the top
//! list's old minutes, as many at most, always on the URL's server (the
//! coordinator holds both tables in Citus mode).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::connection::Connection;
use super::node::Node;
use super::session::Session;
use crate::telemetry;

/// Minutes of the top list older than `$2` microseconds, at most `$1` of them.
const DELETE_OLD_DENIALS: &str = "
DELETE FROM pglimit_denials WHERE (key, minute) IN (
    SELECT key, minute FROM pglimit_denials
    WHERE minute < now() - $2::bigint * interval '1 microsecond' LIMIT $1)";

/// How long the top list's minutes are kept unless told (`PGLIMIT_TOP_RETENTION`).
const DENIALS_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

pub(super) struct Cleanup {
    /// Fraction of checks that start a cleanup.
    rate: f64,
    /// Most rows one cleanup deletes.
    batch: i64,
    /// How long an audit row is kept.
    audit_retention: Duration,
    running: AtomicBool,
    /// How many runs there have been, which in Citus mode picks the route.
    runs: AtomicUsize,
    /// Connection open between runs, to the URL's server.
    conn: Connection,
    /// In Citus mode with checks straight to the workers, a connection
    /// kept to each worker a cleanup went to; `None` otherwise.
    workers: Option<Mutex<HashMap<Node, Arc<Connection>>>>,
    /// How long the top list's minutes are kept, in microseconds.
    denials_kept_us: AtomicU64,
}

impl Cleanup {
    /// `on_workers`: in Citus mode, a cleanup goes straight to the worker
    /// of its shard, as the checks do.
    pub fn new(rate: f64, batch: i64, on_workers: bool, audit_retention: Duration) -> Self {
        Self {
            rate,
            batch,
            audit_retention,
            running: AtomicBool::new(false),
            runs: AtomicUsize::new(0),
            conn: Connection::new("cleaning up"),
            workers: on_workers.then(Mutex::default),
            denials_kept_us: AtomicU64::new(DENIALS_KEPT.as_micros() as u64),
        }
    }

    /// Keeps the top list's minutes `retention` long from now on.
    pub fn keep_denials_for(&self, retention: Duration) {
        let us = u64::try_from(retention.as_micros()).unwrap_or(u64::MAX);
        self.denials_kept_us.store(us, Ordering::Relaxed);
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

    /// Deletes up to `batch` expired rows, as many ended blocks and as many
    /// audit rows past retention and old minutes of the top list; returns
    /// how many rows it deleted.
    pub async fn run(&self, session: &Session) -> Result<u64, sqlx::Error> {
        let expired = self.expire_counters(session).await?;
        let audit = self.expire_audit(session).await?;
        Ok(expired + audit + self.old_denials(session).await?)
    }

    async fn expire_audit(&self, session: &Session) -> Result<u64, sqlx::Error> {
        let (batch, retention, limit) = (self.batch, self.audit_retention, session.hard_limit() * 3);
        self.conn
            .within(session, limit, move |conn, session| {
                Box::pin(super::audit::expire(conn, session.keeps_statements(), batch, retention))
            })
            .await
    }

    /// Up to `batch` minutes of the top list older than its retention.
    async fn old_denials(&self, session: &Session) -> Result<u64, sqlx::Error> {
        let (batch, limit) = (self.batch, session.hard_limit() * 3);
        let kept = i64::try_from(self.denials_kept_us.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        self.conn
            .within(session, limit, move |conn, session| {
                Box::pin(async move {
                    let delete = sqlx::query(DELETE_OLD_DENIALS).persistent(session.keeps_statements());
                    Ok(delete.bind(batch).bind(kept).execute(conn).await?.rows_affected())
                })
            })
            .await
    }

    /// The counters', blocks' and leases' part of [`Cleanup::run`].
    async fn expire_counters(&self, session: &Session) -> Result<u64, sqlx::Error> {
        let batch = self.batch;
        // Each statement is bounded by the server's `statement_timeout`
        // (below the hard limit): only a server gone silent meets this one.
        let limit = session.hard_limit() * 3;
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        if let Some((worker, sql)) = self.on_worker(session, run) {
            let delete = worker.within(session, limit, move |conn, _| {
                Box::pin(async move {
                    let (deleted,): (i64,) = sqlx::query_as(&sql).bind(batch).fetch_one(conn).await?;
                    Ok(deleted.max(0) as u64)
                })
            });
            return delete.await;
        }
        self.conn
            .within(session, limit, move |conn, session| {
                Box::pin(session.layout().cleanup(session, conn, batch, run))
            })
            .await
    }

    /// The connection kept to the worker of the `run`-th cleanup, and the
    /// statement for its shard there; `None` when it goes through the
    /// URL's server (a single node, checks through the coordinator, or a
    /// shard on a worker that joined since start-up).
    fn on_worker(&self, session: &Session, run: usize) -> Option<(Arc<Connection>, String)> {
        let workers = self.workers.as_ref()?;
        let (node, sql) = session.layout().cleanup_on_worker(run)?;
        let mut workers = workers.lock().unwrap_or_else(PoisonError::into_inner);
        let kept =
            workers.entry(node.clone()).or_insert_with(|| Arc::new(Connection::on("cleaning up", node)));
        Some((Arc::clone(kept), sql))
    }
}
