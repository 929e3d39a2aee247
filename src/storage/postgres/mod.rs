//! Counters in PostgreSQL: exact across any number of service instances.
//!
//! Checks are queued to a fixed set of *lanes* ([`lane`]), each a task that
//! owns one connection and sends the checks waiting for it as one call of
//! `pglimit_check_batch` (see `migrations/`): one round trip and one
//! transaction for the whole batch, each check still decided on its own, all
//! or nothing. The first lane takes every check while it keeps up; the
//! others are spares for when its call stalls (see `PgStore::route`).
//! Expired rows are deleted by a bounded background delete started on a
//! sample of checks, so no cron is needed.

mod lane;
mod statements;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::fallback::OVERLOAD_FACTOR;
use super::{CheckBatch, Checked, Store, StoreError};
use lane::{lane, Busy, Job};

/// How the Postgres store connects and cleans up.
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    /// Connections, one per lane.
    pub connections: u32,
    /// The caller's budget for a check; server-side limits derive from it.
    pub timeout: Duration,
    /// Fraction of checks that start a cleanup of expired rows.
    pub cleanup_rate: f64,
    /// Most rows one cleanup deletes.
    pub cleanup_batch: i64,
    /// Whether the counters table should be UNLOGGED.
    pub unlogged: bool,
}

/// A handle on the lanes; cheap to clone. The lanes stop when the last
/// handle is dropped.
#[derive(Clone)]
pub struct PgStore {
    /// One queue per lane; the first is the main lane.
    lanes: Arc<[LaneHandle]>,
    shared: Arc<Shared>,
}

/// What the router sees of a lane: its queue, and since when its current
/// call has been running.
struct LaneHandle {
    queue: mpsc::Sender<Job>,
    busy: Arc<Busy>,
}

/// The main lane counts as stalled (and new checks go to a spare lane) once
/// its current call has run this long. Measured calls take 0.3–1 ms under
/// full load on 2 cores (a commit's WAL flush most of it), so this is
/// well past normal and well short of any timeout.
const SPILL_AFTER: Duration = Duration::from_millis(5);

struct Shared {
    connect: PgConnectOptions,
    options: PgStoreOptions,
    /// Bumped when Postgres comes back, so lanes drop connections from before.
    generation: AtomicU64,
    cleaning: AtomicBool,
    cleanup_conn: Mutex<Option<PgConnection>>,
}

impl PgStore {
    /// Connects, applies the migrations, and starts the lanes.
    pub async fn connect(url: &str, options: PgStoreOptions) -> Result<Self, sqlx::Error> {
        let connect = with_session_settings(url.parse()?, options.timeout);
        let mut conn = PgConnection::connect_with(&connect).await?;
        sqlx::migrate!("./migrations").run(&mut conn).await?;
        set_persistence(&mut conn, options.unlogged).await?;
        conn.close().await?;

        let shared = Arc::new(Shared {
            connect,
            options,
            generation: AtomicU64::new(0),
            cleaning: AtomicBool::new(false),
            cleanup_conn: Mutex::new(None),
        });
        // Connect every lane now: a burst on a cold start would otherwise
        // queue behind a storm of connection handshakes.
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..shared.options.connections.max(1) {
            let shared = Arc::clone(&shared);
            opening.spawn(async move { shared.open().await });
        }
        let mut lanes = Vec::new();
        while let Some(opened) = opening.join_next().await {
            let conn = opened.map_err(|e| sqlx::Error::Protocol(format!("lane start-up failed: {e}")))??;
            let (jobs, queue) = mpsc::channel(1024);
            let busy = Arc::new(Busy::default());
            tokio::spawn(lane(Arc::clone(&shared), queue, Some((conn, 0)), Arc::clone(&busy)));
            lanes.push(LaneHandle { queue: jobs, busy });
        }
        Ok(Self { lanes: lanes.into(), shared })
    }

    /// Decides `batch` as if the database clock read `now`. For replaying
    /// traces in tests; the service always uses the database's own clock.
    pub async fn check_as_of(&self, batch: &CheckBatch, now: DateTime<Utc>) -> Result<Checked, StoreError> {
        self.submit(batch, Some(now)).await
    }

