//! The top list's table, `pglimit_denials`: counts added in one statement
//! per flush, and summed over every instance's rows when read. It is a
//! plain table of the URL's server (in Citus mode, the coordinator's), on
//! the actions' connection: a flush is a few milliseconds every few seconds.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::PgStore;
use crate::storage::{DenialStore, Key, KeyDenials, MinuteDenials, StoreError, TopKey, TopList, TopQuery};

/// Rows sorted by (key, minute), so that two instances' flushes lock the
/// rows they share in one order.
const ADD: &str = "
INSERT INTO pglimit_denials AS d (minute, key, policy, bucket, shown, count)
SELECT u.minute, u.key, u.policy, u.bucket, u.shown::jsonb, u.count
FROM unnest($1::timestamptz[], $2::bytea[], $3::text[], $4::text[], $5::text[], $6::bigint[])
    AS u(minute, key, policy, bucket, shown, count)
ON CONFLICT (key, minute) DO UPDATE SET count = d.count + excluded.count,
    shown = coalesce(excluded.shown, d.shown)";

/// The minute `$1` microseconds ago began, and the database's now.
const SPAN: &str = "SELECT date_trunc('minute', now() - $1::bigint * interval '1 microsecond'), now()";

const TOP: &str = "
SELECT policy, bucket, key, ((array_agg(shown) FILTER (WHERE shown IS NOT NULL))[1])::text,
    sum(count)::bigint AS denials, min(minute), max(minute)
FROM pglimit_denials
WHERE minute >= $1 AND ($2::text IS NULL OR policy = $2) AND ($3::text IS NULL OR bucket = $3)
GROUP BY policy, bucket, key
ORDER BY denials DESC, key
LIMIT $4";

const OF_KEYS: &str = "
SELECT k.key, coalesce(sum(d.count), 0)::bigint, max(d.minute)
FROM unnest($1::bytea[]) AS k(key)
LEFT JOIN pglimit_denials d ON d.key = k.key AND d.minute >= $2
GROUP BY k.key";

type TopRow = (String, String, Vec<u8>, Option<String>, i64, DateTime<Utc>, DateTime<Utc>);

/// The columns of [`ADD`], one array each.
#[derive(Default)]
struct Columns {
    minutes: Vec<DateTime<Utc>>,
    keys: Vec<Vec<u8>>,
    policies: Vec<String>,
    buckets: Vec<String>,
    shown: Vec<Option<String>>,
    counts: Vec<i64>,
}

impl Columns {
    fn of(rows: &[MinuteDenials]) -> Self {
        let mut sorted: Vec<&MinuteDenials> = rows.iter().collect();
        sorted.sort_unstable_by_key(|r| (r.key, r.minute));
        let mut columns = Self::default();
        for row in sorted {
            columns.minutes.push(row.minute);
            columns.keys.push(row.key.to_vec());
            columns.policies.push(row.policy.to_string());
            columns.buckets.push(row.bucket.to_string());
            columns.shown.push(row.shown.as_deref().map(str::to_owned));
            columns.counts.push(i64::try_from(row.count).unwrap_or(i64::MAX));
        }
        columns
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl DenialStore for PgStore {
    async fn add_denials(&self, rows: &[MinuteDenials]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let c = Columns::of(rows);
        self.actions
            .transaction(&self.session, move |tx, keep| {
                Box::pin(async move {
                    let add = sqlx::query(ADD).persistent(keep).bind(c.minutes).bind(c.keys);
                    let add = add.bind(c.policies).bind(c.buckets).bind(c.shown).bind(c.counts);
                    add.execute(&mut *tx).await?;
                    Ok(())
                })
            })
            .await
    }

    async fn top(&self, query: &TopQuery) -> Result<TopList, StoreError> {
        let query = query.clone();
        self.actions
            .transaction(&self.session, move |tx, keep| {
                Box::pin(async move {
                    let (since, until): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(SPAN)
                        .persistent(keep)
                        .bind(micros(query.since))
                        .fetch_one(&mut *tx)
                        .await?;
                    let rows: Vec<TopRow> = sqlx::query_as(TOP)
                        .persistent(keep)
                        .bind(since)
                        .bind(query.policy)
                        .bind(query.bucket)
                        .bind(i64::from(query.limit))
                        .fetch_all(&mut *tx)
                        .await?;
                    Ok(TopList { since, until, keys: rows.into_iter().filter_map(top_key).collect() })
                })
            })
            .await
    }

    async fn denials_of(&self, keys: &[Key], since: Duration) -> Result<Vec<KeyDenials>, StoreError> {
        let wanted: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        let rows: Vec<(Vec<u8>, i64, Option<DateTime<Utc>>)> = self
            .actions
            .transaction(&self.session, move |tx, keep| {
                Box::pin(async move {
                    let (since, _): (DateTime<Utc>, DateTime<Utc>) =
                        sqlx::query_as(SPAN).persistent(keep).bind(micros(since)).fetch_one(&mut *tx).await?;
                    let of_keys = sqlx::query_as(OF_KEYS).persistent(keep).bind(wanted).bind(since);
                    of_keys.fetch_all(&mut *tx).await
                })
            })
            .await?;
        let found = |key: &Key| rows.iter().find(|(k, _, _)| k.as_slice() == key.as_slice());
        let of = |key: &Key| {
            let (denials, last) = found(key).map_or((0, None), |(_, n, last)| (*n, *last));
            KeyDenials { key: *key, denials: denials.max(0) as u64, last }
        };
        Ok(keys.iter().map(of).collect())
    }

    fn keep_denials_for(&self, retention: Duration) {
        self.cleanup.keep_denials_for(retention);
    }
}

fn top_key(row: TopRow) -> Option<TopKey> {
    let (policy, bucket, key, shown, denials, first, last) = row;
    let shown = shown.and_then(|text| serde_json::from_str(&text).ok());
    Some(TopKey {
        policy,
        bucket,
        key: key.try_into().ok()?,
        shown,
        denials: denials.max(0) as u64,
        first,
        last,
    })
}
