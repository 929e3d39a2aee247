//! Releases of concurrency leases asked for while Postgres is away: kept
//! here, answered as Postgres would have, and written back when it
//! returns, before what memory admitted, so that capping a full bucket
//! drops none of the slots they free.
//!
//! Postgres alone knows which ids are leases, so the set is bounded by
//! what this instance can vouch for, and ids never issued cannot fill it:
//!
//! - a lease this instance took or renewed through Postgres, still live
//!   ([`Issued`]), is always kept: it moves from there to here, so these
//!   never outnumber the leases this instance granted;
//! - any other id (another instance's lease, or a made-up one) is kept only
//!   while such releases number fewer than `(instances - 1) ×` the leases
//!   this instance knows of: each other instance could have granted about
//!   as many as this one. On a lone instance that is none: every lease is
//!   its own. Past it the release is refused (503) and the lease, if there
//!   is one, ends by itself.
//!
//! Lookups are in a hash set: a flood of releases costs each the same.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use chrono::Utc;

use super::issued::{Issued, MAX_ISSUED};
use crate::storage::{Key, LeaseStore, StoreError};

/// Releases of ids this instance cannot vouch for, kept at most however
/// many instances there are.
const MAX_VOUCHED_FOR_BY_OTHERS: usize = MAX_ISSUED;

/// Whether this instance knew the released lease.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Known,
    Unknown,
}

#[derive(Default)]
pub(super) struct OwedReleases(Mutex<Owed>);

#[derive(Default)]
struct Owed {
    ids: HashMap<Key, Origin>,
    /// How many of `ids` this instance knew.
    known: usize,
}

impl Owed {
    fn add(&mut self, id: Key, origin: Origin) {
        if self.ids.insert(id, origin).is_none() && origin == Origin::Known {
            self.known += 1;
        }
    }
}

impl OwedReleases {
    fn lock(&self) -> MutexGuard<'_, Owed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a release for later, as the module says: `Some(true)` the
    /// first time, `Some(false)` for a lease already released during this
    /// outage, or one this instance knows has ended (as Postgres would say).
    pub fn keep(&self, id: &Key, issued: &Issued, instances: u64) -> Result<Option<bool>, StoreError> {
        let now = Utc::now();
        let mut owed = self.lock();
        if owed.ids.contains_key(id) {
            return Ok(Some(false));
        }
        match issued.take(id, now) {
            Some(true) => owed.add(*id, Origin::Known),
            Some(false) => return Ok(Some(false)),
            None => {
                let vouched = issued.live(now) + owed.known;
                let others = usize::try_from(instances.saturating_sub(1)).unwrap_or(usize::MAX);
                let most = vouched.saturating_mul(others).min(MAX_VOUCHED_FOR_BY_OTHERS);
                if owed.ids.len() - owed.known >= most {
                    return Err(StoreError::Unavailable);
                }
                owed.add(*id, Origin::Unknown);
            }
        }
        Ok(Some(true))
    }

    pub fn any(&self) -> bool {
        !self.lock().ids.is_empty()
    }

    /// Writes the kept releases to `primary`; returns how many are still owed.
    pub async fn write_back(&self, primary: &impl LeaseStore) -> usize {
        let owed = std::mem::take(&mut *self.lock());
        let mut left = Vec::new();
        for (id, origin) in owed.ids {
            if primary.release(&id).await.is_err() {
                left.push((id, origin));
            }
        }
        let count = left.len();
        let mut owed = self.lock();
        for (id, origin) in left {
            owed.add(id, origin);
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;
    use rand::RngCore;

    fn random_id() -> Key {
        let mut id = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut id);
        id
    }

    /// `n` leases this instance granted, live for an hour.
    fn granted(n: usize) -> (Issued, Vec<Key>) {
        let (issued, now) = (Issued::default(), Utc::now());
        let ids: Vec<Key> = (0..n).map(|_| random_id()).collect();
        for id in &ids {
            issued.note(*id, now + TimeDelta::hours(1), now);
        }
        (issued, ids)
    }

    #[test]
    fn random_ids_fill_only_the_share_of_other_instances_and_a_real_release_is_still_kept() {
        let (issued, ids) = granted(10);
        let owed = OwedReleases::default();
        let kept = (0..100_000).filter(|_| owed.keep(&random_id(), &issued, 3).is_ok()).count();
        assert_eq!(kept, 20, "(3 - 1) instances × the 10 leases this one knows");
        for id in &ids {
            assert_eq!(owed.keep(id, &issued, 3).ok(), Some(Some(true)), "a lease this instance granted");
            assert_eq!(owed.keep(id, &issued, 3).ok(), Some(Some(false)), "released already");
        }
    }

    #[test]
    fn a_lone_instance_keeps_no_release_of_an_id_it_never_issued() {
        let (issued, ids) = granted(3);
        let owed = OwedReleases::default();
        assert!(owed.keep(&random_id(), &issued, 1).is_err());
        assert_eq!(owed.keep(&ids[0], &issued, 1).ok(), Some(Some(true)));
        assert!(!owed.lock().ids.is_empty());
    }

    #[test]
    fn a_release_of_a_lease_known_to_have_ended_is_false_and_not_kept() {
        let (issued, now, id) = (Issued::default(), Utc::now(), random_id());
        issued.note(id, now - TimeDelta::seconds(1), now - TimeDelta::seconds(31));
        let owed = OwedReleases::default();
        assert_eq!(owed.keep(&id, &issued, 1).ok(), Some(Some(false)));
        assert!(!owed.any());
    }
}