    /// Deletes up to `cleanup_batch` expired rows; returns how many it deleted.
    /// Rows locked by a check in progress are skipped, never waited for.
    pub async fn cleanup(&self) -> Result<u64, sqlx::Error> {
        let mut slot = self.shared.cleanup_conn.lock().await;
        let conn = match slot.as_mut() {
            Some(conn) => conn,
            None => slot.insert(self.shared.open().await?),
        };
        let done = sqlx::query(
            "DELETE FROM pglimit_buckets WHERE key IN (
                 SELECT key FROM pglimit_buckets WHERE reset_at <= now()
                 ORDER BY reset_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(self.shared.options.cleanup_batch)
        .execute(&mut *conn)
        .await;
        if done.is_err() {
            *slot = None;
        }
        Ok(done?.rows_affected())
    }

    async fn submit(&self, batch: &CheckBatch, now: Option<DateTime<Utc>>) -> Result<Checked, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { batch: batch.clone(), now, reply };
        let Some(lane) = self.route(batch) else {
            return Err(StoreError::Unreachable("no postgres lanes".into()));
        };
        if lane.queue.send(job).await.is_err() {
            return Err(StoreError::Unreachable("the postgres lanes have stopped".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Unreachable("a postgres lane stopped mid-check".into())))
    }

    /// Picks the lane for a check. Every check goes to the main lane unless
    /// its call has stalled for [`SPILL_AFTER`]; then to a spare lane chosen
    /// by the check's first key.
    ///
    /// One lane rather than a share each, because a commit's cost is mostly
    /// per call, not per check (its WAL flush): concurrent checks queued on
    /// one lane make one large batch and one flush, where spread over four
    /// lanes they made four small ones (measured on 2 cores, random keys at
    /// 32 connections, alternating runs on one cluster: 1 lane 37k checks/s,
    /// 2 lanes 31k, 4 lanes 26k; see the README's Performance section). The spares keep a row lock held by some stuck
    /// transaction from stalling the whole instance: after [`SPILL_AFTER`],
    /// new checks go around it. Choosing the spare by key sends a hot key
    /// always to the same spare, so it is not spread over all of them.
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

    fn maybe_start_cleanup(&self) {
        if rand::random::<f64>() >= self.shared.options.cleanup_rate {
            return;
        }
        if self.shared.cleaning.swap(true, Ordering::AcqRel) {
            return; // one at a time per instance
        }
        let store = self.clone();
        tokio::spawn(async move {
            match store.cleanup().await {
                Ok(n) => tracing::debug!(deleted = n, "cleanup of expired buckets"),
                Err(e) => tracing::debug!(error = %e, "cleanup of expired buckets failed"),
            }
            store.shared.cleaning.store(false, Ordering::Release);
        });
    }
}

/// Makes the counters table UNLOGGED or logged as configured. UNLOGGED
/// skips the write-ahead log: writes are cheaper, but PostgreSQL empties the
/// table after a crash and does not replicate it, so every counter restarts
/// from zero after a crash or a failover.
///
/// Switching rewrites the table under an exclusive lock, which would stall
/// every instance's checks; so it is done here only while the table is
/// empty (a new install). Otherwise start-up stops and says what to run:
/// an operator's decision, at a quiet moment, and not a flip-flop between
/// instances of a rolling deploy that disagree.
async fn set_persistence(conn: &mut PgConnection, unlogged: bool) -> Result<(), sqlx::Error> {
    let (persistence, empty): (i8, bool) = sqlx::query_as(
        "SELECT relpersistence::\"char\", NOT EXISTS (SELECT 1 FROM pglimit_buckets)
         FROM pg_class WHERE oid = 'pglimit_buckets'::regclass",
    )
    .fetch_one(&mut *conn)
    .await?;
    if (persistence as u8 == b'u') == unlogged {
        return Ok(());
    }
    let to = if unlogged { "UNLOGGED" } else { "LOGGED" };
    let alter = format!("ALTER TABLE pglimit_buckets SET {to}");
    if !empty {
        let msg = format!(
            "PGLIMIT_UNLOGGED={unlogged} but the counters table holds counters and is not {to}: \
             run `{alter}` at a quiet moment (it rewrites the table under an exclusive lock), \
             or change PGLIMIT_UNLOGGED"
        );
        return Err(sqlx::Error::Configuration(msg.into()));
    }
    tracing::info!(to, "setting the (empty) counters table's persistence from PGLIMIT_UNLOGGED");
    sqlx::query(&alter).execute(&mut *conn).await?;
    Ok(())
}

impl Store for PgStore {
    async fn check(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        let checked = self.submit(batch, None).await?;
        self.maybe_start_cleanup();
        Ok(checked)
    }

