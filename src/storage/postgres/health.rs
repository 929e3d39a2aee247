//! A connection kept open for liveness pings, and the heartbeat.
//!
//! A ping on an open connection costs one round trip however busy the host
//! is; opening one costs several, plus a backend's start-up, which on a
//! loaded host can take longer than a short timeout. The connection serves
//! pings only, so a ping never queues behind a write, and the heartbeat
//! pings it every [`WARM_EVERY`], so that it is known good (or reopened)
//! before a check needs it, and so that the recent ping latency is known.
//! Both are kept rare: on a host where Postgres shares the cores with the
//! service, each wake-up of a backend costs the service a time slice.
//!
//! Every [`BEAT_EVERY`], each instance also records itself in
//! `pglimit_instances` (on a connection of the heartbeat's own) and counts
//! the instances seen within [`ALIVE_FOR`], so that when Postgres becomes
//! unreachable it knows how many were sharing it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;

use super::connection::Connection;
use super::listener::Notifications;
use super::session::{classify, ping_writable, Session};
use crate::storage::StoreError;

/// How often an instance records itself.
pub const BEAT_EVERY: Duration = Duration::from_secs(2);
/// An instance not seen for this long (five beats) no longer counts as
/// sharing the database.
pub const ALIVE_FOR: Duration = Duration::from_secs(10);
/// How often the heartbeat pings the health connection.
const WARM_EVERY: u32 = 5;
/// The recent latency is the slowest ping of the last one to two of these.
const LATENCY_SPAN: Duration = Duration::from_secs(30);

/// Records this instance, forgets instances gone for a day, and counts the
/// others seen within `$2` milliseconds (the insert is not visible to the
/// count, which is why this instance is added on the Rust side). Also reads
/// the actions generation, to notice a missed notification (see `listener`).
const BEAT: &str = "
WITH beat AS (
    INSERT INTO pglimit_instances AS i (id, last_seen) VALUES ($1, now())
    ON CONFLICT (id) DO UPDATE SET last_seen = now()
), gone AS (
    DELETE FROM pglimit_instances WHERE last_seen < now() - interval '1 day'
)
SELECT count(*), (SELECT generation FROM pglimit_actions) FROM pglimit_instances
WHERE id <> $1 AND last_seen > now() - $2 * interval '1 millisecond'";

pub(super) struct Health {
    id: [u8; 16],
    /// For pings only, so that a ping never queues behind a write.
    conn: Connection,
    /// The heartbeat's own.
    beating: Connection,
    instances: AtomicU64,
    latency: Latency,
}

impl Health {
    /// `conn` is the first health connection, opened with the lanes.
    pub fn new(session: &Session, conn: PgConnection) -> Self {
        let (id, conn) = (rand::random(), Connection::opened("answering a ping", session, conn));
        let beating = Connection::new("beating");
        Self { id, conn, beating, instances: AtomicU64::new(1), latency: Latency::new() }
    }

    /// Instances sharing the database at the last heartbeat, this one included.
    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Acquire).max(1)
    }

    /// The slowest ping of the last [`LATENCY_SPAN`] or so.
    pub fn recent_latency(&self) -> Duration {
        self.latency.recent()
    }

    /// A ping ([`ping_writable`]) on the health connection within `budget`. If the kept
    /// connection fails (it may have been closed while idle), one fresh
    /// connection is tried in what is left of the budget.
    pub async fn ping(&self, session: &Session, budget: Duration) -> Result<(), StoreError> {
        let ping = self.conn.within_or_afresh(session, budget, |conn, _| {
            Box::pin(async move {
                let sent = Instant::now();
                ping_writable(conn).await?;
                Ok(sent.elapsed())
            })
        });
        self.latency.observe(ping.await.map_err(classify)?);
        Ok(())
    }

    /// Installs a connection known to work (a successful probe's).
    pub async fn install(&self, session: &Session, conn: PgConnection) {
        self.conn.install(session, conn).await;
    }

    /// Beats, and keeps the health connection warm, until the store is dropped.
    pub fn spawn_heartbeat(self: &Arc<Self>, session: Arc<Session>, heard: Arc<Notifications>) {
        let health: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(BEAT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut beat = 0u32;
            loop {
                every.tick().await;
                beat = beat.wrapping_add(1);
                let Some(health) = health.upgrade() else { return };
                if let Err(e) = health.beat(&session, &heard).await {
                    tracing::debug!(error = %e, "heartbeat failed");
                }
                if beat % WARM_EVERY == 1 {
                    let _ = health.ping(&session, BEAT_EVERY).await;
                }
            }
        });
    }

    async fn beat(&self, session: &Session, heard: &Notifications) -> Result<(), sqlx::Error> {
        let id = self.id;
        // A beat slower than this is no use: the others stop counting this
        // instance after ALIVE_FOR anyway.
        let beat = self
            .beating
            .within(session, BEAT_EVERY * 2, move |conn, session| Box::pin(Self::beat_on(session, conn, id)));
        let (others, generation) = beat.await?;
        let alive = others.max(0) as u64 + 1;
        self.instances.store(alive, Ordering::Release);
        crate::telemetry::instances(alive);
        heard.read(generation.max(0) as u64);
        Ok(())
    }

    /// Records this instance and reads the others and the actions generation.
    async fn beat_on(
        session: &Session,
        conn: &mut PgConnection,
        id: [u8; 16],
    ) -> Result<(i64, i64), sqlx::Error> {
        let alive_ms = ALIVE_FOR.as_millis() as i64;
        let mut tx = session.begin(conn).await?;
        let beat = sqlx::query_as(BEAT).persistent(session.keeps_statements()).bind(&id[..]).bind(alive_ms);
        let row = beat.fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }
}

/// A maximum that forgets: the slowest sample of the current span and of
/// the one before, so one slow moment widens ping budgets for at most two
/// spans, whatever the traffic.
struct Latency {
    epoch: Instant,
    /// Span number, and the slowest sample in it and in the one before, in µs.
    spans: std::sync::Mutex<(u64, u64, u64)>,
}

impl Latency {
    fn new() -> Self {
        Self { epoch: Instant::now(), spans: std::sync::Mutex::new((0, 0, 0)) }
    }

    fn span_now(&self) -> u64 {
        (self.epoch.elapsed().as_millis() / LATENCY_SPAN.as_millis()) as u64
    }

    /// The spans as of `now`: older ones forgotten.
    fn rolled(spans: (u64, u64, u64), now: u64) -> (u64, u64, u64) {
        match now.saturating_sub(spans.0) {
            0 => spans,
            1 => (now, spans.2, 0),
            _ => (now, 0, 0),
        }
    }

    fn observe(&self, sample: Duration) {
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let (span, previous, current) = Self::rolled(*spans, self.span_now());
        let sample = sample.as_micros().min(u128::from(u64::MAX)) as u64;
        *spans = (span, previous, current.max(sample));
    }

    fn recent(&self) -> Duration {
        let spans = *self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let (_, previous, current) = Self::rolled(spans, self.span_now());
        Duration::from_micros(previous.max(current))
    }
}
