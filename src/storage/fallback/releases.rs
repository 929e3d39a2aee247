//! Releases of concurrency leases asked for while Postgres is away: taken
//! on trust (a lease lives in Postgres, which cannot say whether it
//! exists), kept here, and written back when Postgres returns, before what
//! memory admitted, so that capping a full bucket drops none of the slots
//! they free.

use std::sync::Mutex;

use crate::storage::{Key, Leases, StoreError};

/// Releases kept at most; past it a release is refused (503), and the
/// lease ends by itself.
const MAX_OWED: usize = 100_000;

#[derive(Default)]
pub(super) struct OwedReleases(Mutex<Vec<Key>>);

impl OwedReleases {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Key>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a release for later: `true` the first time, `false` for a
    /// lease already released during this outage (as Postgres would say).
    pub fn keep(&self, id: &Key) -> Result<bool, StoreError> {
        let mut owed = self.lock();
        if owed.contains(id) {
            return Ok(false);
        }
        if owed.len() >= MAX_OWED {
            return Err(StoreError::Unavailable);
        }
        owed.push(*id);
        Ok(true)
    }

    pub fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    /// Writes the kept releases to `primary`; returns how many are still owed.
    pub async fn write_back(&self, primary: &impl Leases) -> usize {
        let owed = std::mem::take(&mut *self.lock());
        let mut left = Vec::new();
        for id in owed {
            if primary.release(&id).await.is_err() {
                left.push(id);
            }
        }
        let count = left.len();
        self.lock().extend(left);
        count
    }
}
