//! Denials counted in memory per minute and bucket key, until a flush
//! takes them. Sharded by key, so that the deny flood's denials of many
//! keys rarely meet on one lock; a repeated denial of a key in a minute
//! only adds to its entry, without allocating.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use crate::storage::{Key, MinuteDenials};
use crate::telemetry;

const SHARDS: usize = 16;

/// One key's denials in one minute, and what its row shows.
struct Entry {
    policy: Arc<str>,
    bucket: Arc<str>,
    shown: Option<Arc<str>>,
    count: u64,
}

/// The entries of one shard, by (minute in seconds since the epoch, key).
type Shard = HashMap<(i64, Key), Entry>;

/// What is counted and not yet written. Holds at most `capacity` keys and
/// minutes; a denial past that is counted as lost (`pglimit_top_lost_total`).
pub struct Tally {
    on: bool,
    shards: [Mutex<Shard>; SHARDS],
    per_shard: usize,
    /// Denials lost since the last [`Tally::take_lost`].
    lost: AtomicU64,
}

/// A denial to count: which bucket, of which policy, denied which key.
pub struct Denial<'a> {
    pub key: Key,
    pub policy: &'a Arc<str>,
    pub bucket: &'a Arc<str>,
    pub shown: Option<&'a Arc<str>>,
}

impl Tally {
    /// Counting, at most `capacity` keys and minutes at once.
    pub fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self { on: true, shards: Default::default(), per_shard, lost: AtomicU64::new(0) }
    }

    /// Counting nothing (`PGLIMIT_TOP=off`).
    pub fn off() -> Self {
        Self { on: false, ..Self::new(1) }
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Counts one denial answered at `at`.
    pub fn add(&self, at: DateTime<Utc>, denial: Denial<'_>) {
        if !self.on {
            return;
        }
        let minute = at.timestamp().div_euclid(60) * 60;
        let mut shard = self.shard(&denial.key);
        if let Some(entry) = shard.get_mut(&(minute, denial.key)) {
            entry.count += 1;
            return;
        }
        if shard.len() >= self.per_shard {
            drop(shard);
            self.lose(1);
            return;
        }
        let entry = Entry {
            policy: Arc::clone(denial.policy),
            bucket: Arc::clone(denial.bucket),
            shown: denial.shown.cloned(),
            count: 1,
        };
        shard.insert((minute, denial.key), entry);
    }

    /// Everything counted since the last take, emptied.
    pub fn take(&self) -> Vec<MinuteDenials> {
        let mut rows = Vec::new();
        for shard in &self.shards {
            let taken = std::mem::take(&mut *lock(shard));
            rows.extend(taken.into_iter().map(|((minute, key), e)| MinuteDenials {
                minute: DateTime::from_timestamp(minute, 0).unwrap_or_default(),
                key,
                policy: e.policy,
                bucket: e.bucket,
                shown: e.shown,
                count: e.count,
            }));
        }
        rows
    }

    /// Puts back `rows` a flush could not write, added to what was counted
    /// since; what no longer fits is lost.
    pub fn restore(&self, rows: Vec<MinuteDenials>) {
        for row in rows {
            let mut shard = self.shard(&row.key);
            let slot = (row.minute.timestamp(), row.key);
            if let Some(entry) = shard.get_mut(&slot) {
                entry.count += row.count;
            } else if shard.len() < self.per_shard {
                let MinuteDenials { policy, bucket, shown, count, .. } = row;
                shard.insert(slot, Entry { policy, bucket, shown, count });
            } else {
                drop(shard);
                self.lose(row.count);
            }
        }
    }

    /// Denials lost since the last call.
    pub fn take_lost(&self) -> u64 {
        self.lost.swap(0, Ordering::Relaxed)
    }

    fn lose(&self, denials: u64) {
        self.lost.fetch_add(denials, Ordering::Relaxed);
        telemetry::top_lost(denials);
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        lock(&self.shards[usize::from(key[0]) % SHARDS])
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny(tally: &Tally, key: u8, at: &str) {
        let (policy, bucket) = (Arc::from("login"), Arc::from("ip"));
        let at: DateTime<Utc> = at.parse().expect("a time");
        tally.add(at, Denial { key: [key; 32], policy: &policy, bucket: &bucket, shown: None });
    }

    #[test]
    fn denials_of_one_key_in_one_minute_are_one_row_and_the_next_minute_another() {
        let tally = Tally::new(100);
        for at in ["2026-12-07T10:00:01Z", "2026-12-07T10:00:59Z", "2026-12-07T10:01:00Z"] {
            deny(&tally, 1, at);
        }
        let mut rows = tally.take();
        rows.sort_by_key(|r| r.minute);
        assert_eq!(rows.iter().map(|r| r.count).collect::<Vec<_>>(), [2, 1]);
        assert!(tally.take().is_empty(), "a take empties the tally");
    }

    #[test]
    fn past_its_capacity_a_new_key_is_lost_and_rows_put_back_add_up() {
        let tally = Tally::new(1);
        deny(&tally, 1, "2026-12-07T10:00:00Z");
        deny(&tally, 1, "2026-12-07T10:00:00Z");
        deny(&tally, 2, "2026-12-07T10:00:00Z");
        let rows = tally.take();
        assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), 3, "one key per shard fits");
        deny(&tally, 1, "2026-12-07T10:00:00Z");
        tally.restore(rows);
        let rows = tally.take();
        assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), 4);
        deny(&tally, 1, "2026-12-07T10:00:00Z");
        deny(&tally, 1 + SHARDS as u8, "2026-12-07T10:00:00Z");
        assert_eq!(tally.take_lost(), 1, "a second key in a full shard is lost");
    }

    #[test]
    fn a_tally_that_is_off_counts_nothing() {
        let tally = Tally::off();
        deny(&tally, 1, "2026-12-07T10:00:00Z");
        assert!(tally.take().is_empty());
    }
}
