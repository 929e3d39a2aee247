//! `pglimit_audit` in Postgres: a row written in the transaction of the
//! act it records ([`write`]), or alone on the actions connection; pages
//! read newest first by id; and retention's bounded delete, run by the
//! cleanup on the URL's server (in Citus mode the table is a plain table
//! on the coordinator, as `pglimit_overrides` is).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::actions::ActionConn;
use super::session::Session;
use crate::storage::{AuditEntry, AuditQuery, AuditRow, StoreError};

const INSERT: &str = "
INSERT INTO pglimit_audit (actor, request_id, action, target, detail) VALUES ($1, $2, $3, $4, $5::jsonb)";

/// `id` orders the rows: a cursor is the last id seen.
const PAGE: &str = "
SELECT id, at, actor, request_id, action, target, detail::text FROM pglimit_audit
WHERE ($1::text IS NULL OR action = $1) AND ($2::text IS NULL OR target = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4";

/// Rows past retention, at most `$1` of them, the oldest first.
const EXPIRE: &str = "
DELETE FROM pglimit_audit WHERE id IN (
    SELECT id FROM pglimit_audit WHERE at < now() - make_interval(secs => $2) ORDER BY at LIMIT $1)";

type Row = (i64, DateTime<Utc>, String, Option<String>, String, String, String);

/// Writes `entry` in the caller's transaction.
pub(super) async fn write(tx: &mut PgConnection, keep: bool, entry: &AuditEntry) -> Result<(), sqlx::Error> {
    let detail = serde_json::Value::Object(entry.detail.clone()).to_string();
    sqlx::query(INSERT)
        .persistent(keep)
        .bind(&entry.acting.actor)
        .bind(&entry.acting.request_id)
        .bind(entry.action.as_str())
        .bind(&entry.target)
        .bind(detail)
        .execute(tx)
        .await?;
    Ok(())
}

/// Deletes up to `batch` rows older than `retention`; returns how many.
pub(super) async fn expire(
    conn: &mut PgConnection,
    keep: bool,
    batch: i64,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let delete = sqlx::query(EXPIRE).persistent(keep).bind(batch).bind(retention.as_secs_f64());
    Ok(delete.execute(conn).await?.rows_affected())
}

impl ActionConn {
    pub async fn record(&self, session: &Session, entry: &AuditEntry) -> Result<(), StoreError> {
        let entry = entry.clone();
        self.transaction(session, move |tx, keep| Box::pin(async move { write(tx, keep, &entry).await }))
            .await
    }

    pub async fn audit(&self, session: &Session, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        let query = query.clone();
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let rows: Vec<Row> = sqlx::query_as(PAGE)
                    .persistent(keep)
                    .bind(query.action.map(|a| a.as_str()))
                    .bind(query.target)
                    .bind(query.before)
                    .bind(i64::from(query.limit))
                    .fetch_all(tx)
                    .await?;
                Ok(rows.into_iter().map(row).collect())
            })
        })
        .await
    }
}

/// A row as read; a detail that does not parse (written by hand) is shown as text.
fn row((id, at, actor, request_id, action, target, detail): Row) -> AuditRow {
    let detail = serde_json::from_str(&detail).unwrap_or(serde_json::Value::String(detail));
    AuditRow { id, at, actor, request_id, action, target, detail }
}
