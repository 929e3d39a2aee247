//! Counters in PostgreSQL: exact across any number of service instances.
//!
//! Checks are queued to a *lane* ([`lane`]), a task that owns a few
//! connections and sends the checks waiting for it as one call (see
//! [`layout`]): one round trip and one transaction for the whole batch,
//! each check still decided on its own, all or nothing. It keeps a call in
//! flight on each connection, so that commits overlap, and holds back a
//! check only while a call in flight has one of its keys. In Citus mode there
//! is one lane per connection, and each worker's checks go to a lane of
//! their own. Expired rows are deleted by a bounded background delete started
//! on a sample of checks ([`cleanup`]), so no cron is needed.

mod absorb;
mod actions;
mod audit;
mod changes;
mod citus;
mod cleanup;
mod connection;
mod denials;
mod health;
mod inspect;
mod lane;
mod layout;
mod leases;
mod listener;
mod literal;
mod node;
mod overrides;
mod policies;
mod pooler;
mod primary;
mod schema;
mod session;
mod statements;
mod template;
mod tls;
mod upsert;
mod zones;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::{Answer, Check, Stale, Store, StoreError};
use actions::ActionConn;
pub use citus::{Citus, CitusChecks, CONCURRENCY_ON_CITUS};
use cleanup::Cleanup;
use health::Health;
pub use health::{ALIVE_FOR, BEAT_EVERY};
use lane::LaneHandle;
use lane::Task;
use listener::Notifications;
pub use policies::push as push_policies;
pub use pooler::Pooler;
pub use schema::functions_schema;
use session::Session;
pub use session::{migrate, Reach};

/// How the Postgres store connects and cleans up.
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    /// Connections for checks.
    pub connections: u32,
    /// Calls in flight at once (at most `connections`); the other
    /// connections are spares for when calls stall.
    pub pipeline: u32,
    /// The longest a caller waits for a check; every server-side limit ends
    /// before it.
    pub longest_wait: Duration,
    /// `PGLIMIT_DB_TIMEOUT_MS`: how soon a caller may stop waiting for Postgres.
    pub patience: Duration,
    /// Fraction of checks that start a cleanup of expired rows.
    pub cleanup_rate: f64,
    /// Most rows one cleanup deletes.
    pub cleanup_batch: i64,
    /// How long an audit row is kept before a cleanup deletes it.
    pub audit_retention: Duration,
    /// Whether the counters table should be UNLOGGED.
    pub unlogged: bool,
    /// Whether to distribute the counters over a Citus cluster.
    pub citus: Citus,
    /// In Citus mode, whether checks go straight to the workers.
    pub citus_checks: CitusChecks,
    /// Through which pooler, and into which schema.
    pub reach: Reach,
}

/// Connections an instance keeps besides its `connections` for checks: the
/// health pings', the heartbeat's, the cleanup's, the actions' and, unless
/// behind a transaction pooler, the listener's. Writing back after an
/// outage opens one more for as long as it takes.
pub fn kept_connections(pooler: Pooler) -> u32 {
    if pooler == Pooler::Transaction {
        4
    } else {
        5
    }
}

/// A handle on the lanes; cheap to clone. The lanes stop when the last
/// handle is dropped.
#[derive(Clone)]
pub struct PgStore {
    /// One lane, or in Citus mode one per connection.
    lanes: Arc<[LaneHandle]>,
    session: Arc<Session>,
    cleanup: Arc<Cleanup>,
    health: Arc<Health>,
    actions: Arc<ActionConn>,
    heard: Arc<Notifications>,
    /// Whether the listener runs (not behind a transaction pooler); if
    /// not, overrides changes are polled for.
    listening: bool,
    /// Dropped with the last handle, which stops the listener.
    _listening: Arc<watch::Sender<()>>,
}

