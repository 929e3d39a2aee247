//! The statements on a single node: the rows in plain tables.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::writes::{AbsorbSql, Absorbing, Blocking};
use crate::storage::postgres::session::Session;
use crate::storage::postgres::statements::{self, Row};
use crate::storage::postgres::template;
use crate::storage::postgres::upsert::{self, Keys};
use crate::storage::{Answer, Check};
use crate::telemetry;

/// The general case: any algorithms, any number of buckets per check, keys
/// shared between checks (a hot key). See `pglimit_check_batch` in
/// `sql/batch.sql`.
const CHECK_BATCH: &str =
    "SELECT * FROM pglimit_check_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// The same for a batch in which no key appears twice, decided set-based
/// rather than bucket by bucket. See `pglimit_check_distinct` in `sql/distinct.sql`.
const CHECK_DISTINCT: &str =
    "SELECT * FROM pglimit_check_distinct($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// Leases past their end: an ended lease holds no slot (a released one
/// ends a minute after its release, `sql/leases.sql`). Leases are kept on
/// a single node only.
const DELETE_ENDED_LEASES: &str = "DELETE FROM pglimit_leases WHERE (id, key) IN (
    SELECT id, key FROM pglimit_leases WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// An operator's block replaces whatever block the key had (`sql/actions.sql`).
const BLOCK: &str = "SELECT pglimit_block_keys($1::bytea[], $2, $3::text[], $4::text[], $5)";

/// The write-back; logs travel as array literals (`{1,2}`): rows of
/// different lengths cannot share one two-dimensional array. Its rows are
/// created and locked as a check's are (`pglimit_lock_buckets`, `sql/batch.sql`).
static ABSORB: AbsorbSql = AbsorbSql {
    lock: "SELECT pglimit_lock_buckets($1::bytea[])",
    read: "
SELECT key, count, prev_count, pglimit_us(expires_at), coalesce(tat_us, 0), coalesce(log, '{}'),
       pglimit_us(now())
FROM pglimit_buckets WHERE key = ANY($1) ORDER BY key FOR UPDATE",
    write: "
UPDATE pglimit_buckets t SET
    count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt, log = s.lg::bigint[]
FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[])
     AS s(key, c, p, e, tt, lg)
WHERE t.key = s.key",
};

/// Decides `batches` with a plain upsert where one serves, else with a
/// batch function.
///
/// `per_transaction`: behind a transaction pooler, the settings each
/// transaction starts with; the statement then travels with its values
/// written out ([`statements::fetch_rows`]).
pub(super) async fn decide(
    conn: &mut PgConnection,
    batches: &[&Check],
    now: Option<DateTime<Utc>>,
    per_transaction: Option<&str>,
) -> Result<Vec<Answer>, sqlx::Error> {
    let keys = Keys::of(batches);
    let via = per_transaction;
    let function = if keys == Keys::Distinct { CHECK_DISTINCT } else { CHECK_BATCH };
    // Written out, a plain upsert is planned on every call, where the batch
    // functions' own statements keep their plans in the server's session:
    // behind a transaction pooler the functions were the faster (bench/results/).
    let upsert = if via.is_some() { None } else { upsert::choose(batches, keys) };
    let rows: Vec<Row> = match upsert {
        Some(upsert) => match upsert::run(&mut *conn, upsert, batches, now).await {
            Err(e) if upsert::must_retry_with_locks(&e) => {
                tracing::debug!(
                    "a bucket's row changed under the upsert; deciding its batch again with locks"
                );
                telemetry::upsert_retried();
                let args = statements::check_args_with_leases(batches, now);
                statements::fetch_rows(conn, function, args, via).await?
            }
            rows => rows?,
        },
        None => {
            let args = statements::check_args_with_leases(batches, now);
            statements::fetch_rows(conn, function, args, via).await?
        }
    };
    statements::answers(batches, rows)
}

/// The deletes in one transaction.
pub(super) async fn cleanup(
    session: &Session,
    conn: &mut PgConnection,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let mut deleted = 0;
    let mut tx = session.begin(conn).await?;
    for statement in
        [template::single("DELETE_EXPIRED")?, template::single("DELETE_ENDED_BLOCKS")?, DELETE_ENDED_LEASES]
    {
        let delete = sqlx::query(statement).persistent(session.keeps_statements()).bind(batch);
        deleted += delete.execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(deleted)
}

pub(super) fn block() -> Blocking {
    Blocking { sql: BLOCK, routes: None }
}

pub(super) fn absorb() -> Absorbing {
    Absorbing { sql: &ABSORB, route: None }
}
