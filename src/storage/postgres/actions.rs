//! Resets, blocks and unblocks: each one transaction that changes the
//! rows, bumps the actions generation and notifies every instance (see
//! [`super::listener`]). Actions are rare, so they share one connection of
//! their own, opened on demand.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::kept::{Kept, Work};
use super::listener::{payload, CHANNEL};
use super::session::{classify, Session};
use crate::storage::{Block, BlockTarget, Key, StoreError};

/// Counters back to full: no row is a full bucket, for every algorithm.
/// Lockouts go too (a reset is a fresh start); an operator's block stays.
const RESET: [&str; 2] = [
    "DELETE FROM pglimit_buckets WHERE key = ANY ($1::bytea[])",
    "DELETE FROM pglimit_blocks WHERE key = ANY ($1::bytea[]) AND kind = 'lockout'",
];

/// An operator's block replaces whatever block the key had.
const BLOCK: &str = "
INSERT INTO pglimit_blocks AS k (key, until, kind, policy, bucket, reason)
SELECT t.key, now() + $2 * interval '1 millisecond', 'admin', t.policy, t.bucket, $5
FROM unnest($1::bytea[], $3::text[], $4::text[]) AS t(key, policy, bucket)
ORDER BY t.key
ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, kind = 'admin', policy = EXCLUDED.policy,
    bucket = EXCLUDED.bucket, reason = EXCLUDED.reason, created_at = now()
RETURNING until";

/// The same in Citus mode, where a block's row also carries its key's route
/// ($6), and the update may use no `now()` of its own (Citus refuses
/// functions that are not IMMUTABLE there). Actions are rare, so they may
/// span shards (a two-phase commit).
const BLOCK_ROUTED: &str = "
INSERT INTO pglimit_blocks AS k (route, key, until, kind, policy, bucket, reason, created_at)
SELECT t.route, t.key, now() + $2 * interval '1 millisecond', 'admin', t.policy, t.bucket, $5, now()
FROM unnest($1::bytea[], $3::text[], $4::text[], $6::integer[]) AS t(key, policy, bucket, route)
ORDER BY t.route, t.key
ON CONFLICT (route, key) DO UPDATE SET until = EXCLUDED.until, kind = 'admin', policy = EXCLUDED.policy,
    bucket = EXCLUDED.bucket, reason = EXCLUDED.reason, created_at = EXCLUDED.created_at
RETURNING until";

const UNBLOCK: &str = "DELETE FROM pglimit_blocks WHERE key = ANY ($1::bytea[])";

const LIST: &str = "
SELECT key, kind, policy, bucket, until, reason, created_at FROM pglimit_blocks
WHERE until > now() ORDER BY until DESC, key LIMIT $1";

const BUMP: &str = "UPDATE pglimit_actions SET generation = generation + 1 RETURNING generation";

pub(super) struct ActionConn(Kept);

type BlockRow =
    (Vec<u8>, String, Option<String>, Option<String>, DateTime<Utc>, Option<String>, DateTime<Utc>);

impl ActionConn {
    pub fn new() -> Self {
        Self(Kept::new("acting on limits"))
    }

    pub async fn reset(&self, session: &Session, keys: &[Key]) -> Result<(), StoreError> {
        let keys = keys.to_vec();
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                for statement in RESET {
                    sqlx::query(statement).persistent(keep).bind(raw(&keys)).execute(&mut *tx).await?;
                }
                announce(tx, &keys, keep).await
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
    ) -> Result<DateTime<Utc>, StoreError> {
        let targets = targets.to_vec();
        let routes: Option<Vec<i32>> =
            session.routes().map(|r| targets.iter().map(|t| r.of(&t.key)).collect());
        let (ms, reason) =
            (i64::try_from(duration.as_millis()).unwrap_or(i64::MAX), reason.map(str::to_owned));
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let keys: Vec<Key> = targets.iter().map(|t| t.key).collect();
                let query = sqlx::query_as(if routes.is_some() { BLOCK_ROUTED } else { BLOCK })
                    .persistent(keep)
                    .bind(raw(&keys))
                    .bind(ms)
                    .bind(targets.iter().map(|t| t.policy.to_string()).collect::<Vec<_>>())
                    .bind(targets.iter().map(|t| t.bucket.to_string()).collect::<Vec<_>>())
                    .bind(reason);
                let ends: Vec<(DateTime<Utc>,)> = match routes {
                    None => query.fetch_all(&mut *tx).await?,
                    Some(routes) => query.bind(routes).fetch_all(&mut *tx).await?,
                };
                announce(tx, &keys, keep).await?;
                Ok(ends.into_iter().map(|(until,)| until).max().unwrap_or_else(Utc::now))
            })
        })
        .await
    }

    pub async fn unblock(&self, session: &Session, keys: &[Key]) -> Result<u64, StoreError> {
        let keys = keys.to_vec();
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let lifted = sqlx::query(UNBLOCK)
                    .persistent(keep)
                    .bind(raw(&keys))
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
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
    async fn transaction<T, F>(&self, session: &Session, work: F) -> Result<T, StoreError>
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
    let (generation,): (i64,) = sqlx::query_as(BUMP).persistent(keep).fetch_one(&mut *tx).await?;
    let notify = sqlx::query("SELECT pg_notify($1, $2)").persistent(keep);
    notify.bind(CHANNEL).bind(payload(generation, keys)).execute(tx).await?;
    Ok(())
}

fn raw(keys: &[Key]) -> Vec<&[u8]> {
    keys.iter().map(|k| k.as_slice()).collect()
}

fn block(row: BlockRow) -> Option<Block> {
    let (key, kind, policy, bucket, until, reason, created_at) = row;
    let key: Key = key.try_into().ok()?;
    Some(Block { key, kind, policy, bucket, until, reason, created_at })
}
