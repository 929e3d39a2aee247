//! Writing what memory admitted during an outage into the shared rows.
//!
//! One transaction per chunk: the rows are created if missing (as expired
//! rows, as a check does) and locked in key order, read, folded together
//! with the outage's states by the model ([`crate::algorithm::absorb`]),
//! and written back. Locking first means no check can change a row between
//! our read and our write.
//!
//! A commit whose answer does not arrive in time may still have committed:
//! retrying it would count the outage's admissions twice. So each chunk
//! notes its transaction id, and such a commit's fate is asked of the
//! server (`pg_xact_status`) before the chunk is called unwritten.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{Connection, Transaction};

use super::layout::{Absorbing, StoredRow};
use super::session::{timed_out, Session};
use crate::algorithm::{absorb, State};
use crate::storage::{Held, Key};

/// Most buckets written back in one transaction.
const CHUNK: usize = 1_000;
/// How often a commit of unknown outcome is asked about.
const SETTLE_POLL: Duration = Duration::from_millis(50);

/// Folds every held state into its row, a chunk per transaction, each
/// within `budget`; on failure, returns what was not written.
pub(super) async fn absorb_all(
    session: &Session,
    conn: &mut PgConnection,
    mut outage: Vec<Held>,
) -> Result<(), (sqlx::Error, Vec<Held>)> {
    let (budget, layout): (Duration, _) = (session.hard_limit(), session.layout());
    layout.order_held(&mut outage);
    while let Some((len, absorbing)) = layout.absorb(&outage, CHUNK) {
        let rest = outage.split_off(len);
        if let Err(e) = absorb_chunk(session, conn, &outage, &absorbing, budget).await {
            outage.extend(rest);
            return Err((e, outage));
        }
        outage = rest;
    }
    Ok(())
}

async fn absorb_chunk(
    session: &Session,
    conn: &mut PgConnection,
    chunk: &[Held],
    absorbing: &Absorbing,
    budget: Duration,
) -> Result<(), sqlx::Error> {
    let written = tokio::time::timeout(budget, write_chunk(session, conn, chunk, absorbing)).await;
    let (tx, xid) = written.unwrap_or_else(|_| Err(timed_out("writing back what memory admitted")))?;
    match tokio::time::timeout(budget, tx.commit()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => settle(session, &xid, e, budget).await,
        Err(_) => settle(session, &xid, timed_out("committing what memory admitted"), budget).await,
    }
}

/// Everything but the commit; returns the open transaction and its id.
async fn write_chunk<'c>(
    session: &Session,
    conn: &'c mut PgConnection,
    chunk: &[Held],
    absorbing: &Absorbing,
) -> Result<(Transaction<'c, Postgres>, String), sqlx::Error> {
    let keep = session.keeps_statements();
    let mut tx = session.begin(conn).await?;
    let keys: Vec<&[u8]> = chunk.iter().map(|h| &h.key[..]).collect();
    let rows = absorbing.lock_and_read(&mut tx, &keys, keep).await?;
    let now_us = rows.first().map_or(0, |r| r.6);
    let stored: HashMap<Key, State> = rows.into_iter().filter_map(state_of).collect();
    let merged: Vec<(&Key, State)> = chunk
        .iter()
        .filter_map(|h| absorb(h.params, stored.get(&h.key), &h.state, now_us).map(|s| (&h.key, s)))
        .collect();
    absorbing.write(&mut tx, &merged, keep).await?;
    let xid: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text").fetch_one(&mut *tx).await?;
    Ok((tx, xid))
}

/// Whether the transaction `xid`, whose commit failed with `error` on the
/// client's side, committed on the server: asked on a new connection until
/// the server knows (a commit it received is finished even if the client
/// has gone). Unknown within `budget` counts as unwritten, and says so.
async fn settle(
    session: &Session,
    xid: &str,
    error: sqlx::Error,
    budget: Duration,
) -> Result<(), sqlx::Error> {
    let deadline = tokio::time::Instant::now() + budget;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout_at(deadline, xact_status(session, xid)).await {
            Ok(Ok(status)) if status == "committed" => return Ok(()),
            Ok(Ok(status)) if status == "aborted" => return Err(error),
            _ => tokio::time::sleep(SETTLE_POLL).await,
        }
    }
    tracing::warn!(%error, "a write-back's commit has no known outcome; it is kept to write again");
    Err(error)
}

async fn xact_status(session: &Session, xid: &str) -> Result<String, sqlx::Error> {
    let mut conn = session.open().await?;
    let status: Option<String> =
        sqlx::query_scalar("SELECT pg_xact_status($1::xid8)").bind(xid).fetch_one(&mut conn).await?;
    let _ = conn.close().await;
    Ok(status.unwrap_or_default())
}

fn state_of((key, count, prev, expires_us, tat_us, log, _): StoredRow) -> Option<(Key, State)> {
    let key: Key = key.try_into().ok()?;
    let (count, prev) = (count.max(0) as u64, prev.max(0) as u64);
    Some((key, State { count, prev, expires_us, tat_us, log }))
}
