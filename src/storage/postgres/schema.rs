//! pglimit's tables, brought up to date by the migrations in `migrations/`,
//! and the functions that decide (`sql/`), installed in a schema named for
//! their text; both only when they are missing, so that `serve` can run as a
//! role that may use pglimit's objects but create nothing, once a
//! privileged role has run `pglimit migrate`.
//!
//! The functions are code: each build calls its own, found first on its
//! search path, so two builds of a rolling deploy never call each other's.
//! A schema of a build no longer running can be dropped (`DROP SCHEMA
//! pglimit_<version> CASCADE`).

use std::sync::LazyLock;

use sha2::{Digest, Sha256};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::PgConnection;
use sqlx::Executor;

use super::statements::is_sqlstate;

/// Without sqlx's own lock: [`bring_up_to_date`] takes one that a pooler cannot strand.
static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_locking(false);
    migrator
});

/// The functions that decide, those that derive bucket keys in SQL
/// (`identifiers.sql`) and those behind the SQL interface (answers to
/// reset), in the order they are created (each calls only those before it).
const FUNCTIONS: [&str; 9] = [
    include_str!("sql/algorithms.sql"),
    include_str!("sql/identifiers.sql"),
    include_str!("sql/leases.sql"),
    include_str!("sql/batch.sql"),
    include_str!("sql/distinct.sql"),
    include_str!("sql/answers.sql"),
    include_str!("sql/policies.sql"),
    include_str!("sql/adhoc.sql"),
    include_str!("sql/actions.sql"),
];

/// The SQL interface (docs/sql.md), created in its own schema (`{{schema}}`)
/// after the functions it calls.
const INTERFACE: &str = include_str!("sql/interface.sql");

/// Where the SQL interface lives without `PGLIMIT_DB_SCHEMA`.
pub const INTERFACE_SCHEMA: &str = "pglimit";

/// The schema of this build's functions: `pglimit_` and the start of a hash
/// of their text, Citus mode's included (installed by `citus::setup`).
pub fn functions_schema() -> &'static str {
    static SCHEMA: LazyLock<String> = LazyLock::new(|| {
        let mut hash = Sha256::new();
        for text in FUNCTIONS.iter().chain([&INTERFACE, &super::citus::FUNCTIONS]) {
            hash.update(text.as_bytes());
        }
        format!("pglimit_{}", hex::encode(&hash.finalize()[..6]))
    });
    &SCHEMA
}

/// A key for `pg_advisory_xact_lock`: one instance migrates at a time.
const MIGRATING: i64 = 0x0070_676c_696d_6974; // "pglimit"

/// Applies the migrations this build has and the database lacks, in the
/// caller's transaction. A current schema is only read (`_sqlx_migrations`),
/// which needs no privilege to create anything; migrating does.
///
/// The lock is the transaction's, not the session's (which sqlx's migrator
/// would take): a transaction pooler may run the unlock on another server
/// connection and leave the lock held.
pub(super) async fn bring_up_to_date(
    tx: &mut PgConnection,
    search_path: &str,
    interface: &str,
) -> Result<(), sqlx::Error> {
    if is_current(tx).await? {
        return Ok(());
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATING).execute(&mut *tx).await?;
    if is_current(tx).await? {
        return Ok(()); // another instance migrated while this one waited
    }
    if !migrated(tx).await? {
        MIGRATOR.run(&mut *tx).await.map_err(explain)?;
    }
    if !installed(tx).await? {
        install(tx, search_path).await.map_err(refused)?;
        install_interface(tx, interface).await.map_err(refused)?;
        let restore = sqlx::query("SELECT set_config('search_path', $1, true)").bind(search_path);
        restore.persistent(false).execute(&mut *tx).await?;
    }
    Ok(())
}

/// The search path for every connection once [`bring_up_to_date`] ran:
/// this build's functions, then where the tables are (the configured
/// schema, or the role's search path), as `tx` has it now.
pub(super) async fn search_path(tx: &mut PgConnection) -> Result<String, sqlx::Error> {
    let (path,): (String,) =
        sqlx::query_as("SELECT concat_ws(', ', quote_ident($1), nullif(current_setting('search_path'), ''))")
            .bind(functions_schema())
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
    Ok(path)
}

/// Creates this build's functions in their schema, which needs the right to
/// create a schema in the database. `PUBLIC` may use the schema: each
/// function runs with its caller's rights, and reaches only the tables the
/// caller may.
async fn install(tx: &mut PgConnection, search_path: &str) -> Result<(), sqlx::Error> {
    tracing::info!(schema = functions_schema(), "installing this build's functions");
    let schema = super::pooler::quote_ident(functions_schema());
    tx.execute(&*format!("CREATE SCHEMA {schema}; GRANT USAGE ON SCHEMA {schema} TO PUBLIC")).await?;
    sqlx::query("SELECT set_config('search_path', $1, true)")
        .bind(search_path)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    for text in FUNCTIONS {
        sqlx::raw_sql(text).execute(&mut *tx).await?;
    }
    Ok(())
}

/// Creates or replaces the SQL interface in schema `interface`, its
/// functions' search path fixed to this build's functions, the tables'
/// schema and then `pg_temp`, so that no caller's object is found first.
async fn install_interface(tx: &mut PgConnection, interface: &str) -> Result<(), sqlx::Error> {
    let schema = super::pooler::quote_ident(interface);
    tracing::info!(schema = interface, "installing the SQL interface");
    let fixed = "SELECT set_config('search_path', concat_ws(', ', quote_ident($1), \
        (SELECT quote_ident(n.nspname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = to_regclass('pglimit_buckets')), 'pg_temp'), true)";
    tx.execute(&*format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
    sqlx::query(fixed).bind(functions_schema()).persistent(false).execute(&mut *tx).await?;
    sqlx::raw_sql(&INTERFACE.replace("{{schema}}", &schema)).execute(&mut *tx).await?;
    Ok(())
}

/// Whether this build's functions are installed (they are created in one
/// transaction with their schema).
async fn installed(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let (exists,): (bool,) = sqlx::query_as("SELECT to_regnamespace(quote_ident($1)) IS NOT NULL")
        .bind(functions_schema())
        .persistent(false)
        .fetch_one(conn)
        .await?;
    Ok(exists)
}

async fn is_current(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    Ok(migrated(conn).await? && installed(conn).await?)
}

/// Every migration of this build is applied, unchanged (the same checksum).
async fn migrated(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
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
        MigrateError::Execute(e) => refused(e),
        other => other.into(),
    }
}

/// What to do when this role may not create what this build needs.
fn refused(e: sqlx::Error) -> sqlx::Error {
    // 42501: insufficient privilege.
    if !is_sqlstate(&e, "42501") {
        return e;
    }
    let msg = format!(
        "pglimit's schema is not current and this role may not change it ({e}): run `pglimit migrate` \
         with a DATABASE_URL whose role may create objects, then start again"
    );
    sqlx::Error::Configuration(msg.into())
}