    /// Opens a fresh connection and runs `SELECT 1`; on success every lane
    /// will reconnect before its next check, so no connection from before an
    /// outage is reused.
    async fn probe(&self) -> Result<(), StoreError> {
        self.ping().await?;
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// A fresh connection and `SELECT 1`: the lanes' connections may all be
    /// busy (or dead), so they cannot tell.
    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.shared.open().await.map_err(classify)?;
        sqlx::query("SELECT 1").execute(&mut conn).await.map_err(classify)?;
        let _ = conn.close().await;
        Ok(())
    }
}

impl Shared {
    fn hard_limit(&self) -> Duration {
        hard_limit(self.options.timeout)
    }

    async fn open(&self) -> Result<PgConnection, sqlx::Error> {
        match tokio::time::timeout(self.hard_limit(), PgConnection::connect_with(&self.connect)).await {
            Ok(conn) => conn,
            Err(_) => Err(timed_out("connecting")),
        }
    }
}

/// Session settings: read committed whatever the database default (the
/// function relies on each statement seeing the latest committed rows), and
/// server-side limits so that a row lock held by some stuck transaction
/// fails the batch instead of holding a lane for ever, and an abandoned
/// statement does not run on. Both sit just under the longest a caller
/// waits ([`OVERLOAD_FACTOR`] × the timeout): a wait for a hot row is
/// normal under load and must not fail checks early (a failed check is
/// answered by the fallback, which is not exact), but a statement must be
/// over before its caller gives up on it, or it could commit a count for a
/// check already answered from memory.
fn with_session_settings(connect: PgConnectOptions, timeout: Duration) -> PgConnectOptions {
    let waits_ms = (timeout * OVERLOAD_FACTOR).as_millis();
    let lock_ms = waits_ms * 9 / 10;
    let statement_ms = waits_ms * 9 / 10;
    connect.options([
        ("default_transaction_isolation", "read\\ committed".to_string()),
        // The statements take arrays whose sizes vary; a generic plan serves
        // them all and saves re-planning on every call. But a plan is made
        // once per connection, from the statistics of that moment: made
        // while the table is still empty, it would scan the whole table for
        // ever after (measured: 4x slower at 10,000 keys). No statement here
        // ever wants a sequential scan of the counters, so rule them out.
        ("plan_cache_mode", "force_generic_plan".to_string()),
        ("enable_seqscan", "off".to_string()),
        ("lock_timeout", lock_ms.to_string()),
        ("statement_timeout", statement_ms.to_string()),
    ])
}

/// How long a lane waits on the server before it drops the connection: as
/// long as a caller may wait while Postgres is busy ([`OVERLOAD_FACTOR`] ×
/// the timeout), so a lane never abandons a call its caller still awaits.
/// The fallback decides what the caller gets; this only frees a lane stuck
/// on a dead or paused server.
fn hard_limit(timeout: Duration) -> Duration {
    (timeout * OVERLOAD_FACTOR).max(Duration::from_secs(2))
}

fn timed_out(what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("postgres timed out {what}")))
}

/// Connection-level failures mean Postgres is away for everyone; anything
/// else (an error the server answered with, a row we could not decode)
/// concerns this batch only and must not switch the whole instance to memory.
fn classify(e: sqlx::Error) -> StoreError {
    let server_going_away = |code: &str| {
        // 08: connection exception, 53: insufficient resources,
        // 57P: shutdown, crash, starting up (not 57014, a statement timeout).
        ["08", "53", "57P"].iter().any(|class| code.starts_with(class))
    };
    let unreachable = match &e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| server_going_away(&c)),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            true
        }
        sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    if unreachable {
        StoreError::Unreachable(e.to_string())
    } else {
        StoreError::Failed(e.to_string())
    }
}
