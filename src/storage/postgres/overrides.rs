//! API overrides in Postgres: written on the actions connection, each
//! change in one transaction that writes its audit row, bumps the
//! overrides generation and notifies every instance (`<generation> overrides`, see [`super::listener`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::actions::ActionConn;
use super::audit::write;
use super::listener::{overrides_payload, CHANNEL};
use super::session::Session;
use crate::storage::{AddedOverride, AuditEntry, LoadedOverrides, StoreError, StoredOverride};

const INSERT: &str = "
INSERT INTO pglimit_overrides (id, policy, match, action, limits, until, note)
VALUES ($1, $2, $3::jsonb, $4, $5::jsonb, $6, $7) RETURNING created_at";

/// Expired rows apply to nothing: each insert sweeps them.
const SWEEP: &str = "DELETE FROM pglimit_overrides WHERE until <= now()";

const DELETE: &str = "DELETE FROM pglimit_overrides WHERE id = $1 RETURNING policy";

/// The policy's overrides with the same `when` (jsonb compares by value).
const REPLACE: &str = "DELETE FROM pglimit_overrides WHERE policy = $1 AND match = $2::jsonb RETURNING id";

const SELECT: &str = "
SELECT id, policy, match::text, action, limits::text, until, note, created_at FROM pglimit_overrides
WHERE ($1::text IS NULL OR policy = $1) AND (until IS NULL OR until > now())
ORDER BY created_at DESC, id DESC LIMIT $2";

const GENERATION: &str = "SELECT overrides FROM pglimit_actions";

const BUMP: &str = "
UPDATE pglimit_actions SET generation = generation + 1, overrides = overrides + 1 RETURNING generation";

type Row =
    (String, String, String, String, Option<String>, Option<DateTime<Utc>>, Option<String>, DateTime<Utc>);

impl ActionConn {
    pub async fn add_override(
        &self,
        session: &Session,
        new: &StoredOverride,
        audit: &AuditEntry,
    ) -> Result<AddedOverride, StoreError> {
        let (row, mut stored, audit) = (new.clone(), new.clone(), audit.clone());
        let (created_at, replaced) = self
            .transaction(session, move |tx, keep| {
                Box::pin(async move {
                    sqlx::query(SWEEP).persistent(keep).execute(&mut *tx).await?;
                    let when = serde_json::to_string(&row.when).unwrap_or_default();
                    let replaced: Vec<(String,)> = sqlx::query_as(REPLACE)
                        .persistent(keep)
                        .bind(&row.policy)
                        .bind(&when)
                        .fetch_all(&mut *tx)
                        .await?;
                    let created_at = insert(tx, keep, &row, when).await?;
                    let replaced: Vec<String> = replaced.into_iter().map(|(id,)| id).collect();
                    write(tx, keep, &audit.with("replaced", replaced.clone())).await?;
                    announce(tx, keep).await?;
                    Ok((created_at, replaced))
                })
            })
            .await?;
        stored.created_at = created_at;
        Ok(AddedOverride { stored, replaced })
    }

    pub async fn remove_override(
        &self,
        session: &Session,
        id: &str,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError> {
        let (id, audit) = (id.to_owned(), audit.clone());
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let gone: Option<(String,)> =
                    sqlx::query_as(DELETE).persistent(keep).bind(id).fetch_optional(&mut *tx).await?;
                let Some((policy,)) = gone else { return Ok(false) };
                write(tx, keep, &audit.with("policy", policy)).await?;
                announce(tx, keep).await?;
                Ok(true)
            })
        })
        .await
    }

    pub async fn list_overrides(
        &self,
        session: &Session,
        policy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredOverride>, StoreError> {
        let policy = policy.map(str::to_owned);
        self.transaction(session, move |tx, keep| {
            Box::pin(async move { select(tx, keep, policy, i64::from(limit)).await })
        })
        .await
    }

    pub async fn load_overrides(
        &self,
        session: &Session,
        loaded: Option<u64>,
    ) -> Result<Option<LoadedOverrides>, StoreError> {
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let (generation,): (i64,) =
                    sqlx::query_as(GENERATION).persistent(keep).fetch_one(&mut *tx).await?;
                let generation = generation.max(0) as u64;
                if loaded == Some(generation) {
                    return Ok(None);
                }
                let overrides = select(tx, keep, None, i64::MAX).await?;
                Ok(Some(LoadedOverrides { generation, overrides }))
            })
        })
        .await
    }
}

async fn insert(
    tx: &mut PgConnection,
    keep: bool,
    row: &StoredOverride,
    when: String,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let limits = (row.action == "limits").then(|| serde_json::to_string(&row.limits).unwrap_or_default());
    let (created_at,): (DateTime<Utc>,) = sqlx::query_as(INSERT)
        .persistent(keep)
        .bind(&row.id)
        .bind(&row.policy)
        .bind(when)
        .bind(&row.action)
        .bind(limits)
        .bind(row.until)
        .bind(&row.note)
        .fetch_one(tx)
        .await?;
    Ok(created_at)
}

async fn select(
    tx: &mut PgConnection,
    keep: bool,
    policy: Option<String>,
    limit: i64,
) -> Result<Vec<StoredOverride>, sqlx::Error> {
    let rows: Vec<Row> =
        sqlx::query_as(SELECT).persistent(keep).bind(policy).bind(limit).fetch_all(tx).await?;
    Ok(rows.into_iter().filter_map(stored).collect())
}

/// A row as written by [`ActionConn::add_override`]; one that does not read
/// back (written by hand, say) is left out and logged.
fn stored(row: Row) -> Option<StoredOverride> {
    let (id, policy, when, action, limits, until, note, created_at) = row;
    let when: BTreeMap<String, String> = serde_json::from_str(&when)
        .inspect_err(|e| tracing::warn!(%id, error = %e, "an override's match is unreadable: ignored"))
        .ok()?;
    let limits = match limits {
        Some(limits) => serde_json::from_str(&limits)
            .inspect_err(|e| tracing::warn!(%id, error = %e, "an override's limits are unreadable: ignored"))
            .ok()?,
        None => BTreeMap::new(),
    };
    Some(StoredOverride { id, policy, when, action, limits, until, note, created_at })
}

/// Bumps both generations and notifies, in the change's transaction: the
/// notification is delivered on commit, and only then.
async fn announce(tx: &mut PgConnection, keep: bool) -> Result<(), sqlx::Error> {
    let (generation,): (i64,) = sqlx::query_as(BUMP).persistent(keep).fetch_one(&mut *tx).await?;
    let notify = sqlx::query("SELECT pg_notify($1, $2)").persistent(keep);
    notify.bind(CHANNEL).bind(overrides_payload(generation)).execute(tx).await?;
    Ok(())
}