impl PgStore {
    /// Connects, applies the migrations, and starts the lanes.
    pub async fn connect(url: &str, options: PgStoreOptions) -> Result<Self, sqlx::Error> {
        let listen = options.reach.pooler != Pooler::Transaction;
        let session =
            Arc::new(Session::new(url, options.longest_wait, options.reach)?.with_patience(options.patience));
        session.prepare(options.unlogged, options.citus).await?;
        let targets = session.layout().lanes(options.connections.max(1) as usize, options.citus_checks);
        let (lanes, health_conn) = LaneHandle::start_all(&session, targets, options.pipeline).await?;
        let on_workers = options.citus_checks == CitusChecks::Workers;
        let cleanup = Arc::new(Cleanup::new(
            options.cleanup_rate,
            options.cleanup_batch,
            on_workers,
            options.audit_retention,
        ));
        let health = Arc::new(Health::new(&session, health_conn));
        let heard = Arc::new(Notifications::default());
        health.spawn_heartbeat(Arc::clone(&session), Arc::clone(&heard));
        let (listening, closed) = watch::channel(());
        // Behind a transaction pooler a LISTEN would end with its transaction:
        // actions reach this instance through the heartbeat's generation read.
        if listen {
            listener::spawn(session.url_options().clone(), Arc::clone(&heard), closed);
        }
        let (actions, _listening) = (Arc::new(ActionConn::new()), Arc::new(listening));
        Ok(Self { lanes, session, cleanup, health, actions, heard, listening: listen, _listening })
    }

    /// Decides `batch` as if the database clock read `now`. For replaying
    /// traces in tests; the service always uses the database's own clock.
    pub async fn check_as_of(&self, batch: &Check, now: DateTime<Utc>) -> Result<Answer, StoreError> {
        self.submit(batch, Some(now)).await
    }

    /// Makes the store behave as if its server did not list `zone` in
    /// `pg_timezone_names`, until a reconnect reads them again: for tests,
    /// which have no server with tzdata older than pglimit's at hand.
    #[doc(hidden)]
    pub fn forget_zone(&self, zone: &str) {
        self.session.zones().forget(zone);
    }

    /// Deletes up to the configured number of expired rows now; returns how
    /// many it deleted. Checks also start this on their own.
    pub async fn cleanup(&self) -> Result<u64, sqlx::Error> {
        self.cleanup.run(&self.session).await
    }

    async fn submit(&self, batch: &Check, now: Option<DateTime<Utc>>) -> Result<Answer, StoreError> {
        let concurrency =
            batch.buckets.iter().any(|b| b.algorithm == crate::algorithm::Algorithm::Concurrency);
        if concurrency && !self.session.layout().takes_leases() {
            // Refused alone, before the lane: it would fail the call of every check batched with it.
            return Err(StoreError::Failed(CONCURRENCY_ON_CITUS.into()));
        }
        if let Some(zone) = self.session.zones().first_unknown(batch) {
            // As above: the limiter refuses these first; this is for any other caller.
            return Err(StoreError::Failed(format!(
                "the PostgreSQL server does not know time zone {zone:?}"
            )));
        }
        if let Some(parts) = self.session.layout().split(batch) {
            return citus::across::submit(&self.lanes, parts, batch, now).await;
        }
        let Some(lane) = self.lanes.first() else {
            return Err(StoreError::Unreachable("no postgres lanes".into()));
        };
        lane::answer(lane.enqueue(batch.clone(), now, Task::Check).await?).await
    }
}

/// A single node's text of a statement template (`upsert.sql`,
/// `hot_upsert.sql`, `policy_upsert.sql`), for tests that send it directly.
#[doc(hidden)]
pub fn single_node_statement(name: &str) -> Option<&'static str> {
    template::single(name).ok()
}

impl Store for PgStore {
    fn keeps_leases(&self) -> bool {
        self.session.layout().takes_leases()
    }

    fn knows_zone(&self, zone: &str) -> bool {
        self.session.zones().knows(zone)
    }

    async fn check(&self, batch: &Check) -> Result<Answer, StoreError> {
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
