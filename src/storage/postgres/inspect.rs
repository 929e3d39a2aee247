//! A check's rows and blocks read as they stand, for explain. Plain reads on
//! the actions connection: explain is rare, and a read creates no row and
//! locks nothing. In Citus mode the coordinator finds the rows on any shard.

use chrono::{DateTime, Utc};

use super::actions::{block, raw, BlockRow};
use super::PgStore;
use crate::algorithm::State;
use crate::storage::{Check, InspectStore, Inspection, Key, StoreError, StoreKind, Stored};

/// The columns are read as stored; no pglimit function is called, so the
/// read needs nothing installed on a Citus worker.
const ROWS: &str =
    "SELECT key, count, prev_count, expires_at, tat_us, log FROM pglimit_buckets WHERE key = ANY ($1::bytea[])";

const BLOCKS: &str = "
SELECT key, kind, policy, bucket, until, reason, created_at FROM pglimit_blocks
WHERE key = ANY ($1::bytea[]) AND until > $2";

type Row = (Vec<u8>, i64, i64, DateTime<Utc>, Option<i64>, Option<Vec<i64>>);

impl InspectStore for PgStore {
    async fn inspect(&self, check: &Check) -> Result<Inspection, StoreError> {
        let keys: Vec<Key> = check.buckets.iter().map(|b| b.key).collect();
        let (now, rows, blocks) = self
            .actions
            .transaction(&self.session, move |tx, keep| {
                Box::pin(async move {
                    let (now,): (DateTime<Utc>,) =
                        sqlx::query_as("SELECT now()").persistent(keep).fetch_one(&mut *tx).await?;
                    let rows: Vec<Row> =
                        sqlx::query_as(ROWS).persistent(keep).bind(raw(&keys)).fetch_all(&mut *tx).await?;
                    let read = sqlx::query_as(BLOCKS).persistent(keep).bind(raw(&keys)).bind(now);
                    let blocks: Vec<BlockRow> = read.fetch_all(&mut *tx).await?;
                    Ok((now, rows, blocks))
                })
            })
            .await?;
        let states: Vec<(Key, State)> = rows.into_iter().filter_map(state_of).collect();
        let blocks: Vec<_> = blocks.into_iter().filter_map(block).collect();
        let buckets = check
            .buckets
            .iter()
            .map(|b| Stored {
                state: states.iter().find(|(k, _)| *k == b.key).map(|(_, s)| s.clone()),
                block: blocks.iter().find(|k| k.key == b.key).cloned(),
            })
            .collect();
        Ok(Inspection {
            now,
            store: StoreKind::Postgres,
            degraded: false,
            share: 1,
            buckets,
            blocks_known: true,
            remembered_until: None,
        })
    }
}

fn state_of((key, count, prev, expires_at, tat_us, log): Row) -> Option<(Key, State)> {
    let key: Key = key.try_into().ok()?;
    let (count, prev) = (count.max(0).unsigned_abs(), prev.max(0).unsigned_abs());
    let expires_us = expires_at.timestamp_micros();
    Some((key, State { count, prev, expires_us, tat_us: tat_us.unwrap_or(0), log: log.unwrap_or_default() }))
}
