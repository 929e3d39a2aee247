//! Counters in PostgreSQL: exact across any number of service instances.
//!
//! Checks are queued to a fixed set of *lanes* ([`lane`]), each a task that
//! owns one connection and sends the checks waiting for it as one call (see
//! [`statements`]): one round trip and one transaction for the whole batch,
//! each check still decided on its own, all or nothing. The first lane takes
//! every check while it keeps up; the others are spares for when its call
//! stalls (see `PgStore::route`). Expired rows are deleted by a bounded
//! background delete started on a sample of checks ([`cleanup`]), so no cron
//! is needed.

mod absorb;
mod actions;
mod citus;
mod cleanup;
mod health;
mod lane;
mod listener;
mod session;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot, watch};

use super::{
    Actions, Answer, Block, BlockTarget, CheckBatch, Held, Key, Primary, Stale, Store, StoreError, Unabsorbed,
};
use actions::ActionConn;
pub use citus::Citus;
use cleanup::Cleanup;
use health::Health;
use lane::{lane, Busy, Job, Task};
use listener::Heard;
pub use session::migrate;
use session::{classify, Session};

/// How the Postgres store connects and cleans up.
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    /// Connections, one per lane.
    pub connections: u32,
    /// The longest a caller waits for a check; every server-side limit ends
    /// before it.
    pub longest_wait: Duration,
    /// Fraction of checks that start a cleanup of expired rows.
    pub cleanup_rate: f64,
    /// Most rows one cleanup deletes.
    pub cleanup_batch: i64,
    /// Whether the counters table should be UNLOGGED.
    pub unlogged: bool,
    /// Whether to distribute the counters over a Citus cluster.
    pub citus: Citus,
}

/// A handle on the lanes; cheap to clone. The lanes stop when the last
/// handle is dropped.
#[derive(Clone)]
pub struct PgStore {
    /// One queue per lane; the first is the main lane.
    lanes: Arc<[LaneHandle]>,
    session: Arc<Session>,
    cleanup: Arc<Cleanup>,
    health: Arc<Health>,
    actions: Arc<ActionConn>,
    heard: Arc<Heard>,
    /// Dropped with the last handle, which stops the listener.
    _listening: Arc<watch::Sender<()>>,
}

/// What the router sees of a lane: its queue, and since when its current
/// call has been running.
struct LaneHandle {
    queue: mpsc::Sender<Job>,
    busy: Arc<Busy>,
}

/// The main lane counts as stalled (and new checks go to a spare lane) once
/// its current call has run this long: far longer than a call takes under
/// full load, far shorter than any timeout (docs/performance.md).
const SPILL_AFTER: Duration = Duration::from_millis(5);

impl PgStore {
    /// Connects, applies the migrations, and starts the lanes.
    pub async fn connect(url: &str, options: PgStoreOptions) -> Result<Self, sqlx::Error> {
        let session = Arc::new(Session::new(url, options.longest_wait)?);
        session.prepare(options.unlogged, options.citus).await?;
        // Connect every lane, and the health connection, now and together:
        // a burst on a cold start would otherwise queue behind a storm of
        // connection handshakes.
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..=options.connections.max(1) {
            let session = Arc::clone(&session);
            opening.spawn(async move { session.open().await });
        }
        let (mut lanes, mut health_conn) = (Vec::new(), None);
        while let Some(opened) = opening.join_next().await {
            let conn = opened.map_err(|e| sqlx::Error::Protocol(format!("start-up failed: {e}")))??;
            if health_conn.is_none() {
                health_conn = Some(conn);
                continue;
            }
            let (jobs, queue) = mpsc::channel(1024);
            let busy = Arc::new(Busy::default());
            tokio::spawn(lane(Arc::clone(&session), queue, conn, Arc::clone(&busy)));
            lanes.push(LaneHandle { queue: jobs, busy });
        }
        let cleanup = Arc::new(Cleanup::new(options.cleanup_rate, options.cleanup_batch));
        let health_conn = health_conn.ok_or_else(|| sqlx::Error::Protocol("no health connection".into()))?;
        let health = Arc::new(Health::new(health_conn));
        let heard = Arc::new(Heard::default());
        health.spawn_heartbeat(Arc::clone(&session), Arc::clone(&heard));
        let (listening, closed) = watch::channel(());
        listener::spawn(session.connect_options(), Arc::clone(&heard), closed);
        let (actions, _listening) = (Arc::new(ActionConn::new()), Arc::new(listening));
        Ok(Self { lanes: lanes.into(), session, cleanup, health, actions, heard, _listening })
    }

