//! A connection kept open for liveness pings, and the heartbeat.
//!
//! A ping on an open connection answers in one round trip however busy
//! the machine is; opening a fresh one takes several, plus a backend's
//! start-up, and was often slower than a short timeout on a loaded host.
//! The connection serves pings only, so a ping never queues behind a write.
//!
//! Every [`BEAT_EVERY`], each instance records itself in `pglimit_instances`
//! and counts the instances seen within [`ALIVE_FOR`], so that when Postgres
//! becomes unreachable it knows how many were sharing it. The heartbeat
//! task owns a connection of its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::PgConnection;
use tokio::sync::Mutex;

use super::session::{classify, timed_out, Session};
use crate::storage::StoreError;

/// How often an instance records itself.
pub const BEAT_EVERY: Duration = Duration::from_secs(1);
/// An instance not seen for this long no longer counts as sharing the database.
pub const ALIVE_FOR: Duration = Duration::from_secs(5);

/// Records this instance, forgets instances gone for a day, and counts the
/// others seen within `$2` milliseconds (the insert is not visible to the
/// count, which is why this instance is added on the Rust side).
const BEAT: &str = "
WITH beat AS (
    INSERT INTO pglimit_instances AS i (id, last_seen) VALUES ($1, now())
    ON CONFLICT (id) DO UPDATE SET last_seen = now()
), gone AS (
    DELETE FROM pglimit_instances WHERE last_seen < now() - interval '1 day'
)
SELECT count(*) FROM pglimit_instances
WHERE id <> $1 AND last_seen > now() - $2 * interval '1 millisecond'";

pub(super) struct Health {
    id: [u8; 16],
    /// Taken out while in use, put back only after a success: a connection
    /// whose call failed or timed out is in an unknown state.
    conn: Mutex<Option<PgConnection>>,
    instances: AtomicU64,
}

impl Health {
    /// `conn` is the first health connection, opened with the lanes.
    pub fn new(conn: PgConnection) -> Self {
        Self { id: rand::random(), conn: Mutex::new(Some(conn)), instances: AtomicU64::new(1) }
    }

    /// Instances sharing the database at the last heartbeat, this one included.
    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Acquire).max(1)
    }

    /// `SELECT 1` on the health connection (opened if there is none).
    pub async fn ping(&self, session: &Session, budget: Duration) -> Result<(), StoreError> {
        let ping = async {
            let mut slot = self.conn.lock().await;
            // Taken out while in use: if this is cut short, it is not put back.
            let mut conn = match slot.take() {
                Some(conn) => conn,
                None => session.open().await?,
            };
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            *slot = Some(conn);
            Ok(())
        };
        match tokio::time::timeout(budget, ping).await {
            Ok(result) => result.map_err(classify),
            Err(_) => Err(classify(timed_out("answering a ping"))),
        }
    }

    /// Installs a connection known to work (a successful probe's).
    pub async fn install(&self, conn: PgConnection) {
        *self.conn.lock().await = Some(conn);
    }

    /// Beats until the store is dropped.
    pub fn spawn_heartbeat(self: &Arc<Self>, session: Arc<Session>) {
        let health: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(BEAT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut conn = None;
            loop {
                every.tick().await;
                let Some(health) = health.upgrade() else { return };
                match tokio::time::timeout(session.hard_limit(), health.beat(&session, &mut conn)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(error = %e, "heartbeat failed"),
                    Err(_) => conn = None, // its state is unknown: start afresh
                }
            }
        });
    }

    async fn beat(&self, session: &Session, slot: &mut Option<PgConnection>) -> Result<(), sqlx::Error> {
        let conn = match slot {
            Some(conn) => conn,
            None => slot.insert(session.open().await?),
        };
        let alive_ms = ALIVE_FOR.as_millis() as i64;
        let beat = sqlx::query_as::<_, (i64,)>(BEAT).bind(&self.id[..]).bind(alive_ms).fetch_one(conn).await;
        let (others,) = beat.inspect_err(|_| *slot = None)?;
        self.instances.store(others.max(0) as u64 + 1, Ordering::Release);
        Ok(())
    }
}
