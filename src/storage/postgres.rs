//! Counters in PostgreSQL: exact across any number of service instances.
//!
//! A check is one call of the `pglimit_check` SQL function (see
//! `migrations/`), so it is one round trip and one transaction whatever the
//! number of buckets. Expired rows are deleted by a bounded background delete
//! started on a sample of checks, so no cron is needed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::{BucketState, CheckBatch, Checked, Store, StoreError, StoreKind};

/// How the Postgres store connects and cleans up.
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    pub pool_size: u32,
    /// Budget for pool acquire plus statement; past it the check fails over.
    pub timeout: Duration,
    /// Fraction of checks that start a cleanup of expired rows.
    pub cleanup_rate: f64,
    /// Most rows one cleanup deletes.
    pub cleanup_batch: i64,
}

/// One row of `pglimit_check`: index in the batch, allowed, count, reset_at, now.
type CheckRow = (i32, bool, i64, DateTime<Utc>, DateTime<Utc>);

#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    connect: PgConnectOptions,
    options: PgStoreOptions,
    // Replaced after an outage so no connection from before it is reused.
    pool: RwLock<PgPool>,
    cleaning: AtomicBool,
}

impl PgStore {
    /// Connects and applies the migrations.
    pub async fn connect(url: &str, options: PgStoreOptions) -> Result<Self, sqlx::Error> {
        let connect: PgConnectOptions = url.parse()?;
        let connect = with_server_timeouts(connect, options.timeout);
        let pool = pool_options(&options).connect_with(connect.clone()).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        let inner = Inner {
            connect,
            options,
            pool: RwLock::new(pool),
            cleaning: AtomicBool::new(false),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The pool in use now.
    pub fn pool(&self) -> PgPool {
        self.inner
            .pool
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Deletes up to `cleanup_batch` expired rows; returns how many it deleted.
    /// Rows locked by a check in progress are skipped, never waited for.
    pub async fn cleanup(&self) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "DELETE FROM pglimit_buckets WHERE key IN (
                 SELECT key FROM pglimit_buckets WHERE reset_at <= now()
                 ORDER BY reset_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(self.inner.options.cleanup_batch)
        .execute(&self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    async fn call(&self, batch: &CheckBatch) -> Result<Checked, sqlx::Error> {
        let keys: Vec<&[u8]> = batch.buckets.iter().map(|b| b.key.as_slice()).collect();
        let limits: Vec<i64> = batch.buckets.iter().map(|b| to_i64(b.limit)).collect();
        let windows: Vec<i64> = batch
            .buckets
            .iter()
            .map(|b| to_i64(b.window.as_millis()))
            .collect();
        let rows: Vec<CheckRow> = sqlx::query_as("SELECT * FROM pglimit_check($1, $2, $3, $4)")
            .bind(keys)
            .bind(limits)
            .bind(windows)
            .bind(to_i64(batch.cost))
            .fetch_all(&self.pool())
            .await?;
        into_checked(batch, rows)
    }

    fn maybe_start_cleanup(&self) {
        if rand::random::<f64>() >= self.inner.options.cleanup_rate {
            return;
        }
        if self.inner.cleaning.swap(true, Ordering::AcqRel) {
            return; // one at a time per instance
        }
        let store = self.clone();
        tokio::spawn(async move {
            match store.cleanup().await {
                Ok(n) => tracing::debug!(deleted = n, "cleanup of expired buckets"),
                Err(e) => tracing::debug!(error = %e, "cleanup of expired buckets failed"),
            }
            store.inner.cleaning.store(false, Ordering::Release);
        });
    }
}

impl Store for PgStore {
    async fn check(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        let checked = self.call(batch).await.map_err(classify)?;
        self.maybe_start_cleanup();
        Ok(checked)
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let fresh = pool_options(&self.inner.options).connect_lazy_with(self.inner.connect.clone());
        sqlx::query("SELECT 1")
            .execute(&fresh)
            .await
            .map_err(classify)?;
        let old = std::mem::replace(
            &mut *self.inner.pool.write().unwrap_or_else(|e| e.into_inner()),
            fresh,
        );
        tokio::spawn(async move { old.close().await });
        Ok(())
    }
}

fn pool_options(options: &PgStoreOptions) -> PgPoolOptions {
    // No ping before each acquire: that would be a second round trip per
    // check. A dead connection shows up as an error and trips the fallback.
    PgPoolOptions::new()
        .max_connections(options.pool_size)
        .acquire_timeout(options.timeout)
        .test_before_acquire(false)
}

/// Server-side limits, so a stuck row lock fails one check (and the fallback
/// answers it) well before the instance-wide timeout, and an abandoned
/// statement does not run on forever.
fn with_server_timeouts(connect: PgConnectOptions, timeout: Duration) -> PgConnectOptions {
    let lock_ms = (timeout.as_millis() / 2).max(1);
    let statement_ms = timeout.as_millis().saturating_mul(4).max(1000);
    connect.options([
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
    let now = rows.first().map(|r| r.4).unwrap_or_else(Utc::now);
    let buckets = rows
        .into_iter()
        .map(|(_, allowed, count, reset_at, _)| BucketState {
            allowed,
            count: count.max(0) as u64,
            reset_at,
        })
        .collect();
    Ok(Checked {
        buckets,
        now,
        store: StoreKind::Postgres,
        degraded: false,
    })
}

/// Connection-level failures mean Postgres is away for everyone; an error
/// the server answered with concerns this check only.
fn classify(e: sqlx::Error) -> StoreError {
    let server_going_away = |code: &str| {
        // 08: connection exception, 53: insufficient resources,
        // 57P: shutdown, crash, starting up (not 57014, a statement timeout).
        ["08", "53", "57P"]
            .iter()
            .any(|class| code.starts_with(class))
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
