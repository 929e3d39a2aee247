//! The remembered denials, and an index from each bucket key to the
//! denials that involve it, so that an action forgets what it made stale
//! without reading the rest: resets after logins during an attack, when the
//! cache is fullest, must not stall the checks waiting on its lock.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::storage::{Answer, Key, Stale};

/// One remembered denial, by the fingerprint of its check.
pub(super) struct Remembered {
    /// The remembered retry time on this host's monotonic clock: the
    /// database's `retry_at - now` added to the moment we heard it, so a
    /// clock difference between the hosts cannot stretch it.
    pub until: Instant,
    /// The database's `retry_at` that `until` stands for.
    pub retry: DateTime<Utc>,
    pub checked: Answer,
    /// The check's bucket keys, so that an action on one forgets it.
    pub keys: Vec<Key>,
}

/// The denials and the index, kept consistent by every change going
/// through [`Entries::insert`] and [`Entries::remove`].
#[derive(Default)]
pub(super) struct Entries {
    map: HashMap<u64, Remembered>,
    by_key: HashMap<Key, HashSet<u64>>,
}

impl Entries {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, fingerprint: u64) -> Option<&Remembered> {
        self.map.get(&fingerprint)
    }

    pub fn insert(&mut self, fingerprint: u64, remembered: Remembered) {
        // A fingerprint seen before (its denial expired) is indexed afresh.
        self.remove(fingerprint);
        for key in &remembered.keys {
            self.by_key.entry(*key).or_default().insert(fingerprint);
        }
        self.map.insert(fingerprint, remembered);
    }

    fn remove(&mut self, fingerprint: u64) {
        let Some(gone) = self.map.remove(&fingerprint) else { return };
        for key in &gone.keys {
            if let Some(fingerprints) = self.by_key.get_mut(key) {
                fingerprints.remove(&fingerprint);
                if fingerprints.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
    }

    /// Drops the denials whose retry time has passed.
    pub fn sweep(&mut self, now: Instant) {
        let expired: Vec<u64> = self.map.iter().filter(|(_, r)| r.until <= now).map(|(f, _)| *f).collect();
        for fingerprint in expired {
            self.remove(fingerprint);
        }
    }

    /// Forgets every denial involving a stale key, reading only those.
    pub fn forget(&mut self, stale: &Stale) {
        match stale {
            Stale::All => *self = Self::default(),
            Stale::Keys(keys) => {
                for key in keys {
                    for fingerprint in self.by_key.remove(key).unwrap_or_default() {
                        self.remove(fingerprint);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::storage::StoreKind;

    fn denial(until: Instant, keys: &[Key]) -> Remembered {
        let now = Utc::now();
        let checked = Answer {
            buckets: vec![],
            now,
            store: StoreKind::Postgres,
            degraded: false,
            cached: false,
            timing: None,
        };
        Remembered { until, retry: now, checked, keys: keys.to_vec() }
    }

    /// The index holds exactly each remembered denial under each of its keys.
    fn assert_consistent(entries: &Entries) {
        let mut expected: HashMap<Key, HashSet<u64>> = HashMap::new();
        for (fingerprint, r) in &entries.map {
            for key in &r.keys {
                expected.entry(*key).or_default().insert(*fingerprint);
            }
        }
        assert_eq!(entries.by_key, expected);
    }

    fn remembered(entries: &Entries) -> Vec<u64> {
        let mut fingerprints: Vec<u64> = entries.map.keys().copied().collect();
        fingerprints.sort_unstable();
        fingerprints
    }

    #[test]
    fn the_index_follows_inserts_sweeps_and_forgetting() {
        let now = Instant::now();
        let (past, later) = (now, now + Duration::from_secs(60)); // a denial ending now is over
        let mut entries = Entries::default();
        entries.insert(1, denial(past, &[[1; 32], [9; 32]]));
        entries.insert(2, denial(later, &[[2; 32], [9; 32]]));
        entries.insert(3, denial(past, &[[3; 32]]));
        entries.insert(4, denial(later, &[[4; 32], [9; 32]]));
        entries.insert(4, denial(later, &[[4; 32], [5; 32]])); // the same fingerprint again
        assert_consistent(&entries);
        entries.sweep(now);
        assert_consistent(&entries);
        assert_eq!(remembered(&entries), [2, 4]);
        assert!(!entries.by_key.contains_key(&[1; 32]), "a swept denial leaves no key behind");
        entries.forget(&Stale::of([[5; 32], [7; 32]]));
        assert_consistent(&entries);
        assert_eq!(remembered(&entries), [2]);
    }

    #[test]
    fn forgetting_a_key_drops_every_denial_involving_it_and_only_those() {
        let later = Instant::now() + Duration::from_secs(60);
        let mut entries = Entries::default();
        entries.insert(1, denial(later, &[[1; 32], [9; 32]]));
        entries.insert(2, denial(later, &[[9; 32]]));
        entries.insert(3, denial(later, &[[3; 32]]));
        entries.forget(&Stale::of([[9; 32]]));
        assert_eq!(remembered(&entries), [3]);
        assert_consistent(&entries);
        entries.forget(&Stale::All);
        assert_eq!((entries.len(), entries.by_key.len()), (0, 0));
    }
}
