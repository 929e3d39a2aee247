//! Counters in PostgreSQL: exact across any number of service instances.
//!
//! A check is one call of the `pglimit_check` SQL function (see
//! `migrations/`): one round trip and one transaction whatever the number of
//! buckets. Checks are queued to a fixed set of *lanes*, each a task that owns
//! one connection. Owning the connection (rather than borrowing from a pool)
//! keeps a check to exactly one round trip: a pool would ping every
//! connection it takes back. Expired rows are deleted by a bounded
//! background delete started on a sample of checks, so no cron is needed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{BucketState, CheckBatch, Checked, Store, StoreError, StoreKind};

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
}

/// One row of `pglimit_check`: index in the batch, allowed, remaining,
/// reset_at, retry_at, now.
type CheckRow = (i32, bool, i64, DateTime<Utc>, Option<DateTime<Utc>>, DateTime<Utc>);

type Reply = oneshot::Sender<Result<Checked, sqlx::Error>>;

/// A check for a lane: the batch, the clock to use (`None`: the database's
/// `now()`), and where to send the answer.
type Job = (CheckBatch, Option<DateTime<Utc>>, Reply);

/// A handle on the lanes; cheap to clone. The lanes stop when the last
/// handle is dropped.
#[derive(Clone)]
pub struct PgStore {
    jobs: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

struct Shared {
    connect: PgConnectOptions,
    options: PgStoreOptions,
    queue: Mutex<mpsc::Receiver<Job>>,
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
        conn.close().await?;

