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

use super::session::{timed_out, Session};
use crate::algorithm::{absorb, State};
use crate::storage::{Held, Key};

/// Most buckets written back in one transaction.
const CHUNK: usize = 1_000;

const LOCK: &str = "
INSERT INTO pglimit_buckets AS t (key, count, expires_at)
SELECT k, 0, now() FROM unnest($1::bytea[]) AS k ORDER BY k
ON CONFLICT (key) DO UPDATE SET count = t.count WHERE false";

const READ: &str = "
SELECT key, count, prev_count, pglimit_us(expires_at), coalesce(tat_us, 0), coalesce(log, '{}'),
       pglimit_us(now())
FROM pglimit_buckets WHERE key = ANY($1) ORDER BY key FOR UPDATE";

/// Logs travel as array literals (`{1,2}`): rows of different lengths
/// cannot share one two-dimensional array.
const WRITE: &str = "
UPDATE pglimit_buckets t SET
    count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt, log = s.lg::bigint[]
FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[])
     AS s(key, c, p, e, tt, lg)
WHERE t.key = s.key";

/// The same three statements in Citus mode, confined to one route ($7 in
/// WRITE, $2 in the others), so that each transaction is on one shard.
const LOCK_ROUTE: &str = "
INSERT INTO pglimit_buckets AS t (route, key, count, expires_at)
SELECT $2, k, 0, now() FROM unnest($1::bytea[]) AS k ORDER BY k
ON CONFLICT (route, key) DO UPDATE SET count = t.count WHERE false";

const READ_ROUTE: &str = "
SELECT key, count, prev_count, pglimit_us(expires_at), coalesce(tat_us, 0), coalesce(log, '{}'),
       pglimit_us(now())
FROM pglimit_buckets WHERE route = $2 AND key = ANY($1) ORDER BY key FOR UPDATE";

const WRITE_ROUTE: &str = "
UPDATE pglimit_buckets t SET
    count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt, log = s.lg::bigint[]
FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[])
     AS s(key, c, p, e, tt, lg)
WHERE t.route = $7 AND t.key = s.key";

type Row = (Vec<u8>, i64, i64, i64, i64, Vec<i64>, i64);

/// Folds every held state into its row, a chunk per transaction, each
/// within `budget`; on failure, returns what was not written.
pub(super) async fn absorb_all(
    session: &Session,
    conn: &mut PgConnection,
    mut outage: Vec<Held>,
) -> Result<(), (sqlx::Error, Vec<Held>)> {
    let (budget, routes): (Duration, _) = (session.hard_limit(), session.routes());
    // In Citus mode a chunk holds one route's buckets only.
    if let Some(routes) = routes {
        outage.sort_by_key(|h| routes.of(&h.key));
    }
    while !outage.is_empty() {
        let mut len = outage.len().min(CHUNK);
        if let Some(routes) = routes {
            let first = routes.of(&outage[0].key);
            len = outage[..len].iter().take_while(|h| routes.of(&h.key) == first).count();
        }
        let rest = outage.split_off(len);
        let route = routes.map(|r| r.of(&outage[0].key));
        let written = match tokio::time::timeout(budget, absorb_chunk(session, conn, &outage, route)).await {
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
    route: Option<i32>,
) -> Result<(), sqlx::Error> {
    let keep = session.keeps_statements();
    let mut tx = session.begin(conn).await?;
    let keys: Vec<&[u8]> = chunk.iter().map(|h| &h.key[..]).collect();
    let rows: Vec<Row> = match route {
        None => {
            sqlx::query(LOCK).persistent(keep).bind(&keys).execute(&mut *tx).await?;
            sqlx::query_as(READ).persistent(keep).bind(&keys).fetch_all(&mut *tx).await?
        }
        Some(route) => {
            sqlx::query(LOCK_ROUTE).persistent(keep).bind(&keys).bind(route).execute(&mut *tx).await?;
            sqlx::query_as(READ_ROUTE).persistent(keep).bind(&keys).bind(route).fetch_all(&mut *tx).await?
        }
    };
    let now_us = rows.first().map_or(0, |r| r.6);
    let stored: HashMap<Key, State> = rows.into_iter().filter_map(state_of).collect();
    let merged: Vec<(&Key, State)> = chunk
        .iter()
        .filter_map(|h| absorb(h.params, stored.get(&h.key), &h.state, now_us).map(|s| (&h.key, s)))
        .collect();
    write(&mut tx, &merged, route, keep).await?;
    tx.commit().await
}

fn state_of((key, count, prev, expires_us, tat_us, log, _): Row) -> Option<(Key, State)> {
    let key: Key = key.try_into().ok()?;
    let (count, prev) = (count.max(0) as u64, prev.max(0) as u64);
    Some((key, State { count, prev, expires_us, tat_us, log }))
}

async fn write(
    conn: &mut PgConnection,
    merged: &[(&Key, State)],
    route: Option<i32>,
    keep: bool,
) -> Result<(), sqlx::Error> {
    let column = |f: fn(&State) -> i64| merged.iter().map(|(_, s)| f(s)).collect::<Vec<i64>>();
    let logs: Vec<Option<String>> = merged
        .iter()
        .map(|(_, s)| {
            let items: Vec<String> = s.log.iter().map(i64::to_string).collect();
            (!s.log.is_empty()).then(|| format!("{{{}}}", items.join(",")))
        })
        .collect();
    let query = sqlx::query(if route.is_some() { WRITE_ROUTE } else { WRITE })
        .persistent(keep)
        .bind(merged.iter().map(|(k, _)| &k[..]).collect::<Vec<_>>())
        .bind(column(|s| s.count as i64))
        .bind(column(|s| s.prev as i64))
        .bind(column(|s| s.expires_us))
        .bind(column(|s| s.tat_us))
        .bind(logs);
    match route {
        None => query.execute(conn).await?,
        Some(route) => query.bind(route).execute(conn).await?,
    };
    Ok(())
}
