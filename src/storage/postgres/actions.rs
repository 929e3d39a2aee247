//! Resets, blocks and unblocks: each one transaction that changes the
//! rows, writes the act's audit row, bumps the actions generation and
//! notifies every instance (see [`super::listener`]). Actions are rare, so they share one connection of
//! their own, opened on demand.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::audit::write;
use super::connection::{Connection, Work};
use super::session::{classify, Session};
use crate::storage::{audit_time, AuditEntry, Block, BlockTarget, Key, StoreError};

/// Counters back to full, lockouts lifted, leases ended and every instance
/// told: `sql/actions.sql`, which `pglimit.reset` calls too.
const RESET: &str = "SELECT pglimit_reset_keys($1::bytea[])";

const UNBLOCK: &str = "DELETE FROM pglimit_blocks WHERE key = ANY ($1::bytea[])";

const LIST: &str = "
SELECT key, kind, policy, bucket, until, reason, created_at FROM pglimit_blocks
WHERE until > now() ORDER BY until DESC, key LIMIT $1";

/// Bumps the generation and notifies (`sql/actions.sql`).
const ANNOUNCE: &str = "SELECT pglimit_announce($1::bytea[])";

pub(super) struct ActionConn(Connection);

pub(super) type BlockRow =
    (Vec<u8>, String, Option<String>, Option<String>, DateTime<Utc>, Option<String>, DateTime<Utc>);

impl ActionConn {
    pub fn new() -> Self {
        Self(Connection::new("acting on limits"))
    }

    pub async fn reset(
        &self,
        session: &Session,
        keys: &[Key],
        audit: Option<&AuditEntry>,
    ) -> Result<(), StoreError> {
        let (keys, audit) = (keys.to_vec(), audit.cloned());
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                if let Some(audit) = audit {
                    write(tx, keep, &audit).await?;
                }
                sqlx::query(RESET).persistent(keep).bind(raw(&keys)).execute(&mut *tx).await?;
                Ok(())
            })
        })
        .await
    }

    pub async fn block(
        &self,
        session: &Session,
        targets: &[BlockTarget],
        duration: Duration,
        reason: Option<&str>,
        audit: &AuditEntry,
    ) -> Result<DateTime<Utc>, StoreError> {
        let (targets, audit) = (targets.to_vec(), audit.clone());
        // An operator's block replaces whatever block the key had.
        let blocking = session.layout().block(&targets);
        let (ms, reason) =
            (i64::try_from(duration.as_millis()).unwrap_or(i64::MAX), reason.map(str::to_owned));
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let ends = blocking.run(&mut *tx, &targets, ms, reason, keep).await?;
                let until = ends.into_iter().max().unwrap_or_else(Utc::now);
                write(tx, keep, &audit.with("until", audit_time(&until))).await?;
                let keys: Vec<Key> = targets.iter().map(|t| t.key).collect();
                announce(tx, &keys, keep).await?;
                Ok(until)
            })
        })
        .await
    }

    pub async fn unblock(
        &self,
        session: &Session,
        keys: &[Key],
        audit: &AuditEntry,
    ) -> Result<u64, StoreError> {
        let (keys, audit) = (keys.to_vec(), audit.clone());
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let lifted = sqlx::query(UNBLOCK)
                    .persistent(keep)
                    .bind(raw(&keys))
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                write(tx, keep, &audit.with("lifted", lifted)).await?;
                announce(tx, &keys, keep).await?;
                Ok(lifted)
            })
        })
        .await
    }

    pub async fn list(&self, session: &Session, limit: u32) -> Result<Vec<Block>, StoreError> {
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let rows: Vec<BlockRow> =
                    sqlx::query_as(LIST).persistent(keep).bind(i64::from(limit)).fetch_all(&mut *tx).await?;
                Ok(rows.into_iter().filter_map(block).collect())
            })
        })
        .await
    }

    /// Runs `work` (the statements of one action) in a transaction on the
    /// actions connection, within the session's hard limit.
    pub(super) async fn transaction<T, F>(&self, session: &Session, work: F) -> Result<T, StoreError>
    where
        F: for<'c> FnOnce(&'c mut PgConnection, bool) -> Work<'c, T> + Send + 'static,
        T: Send,
    {
        let done = self.0.with(session, move |conn, session| {
            Box::pin(async move {
                let mut tx = session.begin(conn).await?;
                let done = work(&mut tx, session.keeps_statements()).await?;
                tx.commit().await?;
                Ok(done)
            })
        });
        done.await.map_err(classify)
    }
}

/// Bumps the generation and notifies, in the action's transaction: the
/// notification is delivered on commit, and only then.
async fn announce(tx: &mut PgConnection, keys: &[Key], keep: bool) -> Result<(), sqlx::Error> {
    sqlx::query(ANNOUNCE).persistent(keep).bind(raw(keys)).execute(tx).await?;
    Ok(())
}

pub(super) fn raw(keys: &[Key]) -> Vec<&[u8]> {
    keys.iter().map(|k| k.as_slice()).collect()
}

pub(super) fn block(row: BlockRow) -> Option<Block> {
    let (key, kind, policy, bucket, until, reason, created_at) = row;
    let key: Key = key.try_into().ok()?;
    Some(Block { key, kind, policy, bucket, until, reason, created_at })
}
