//! The leases this instance knows exist: taken or renewed through it while
//! Postgres answered, and not yet ended. During an outage these are the
//! releases worth keeping whatever else is asked (`releases.rs`), since
//! Postgres is not there to say which ids are leases.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use crate::algorithm::Algorithm;
use crate::storage::{Answer, Check, Key};

/// Leases remembered at most (about 100 bytes each); past it the one that
/// ends first is forgotten, and a release of it during an outage is kept as
/// any other instance's would be.
pub(super) const MAX_ISSUED: usize = 100_000;

#[derive(Default)]
pub(super) struct Issued(Mutex<Ends>);

/// Each lease's end (ms since the epoch), by id and in order of end.
#[derive(Default)]
struct Ends {
    by_id: HashMap<Key, i64>,
    by_end: BTreeSet<(i64, Key)>,
}

impl Ends {
    fn remove(&mut self, id: &Key) -> Option<i64> {
        let end = self.by_id.remove(id)?;
        self.by_end.remove(&(end, *id));
        Some(end)
    }

    /// Forgets the leases ended by `now_ms`, then the earliest-ending ones
    /// while more than `most` are left.
    fn prune(&mut self, now_ms: i64, most: usize) {
        while let Some(&(end, id)) = self.by_end.first() {
            if end > now_ms && self.by_id.len() <= most {
                return;
            }
            self.remove(&id);
        }
    }
}

impl Issued {
    fn lock(&self) -> MutexGuard<'_, Ends> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers the lease `check` took, if Postgres admitted it: it ends
    /// with the shortest lease time among its buckets, as its answer says.
    pub fn granted(&self, check: &Check, answer: &Answer) {
        let Some(lease) = check.lease.filter(|_| answer.allowed()) else {
            return;
        };
        let concurrency = check.buckets.iter().filter(|b| b.algorithm == Algorithm::Concurrency);
        let shortest = concurrency.map(|b| b.window).min().and_then(|w| chrono::TimeDelta::from_std(w).ok());
        if let Some(ends) = shortest.and_then(|lease_time| answer.now.checked_add_signed(lease_time)) {
            self.note(lease.id, ends, answer.now);
        }
    }

    /// Remembers lease `id` as ending at `ends` (taken, or renewed: Postgres
    /// has just said it exists).
    pub fn note(&self, id: Key, ends: DateTime<Utc>, now: DateTime<Utc>) {
        let mut known = self.lock();
        known.remove(&id);
        known.by_id.insert(id, ends.timestamp_millis());
        known.by_end.insert((ends.timestamp_millis(), id));
        known.prune(now.timestamp_millis(), MAX_ISSUED);
    }

    /// Forgets lease `id` (released through Postgres: nothing left to keep).
    pub fn forget(&self, id: &Key) {
        self.lock().remove(id);
    }

    /// Takes `id` out if this instance knows it: `Some(true)` if it still
    /// holds slots, `Some(false)` if it has ended, `None` if unknown.
    pub fn take(&self, id: &Key, now: DateTime<Utc>) -> Option<bool> {
        let end = self.lock().remove(id)?;
        Some(end > now.timestamp_millis())
    }

    /// How many leases this instance knows still hold slots at `now`.
    pub fn live(&self, now: DateTime<Utc>) -> usize {
        let mut known = self.lock();
        known.prune(now.timestamp_millis(), MAX_ISSUED);
        known.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_900_000_000 + s, 0).expect("a time")
    }

    #[test]
    fn a_known_lease_is_taken_once_and_an_ended_one_says_so() {
        let issued = Issued::default();
        issued.note([1; 32], at(30), at(0));
        issued.note([2; 32], at(10), at(0));
        assert_eq!(issued.live(at(5)), 2);
        assert_eq!(issued.take(&[1; 32], at(20)), Some(true));
        assert_eq!(issued.take(&[1; 32], at(20)), None, "taken once");
        assert_eq!(issued.take(&[2; 32], at(9)).map(|live| !live), Some(false));
        issued.note([3; 32], at(10), at(0));
        assert_eq!(issued.take(&[3; 32], at(10)), Some(false), "ended at its end");
    }

    #[test]
    fn a_renewal_moves_the_end_and_ended_leases_are_forgotten() {
        let issued = Issued::default();
        issued.note([1; 32], at(10), at(0));
        issued.note([1; 32], at(40), at(5));
        issued.note([2; 32], at(20), at(5));
        assert_eq!(issued.live(at(30)), 1, "the renewed one is live, the other ended");
        assert_eq!(issued.take(&[1; 32], at(30)), Some(true));
    }
}
