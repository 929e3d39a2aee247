//! What start-up does to the database before the first check: refuse a
//! server too old, create the configured schema, apply the migrations and
//! the table persistence, set up Citus mode, and read the time zones the
//! server knows.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Executor};

use super::{Reach, Session};
use crate::storage::postgres::citus::{self, Citus};
use crate::storage::postgres::layout::Layout;
use crate::storage::postgres::pooler::{quote_ident, Pooler, Settings};
use crate::storage::postgres::{schema, template, tls};

impl Session {
    /// Applies the migrations, the configured table persistence and, on a
    /// Citus cluster, the distribution of the tables; reads the server's
    /// time zones (the coordinator's, in Citus mode).
    pub async fn prepare(&self, unlogged: bool, citus: Citus) -> Result<(), sqlx::Error> {
        template::check()
            .map_err(|e| sqlx::Error::Configuration(format!("a statement template: {e}").into()))?;
        let mut conn = self.open().await.map_err(|e| tls::explain(e, &self.connect))?;
        let mut tx = self.begin(&mut conn).await?;
        let (version,): (i32,) = sqlx::query_as("SELECT current_setting('server_version_num')::int")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
        supported(version).map_err(|e| sqlx::Error::Configuration(e.into()))?;
        if let Some(schema) = &self.schema {
            create_schema(&mut tx, schema).await?;
        }
        let path = schema::search_path(&mut tx).await?;
        let interface = self.schema.as_deref().unwrap_or(schema::INTERFACE_SCHEMA);
        schema::bring_up_to_date(&mut tx, &path, interface).await?;
        set_persistence(&mut tx, unlogged).await?;
        // The migrator prepares named statements: none may outlive the
        // transaction on a server connection a pooler hands to others.
        tx.clear_cached_statements().await?;
        tx.commit().await?;
        let layout = match citus::setup(&mut conn, citus, &path).await? {
            Some(routes) => {
                self.refuse_with_citus()?;
                Layout::Citus(routes)
            }
            None => Layout::Single,
        };
        let _ = self.layout.set(layout);
        let _ = self.settings.set(Settings::new(self.longest_wait, Some(&path)));
        self.zones.read(&mut conn).await?;
        conn.close().await
    }

    /// What Citus mode does not support yet.
    fn refuse_with_citus(&self) -> Result<(), sqlx::Error> {
        let refused = match (self.pooler, &self.schema) {
            (Pooler::Transaction, _) => {
                "PGLIMIT_DB_POOLER=transaction: Citus mode needs a direct \
                or session-pooled connection to the coordinator"
            }
            (_, Some(_)) => {
                "PGLIMIT_DB_SCHEMA: Citus mode keeps its objects in the search path's schema; \
                unset PGLIMIT_DB_SCHEMA"
            }
            _ => return Ok(()),
        };
        Err(sqlx::Error::Configuration(refused.into()))
    }
}

/// Applies the migrations, the table persistence and the Citus distribution
/// to the database at `url`, then disconnects: for deploy pipelines that
/// migrate before rolling out.
pub async fn migrate(url: &str, reach: Reach, unlogged: bool, citus: Citus) -> Result<(), sqlx::Error> {
    // A one-off command can afford to wait, e.g. behind another instance's migration.
    Session::new(url, Duration::from_secs(30), reach)?.prepare(unlogged, citus).await
}

/// Creates the configured schema if it is missing (which takes the right
/// to create in the database; a schema that exists needs no right).
async fn create_schema(conn: &mut PgConnection, schema: &str) -> Result<(), sqlx::Error> {
    let (exists,): (bool,) = sqlx::query_as("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        tracing::info!(schema, "creating PGLIMIT_DB_SCHEMA");
        conn.execute(&*format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(schema))).await?;
    }
    Ok(())
}

/// The oldest PostgreSQL pglimit runs on; the newest tested is 18
/// (`scripts/test --pg N`). Older servers lack what the migrations use.
const OLDEST_SUPPORTED: i32 = 15;

/// Refuses a server older than [`OLDEST_SUPPORTED`] before anything is
/// written to it, naming its version (`server_version_num`, e.g. 130004).
fn supported(version_num: i32) -> Result<(), String> {
    let major = version_num / 10_000;
    if major >= OLDEST_SUPPORTED {
        return Ok(());
    }
    let minor = version_num % 10_000;
    Err(format!(
        "PostgreSQL {major}.{minor} is not supported: pglimit runs on PostgreSQL {OLDEST_SUPPORTED} to 18"
    ))
}

/// Makes the counters table UNLOGGED or logged as configured. UNLOGGED
/// skips the write-ahead log: writes are cheaper, but PostgreSQL empties the
/// table after a crash and does not replicate it.
///
/// Switching rewrites the table under an exclusive lock, which would stall
/// every instance's checks; so it is done here only while the table is
/// empty (a new install). Otherwise start-up stops and says what to run: an
/// operator's decision, not a flip-flop between instances of a rolling
/// deploy that disagree.
async fn set_persistence(conn: &mut PgConnection, unlogged: bool) -> Result<(), sqlx::Error> {
    let (persistence, empty): (i8, bool) = sqlx::query_as(
        "SELECT relpersistence::\"char\", NOT EXISTS (SELECT 1 FROM pglimit_buckets)
         FROM pg_class WHERE oid = 'pglimit_buckets'::regclass",
    )
    .persistent(false)
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
    conn.execute(&*alter).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn servers_older_than_15_are_refused_naming_their_version_and_the_range() {
        assert_eq!(
            super::supported(130_004).expect_err("13 is refused"),
            "PostgreSQL 13.4 is not supported: pglimit runs on PostgreSQL 15 to 18"
        );
        for version in [150_000, 160_009, 180_004, 190_000] {
            assert!(super::supported(version).is_ok(), "{version}");
        }
    }
}