    /// Decides `batch` as if the database clock read `now`. For replaying
    /// traces in tests; the service always uses the database's own clock.
    pub async fn check_as_of(&self, batch: &CheckBatch, now: DateTime<Utc>) -> Result<Answer, StoreError> {
        self.submit(batch, Some(now)).await
    }

    /// Deletes up to the configured number of expired rows now; returns how
    /// many it deleted. Checks also start this on their own.
    pub async fn cleanup(&self) -> Result<u64, sqlx::Error> {
        self.cleanup.run(&self.session).await
    }

    async fn submit(&self, batch: &CheckBatch, now: Option<DateTime<Utc>>) -> Result<Answer, StoreError> {
        if let Some(routes) = self.session.routes() {
            return self.submit_parts(citus::split(routes, batch), batch, now).await;
        }
        let Some(lane) = self.route(batch) else {
            return Err(StoreError::Unreachable("no postgres lanes".into()));
        };
        Self::answer(Self::enqueue(lane, batch.clone(), now, Task::Check).await?).await
    }

    /// Citus mode: each part of a check on the lane of its worker, all at
    /// once; if any part is denied or fails, the parts that took their cost
    /// give it back before the check is answered.
    async fn submit_parts(
        &self,
        parts: Vec<citus::Part>,
        batch: &CheckBatch,
        now: Option<DateTime<Utc>>,
    ) -> Result<Answer, StoreError> {
        // A worker's checks on lanes of their own: one call per worker per batch.
        let lane_of =
            |part: &citus::Part| &self.lanes[part.worker.unsigned_abs() as usize % self.lanes.len()];
        let mut pending = Vec::with_capacity(parts.len());
        for part in &parts {
            pending.push(Self::enqueue(lane_of(part), part.batch.clone(), now, Task::Check).await);
        }
        let mut answers = Vec::with_capacity(parts.len());
        for sent in pending {
            answers.push(match sent {
                Ok(answer) => Self::answer(answer).await,
                Err(e) => Err(e),
            });
        }
        let whole = answers.iter().all(|a| a.as_ref().is_ok_and(Answer::allowed));
        let took: Vec<bool> =
            answers.iter().map(|a| !whole && a.as_ref().is_ok_and(Answer::allowed)).collect();
        let given_back = parts.iter().zip(&answers).zip(&took).filter(|(_, &t)| t);
        Self::give_back(
            given_back.filter_map(|((part, answer), _)| Some((lane_of(part), part, answer.as_ref().ok()?))),
        )
        .await;
        let answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(citus::merge(batch, &parts, answers, &took))
    }

