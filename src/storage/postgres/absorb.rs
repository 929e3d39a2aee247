//! Writing what memory admitted during an outage into the shared rows.
//!
//! One transaction per chunk: the rows are created if missing (as expired
//! rows, as a check does) and locked in key order, read, folded together
//! with the outage's states by the model ([`crate::algorithm::absorb`]),
//! and written back. Locking first means no check can change a row between
//! our read and our write.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::postgres::PgConnection;

use super::layout::{Absorbing, StoredRow};
use super::session::{timed_out, Session};
use crate::algorithm::{absorb, State};
use crate::storage::{Held, Key};

/// Most buckets written back in one transaction.
const CHUNK: usize = 1_000;

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
        let written =
            match tokio::time::timeout(budget, absorb_chunk(session, conn, &outage, &absorbing)).await {
                Ok(written) => written,
                Err(_) => Err(timed_out("writing back what memory admitted")),
            };
        if let Err(e) = written {
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
) -> Result<(), sqlx::Error> {
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
    tx.commit().await
}

fn state_of((key, count, prev, expires_us, tat_us, log, _): StoredRow) -> Option<(Key, State)> {
    let key: Key = key.try_into().ok()?;
    let (count, prev) = (count.max(0) as u64, prev.max(0) as u64);
    Some((key, State { count, prev, expires_us, tat_us, log }))
}