        let (jobs, queue) = mpsc::channel(4096);
        let shared = Arc::new(Shared {
            connect,
            options,
            queue: Mutex::new(queue),
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
        while let Some(opened) = opening.join_next().await {
            let conn = opened.map_err(|e| sqlx::Error::Protocol(format!("lane start-up failed: {e}")))??;
            tokio::spawn(lane(Arc::clone(&shared), Some((conn, 0))));
        }
        Ok(Self { jobs, shared })
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

impl PgStore {
    /// Decides `batch` as if the database clock read `now`. For replaying
    /// traces in tests; the service always uses the database's own clock.
    pub async fn check_as_of(&self, batch: &CheckBatch, now: DateTime<Utc>) -> Result<Checked, StoreError> {
        self.submit(batch, Some(now)).await
    }

    async fn submit(&self, batch: &CheckBatch, now: Option<DateTime<Utc>>) -> Result<Checked, StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send((batch.clone(), now, reply)).await.is_err() {
            return Err(StoreError::Unreachable("the postgres lanes have stopped".into()));
        }
        match answer.await {
            Ok(result) => result.map_err(classify),
            Err(_) => Err(StoreError::Unreachable("a postgres lane stopped mid-check".into())),
        }
    }
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
        let mut conn = self.shared.open().await.map_err(classify)?;
        sqlx::query("SELECT 1").execute(&mut conn).await.map_err(classify)?;
        let _ = conn.close().await;
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// A lane: takes checks off the shared queue and runs them on its own connection.
async fn lane(shared: Arc<Shared>, mut conn: Option<(PgConnection, u64)>) {
    loop {
        let job = shared.queue.lock().await.recv().await;
        let Some((batch, now, reply)) = job else { return };
        if reply.is_closed() {
            continue; // the caller gave up (fallback answered it): do not count it
        }
        let result = shared.run(&mut conn, &batch, now).await;
        let _ = reply.send(result);
    }
}

impl Shared {
    /// How long a lane waits on the server before it drops the connection.
    /// Longer than the caller's budget: the fallback decides what the caller
    /// gets; this only frees a lane stuck on a dead or paused server.
    fn hard_limit(&self) -> Duration {
        (self.options.timeout * 20).max(Duration::from_secs(2))
    }

    async fn open(&self) -> Result<PgConnection, sqlx::Error> {
        match tokio::time::timeout(self.hard_limit(), PgConnection::connect_with(&self.connect)).await {
            Ok(conn) => conn,
            Err(_) => Err(timed_out("connecting")),
        }
    }

    async fn run(
        &self,
        slot: &mut Option<(PgConnection, u64)>,
        batch: &CheckBatch,
        now: Option<DateTime<Utc>>,
    ) -> Result<Checked, sqlx::Error> {
        let generation = self.generation.load(Ordering::Acquire);
        if slot.as_ref().is_some_and(|(_, g)| *g != generation) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some((self.open().await?, generation));
        }
        let Some((conn, _)) = slot.as_mut() else {
            return Err(timed_out("connecting"));
        };
        let result = match tokio::time::timeout(self.hard_limit(), call(conn, batch, now)).await {
            Ok(result) => result,
            Err(_) => Err(timed_out("waiting for pglimit_check")),
        };
        if result.as_ref().is_err_and(|e| !matches!(e, sqlx::Error::Database(_))) {
            *slot = None; // the connection's state is unknown: start afresh
        }
        result
    }
}

async fn call(
    conn: &mut PgConnection,
    batch: &CheckBatch,
    now: Option<DateTime<Utc>>,
) -> Result<Checked, sqlx::Error> {
    let keys: Vec<&[u8]> = batch.buckets.iter().map(|b| b.key.as_slice()).collect();
    let limits: Vec<i64> = batch.buckets.iter().map(|b| to_i64(b.limit)).collect();
    let windows: Vec<i64> = batch.buckets.iter().map(|b| to_i64(b.window.as_millis())).collect();
    let algorithms: Vec<i16> = batch.buckets.iter().map(|b| b.algorithm.code()).collect();
    let rows: Vec<CheckRow> = sqlx::query_as("SELECT * FROM pglimit_check($1, $2, $3, $4, $5, $6)")
        .bind(keys)
        .bind(limits)
        .bind(windows)
        .bind(algorithms)
        .bind(to_i64(batch.cost))
        .bind(now)
        .fetch_all(conn)
        .await?;
    into_checked(batch, rows)
}

/// Session settings: read committed whatever the database default (the
/// function relies on each statement seeing the latest committed rows), and
/// server-side limits so that a stuck row lock fails one check after the
/// caller's budget instead of holding a lane, and an abandoned statement
/// does not run on.
fn with_session_settings(connect: PgConnectOptions, timeout: Duration) -> PgConnectOptions {
    let lock_ms = timeout.as_millis().max(1);
    let statement_ms = (timeout * 20).as_millis().max(2000);
    connect.options([
        ("default_transaction_isolation", "read\\ committed".to_string()),
        ("lock_timeout", lock_ms.to_string()),
        ("statement_timeout", statement_ms.to_string()),
    ])
}

fn into_checked(batch: &CheckBatch, mut rows: Vec<CheckRow>) -> Result<Checked, sqlx::Error> {
    if rows.len() != batch.buckets.len() {
        return Err(sqlx::Error::Protocol(format!(
            "pglimit_check returned {} rows for {} buckets",
            rows.len(),
            batch.buckets.len()
        )));
    }
    rows.sort_by_key(|r| r.0);
    let now = rows.first().map(|r| r.5).unwrap_or_else(Utc::now);
    let buckets = rows
        .into_iter()
        .map(|(_, allowed, remaining, reset_at, retry_at, _)| BucketState {
            allowed,
            remaining: remaining.max(0) as u64,
            reset_at,
            retry_at,
        })
        .collect();
    Ok(Checked { buckets, now, store: StoreKind::Postgres, degraded: false })
}

fn timed_out(what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("postgres timed out {what}")))
}

/// Connection-level failures mean Postgres is away for everyone; an error
/// the server answered with concerns this check only.
fn classify(e: sqlx::Error) -> StoreError {
    let server_going_away = |code: &str| {
        // 08: connection exception, 53: insufficient resources,
        // 57P: shutdown, crash, starting up (not 57014, a statement timeout).
        ["08", "53", "57P"].iter().any(|class| code.starts_with(class))
    };
    match &e {
        sqlx::Error::Database(db) if !db.code().is_some_and(|c| server_going_away(&c)) => {
            StoreError::Failed(e.to_string())
        }
        _ => StoreError::Unreachable(e.to_string()),
    }
}

fn to_i64<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}
