//! The statements that write outside a check, as a layout gives them: an
//! operator's block, and the write-back of what memory admitted during an
//! outage. Each layout fills in its own text and, in Citus mode, a route.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use crate::algorithm::State;
use crate::storage::{BlockTarget, Key};

/// An operator's block as a layout writes it: its statement, and in Citus
/// mode each key's route, bound after the common parameters.
pub(in crate::storage::postgres) struct Blocking {
    pub(in crate::storage::postgres) sql: &'static str,
    pub(in crate::storage::postgres) routes: Option<Vec<i32>>,
}

impl Blocking {
    /// Blocks `targets` for `ms` milliseconds; returns when each block ends.
    pub async fn run(
        self,
        tx: &mut PgConnection,
        targets: &[BlockTarget],
        ms: i64,
        reason: Option<String>,
        keep: bool,
    ) -> Result<Vec<DateTime<Utc>>, sqlx::Error> {
        let query = sqlx::query_as(self.sql)
            .persistent(keep)
            .bind(targets.iter().map(|t| t.key.as_slice()).collect::<Vec<_>>())
            .bind(ms)
            .bind(targets.iter().map(|t| t.policy.to_string()).collect::<Vec<_>>())
            .bind(targets.iter().map(|t| t.bucket.to_string()).collect::<Vec<_>>())
            .bind(reason);
        let ends: Vec<(DateTime<Utc>,)> = match self.routes {
            None => query.fetch_all(tx).await?,
            Some(routes) => query.bind(routes).fetch_all(tx).await?,
        };
        Ok(ends.into_iter().map(|(until,)| until).collect())
    }
}

/// A bucket's row as the write-back reads it: key, count, previous count,
/// expiry and theoretical arrival (µs), log, and the database's clock (µs).
pub(in crate::storage::postgres) type StoredRow = (Vec<u8>, i64, i64, i64, i64, Vec<i64>, i64);

/// The write-back's three statements: create missing rows and lock them
/// all, read them, write them.
pub(in crate::storage::postgres) struct AbsorbSql {
    pub(in crate::storage::postgres) lock: &'static str,
    pub(in crate::storage::postgres) read: &'static str,
    pub(in crate::storage::postgres) write: &'static str,
}

/// One chunk's write-back as a layout writes it: the statements, and in
/// Citus mode the chunk's route, bound after the common parameters.
pub(in crate::storage::postgres) struct Absorbing {
    pub(in crate::storage::postgres) sql: &'static AbsorbSql,
    pub(in crate::storage::postgres) route: Option<i32>,
}

impl Absorbing {
    /// Creates the rows of `keys` if missing, locks them in key order and reads them.
    pub async fn lock_and_read(
        &self,
        tx: &mut PgConnection,
        keys: &[&[u8]],
        keep: bool,
    ) -> Result<Vec<StoredRow>, sqlx::Error> {
        let (lock, read) = (sqlx::query(self.sql.lock), sqlx::query_as(self.sql.read));
        let (lock, read) = (lock.persistent(keep).bind(keys), read.persistent(keep).bind(keys));
        match self.route {
            None => {
                lock.execute(&mut *tx).await?;
                read.fetch_all(tx).await
            }
            Some(route) => {
                lock.bind(route).execute(&mut *tx).await?;
                read.bind(route).fetch_all(tx).await
            }
        }
    }

    /// Writes each merged state into its row.
    pub async fn write(
        &self,
        tx: &mut PgConnection,
        merged: &[(&Key, State)],
        keep: bool,
    ) -> Result<(), sqlx::Error> {
        let column = |f: fn(&State) -> i64| merged.iter().map(|(_, s)| f(s)).collect::<Vec<i64>>();
        let logs: Vec<Option<String>> = merged
            .iter()
            .map(|(_, s)| {
                let items: Vec<String> = s.log.iter().map(i64::to_string).collect();
                (!s.log.is_empty()).then(|| format!("{{{}}}", items.join(",")))
            })
            .collect();
        let query = sqlx::query(self.sql.write)
            .persistent(keep)
            .bind(merged.iter().map(|(k, _)| &k[..]).collect::<Vec<_>>())
            .bind(column(|s| s.count as i64))
            .bind(column(|s| s.prev as i64))
            .bind(column(|s| s.expires_us))
            .bind(column(|s| s.tat_us))
            .bind(logs);
        match self.route {
            None => query.execute(tx).await?,
            Some(route) => query.bind(route).execute(tx).await?,
        };
        Ok(())
    }
}
