//! pglimit's tables and functions, brought up to date by the migrations in
//! `migrations/`, and only when they are not: so that `serve` can run as a
//! role that may use pglimit's objects but create nothing, once a
//! privileged role has run `pglimit migrate`.

use std::sync::LazyLock;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::PgConnection;

use super::session::is_sqlstate;

/// Without sqlx's own lock: [`bring_up_to_date`] takes one that a pooler cannot strand.
static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_locking(false);
    migrator
});

/// A key for `pg_advisory_xact_lock`: one instance migrates at a time.
const MIGRATING: i64 = 0x0070_676c_696d_6974; // "pglimit"

/// Applies the migrations this build has and the database lacks, in the
/// caller's transaction. A current schema is only read (`_sqlx_migrations`),
/// which needs no privilege to create anything; migrating does.
///
/// The lock is the transaction's, not the session's (which sqlx's migrator
/// would take): a transaction pooler may run the unlock on another server
/// connection and leave the lock held.
pub(super) async fn bring_up_to_date(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    if is_current(tx).await? {
        return Ok(());
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATING).execute(&mut *tx).await?;
    if is_current(tx).await? {
        return Ok(()); // another instance migrated while this one waited
    }
    MIGRATOR.run(tx).await.map_err(explain)
}

/// Every migration of this build is applied, unchanged (the same checksum).
async fn is_current(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let (exists,): (bool,) =
        sqlx::query_as("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(&mut *conn).await?;
    if !exists {
        return Ok(false);
    }
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success")
            .fetch_all(conn)
            .await?;
    let wanted = MIGRATOR.iter().filter(|m| m.migration_type.is_up_migration());
    let current = wanted.clone().all(|m| applied.iter().any(|(v, c)| *v == m.version && *c == *m.checksum));
    Ok(current && applied.len() == wanted.count())
}

/// What to do about a schema this build cannot bring up to date.
fn explain(e: MigrateError) -> sqlx::Error {
    match e {
        MigrateError::VersionMissing(version) => sqlx::Error::Configuration(
            format!(
                "this database was set up by a pre-release pglimit (migration {version}, since squashed): \
                 drop its tables pglimit_buckets, pglimit_instances and _sqlx_migrations, or, for the \
                 private cluster, delete its data directory (PGLIMIT_DATA_DIR, default .pglimit)"
            )
            .into(),
        ),
        // 42501: insufficient privilege.
        MigrateError::Execute(e) if is_sqlstate(&e, "42501") => sqlx::Error::Configuration(
            format!(
                "pglimit's schema is not current and this role may not change it ({e}): run `pglimit migrate` \
                 with a DATABASE_URL whose role may create objects, then start again"
            )
            .into(),
        ),
        other => other.into(),
    }
}