    /// Refunds, on each part's lane, what the part took, as its answer says.
    async fn give_back<'a>(taken: impl Iterator<Item = (&'a LaneHandle, &'a citus::Part, &'a Answer)>) {
        let mut refunds = Vec::new();
        for (lane, part, answer) in taken {
            let task = Task::Refund(answer.clone());
            refunds.push(Self::enqueue(lane, part.batch.clone(), None, task).await);
        }
        for refund in refunds {
            if let Err(e) = async { Self::answer(refund?).await }.await {
                // What was not given back stays counted: a bucket may deny
                // early until its window ends, never admit too much.
                tracing::warn!(error = %e, "Citus: a refund failed");
            }
        }
    }

    /// Queues a job; returns where its answer will come.
    async fn enqueue(
        lane: &LaneHandle,
        batch: CheckBatch,
        now: Option<DateTime<Utc>>,
        task: Task,
    ) -> Result<oneshot::Receiver<Result<Answer, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        if lane.queue.send(Job { batch, now, task, reply }).await.is_err() {
            return Err(StoreError::Unreachable("the postgres lanes have stopped".into()));
        }
        Ok(answer)
    }

    async fn answer(answer: oneshot::Receiver<Result<Answer, StoreError>>) -> Result<Answer, StoreError> {
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Unreachable("a postgres lane stopped mid-check".into())))
    }

    /// Picks the lane for a check: the main lane unless its call has stalled
    /// for [`SPILL_AFTER`], then a spare chosen by the check's first key.
    ///
    /// One lane rather than a share each, because a commit's cost is mostly
    /// per call, not per check (its WAL flush): checks queued on one lane
    /// make one large batch and one flush where several lanes made several
    /// small ones. The spares keep a row lock held by some stuck transaction
    /// from stalling the whole instance. Choosing the spare by key sends a
    /// hot key always to the same spare, so it is not spread over all of them.
    fn route(&self, batch: &CheckBatch) -> Option<&LaneHandle> {
        let (main, spares) = self.lanes.split_first()?;
        if spares.is_empty() || !main.busy.stalled(SPILL_AFTER) {
            return Some(main);
        }
        let head = batch.buckets.first().map_or([0; 8], |b| {
            let mut head = [0; 8];
            head.copy_from_slice(&b.key[..8]);
            head
        });
        spares.get((u64::from_le_bytes(head) % spares.len() as u64) as usize)
    }
}

impl Store for PgStore {
    async fn check(&self, batch: &CheckBatch) -> Result<Answer, StoreError> {
        let answer = self.submit(batch, None).await?;
        self.cleanup.maybe_start(&self.session);
        Ok(answer)
    }

    fn instances(&self) -> u64 {
        self.health.instances()
    }

    fn take_stale(&self) -> Option<Stale> {
        self.heard.take()
    }

    fn actions_heard(&self) -> u64 {
        self.heard.generation()
    }
}

impl Actions for PgStore {
    async fn reset(&self, keys: &[Key]) -> Result<(), StoreError> {
        self.actions.reset(&self.session, keys).await
    }

    async fn block(
        &self,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.actions.block(&self.session, targets, duration, reason).await
    }

    async fn unblock(&self, keys: &[Key]) -> Result<u64, StoreError> {
        self.actions.unblock(&self.session, keys).await
    }

    async fn blocks(&self, limit: u32) -> Result<Vec<Block>, StoreError> {
        self.actions.list(&self.session, limit).await
    }
}

impl Primary for PgStore {
    /// `SELECT 1` on the connection kept for it: the lanes' connections may
    /// all be busy (or dead), so they cannot tell.
    async fn ping(&self, budget: Duration) -> Result<(), StoreError> {
        self.health.ping(&self.session, budget).await
    }

    /// A fresh connection and `SELECT 1`; on success every lane reconnects
    /// before its next check, so no connection from before an outage is
    /// reused, and the fresh one becomes the health connection.
    ///
    /// In Citus mode, every route is pinged through the coordinator: the
    /// coordinator answering says nothing of the workers.
    async fn probe(&self) -> Result<(), StoreError> {
        let mut conn = self.session.open().await.map_err(classify)?;
        sqlx::query("SELECT 1").execute(&mut conn).await.map_err(classify)?;
        for &route in self.session.routes().map_or(&[][..], |r| r.all()) {
            sqlx::query("SELECT pglimit_ping_route($1)")
                .bind(route)
                .execute(&mut conn)
                .await
                .map_err(classify)?;
        }
        self.session.renew();
        self.health.install(conn).await;
        Ok(())
    }

    fn recent_latency(&self) -> Duration {
        self.health.recent_latency()
    }

    /// On a connection of its own, closed after, so that a chunk cut short
    /// leaves no transaction behind.
    async fn absorb(&self, outage: Vec<Held>) -> Result<(), Unabsorbed> {
        let mut conn = match self.session.open().await {
            Ok(conn) => conn,
            Err(e) => return Err(Unabsorbed { error: classify(e), left: outage }),
        };
        let result =
            absorb::absorb_all(&mut conn, outage, self.session.hard_limit(), self.session.routes()).await;
        let _ = conn.close().await;
        result.map_err(|(e, left)| Unabsorbed { error: classify(e), left })
    }
}
