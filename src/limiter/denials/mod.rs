//! The top list: who is being limited. Every denial a caller sees is
//! counted in memory where its decision is known (`Checks`, and `Waiting`
//! for a held check's last answer), per minute, policy, bucket and key
//! ([`Tally`]); [`Top`] writes the counts every [`FLUSH_EVERY`] through a
//! [`DenialStore`] (one statement), puts them back when Postgres is away,
//! writes them a last time at shutdown, and reads the list summed over
//! every instance. Counting changes no limit.

mod tally;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

pub use tally::{Denial, Tally};

use crate::storage::{DenialStore, Key, KeyDenials, StoreError, TopList, TopQuery};

/// How often each instance writes what it counted: a write every few
/// seconds, not one per denial.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// The counts of this instance and where they are written.
pub struct Top<D> {
    tally: Arc<Tally>,
    store: D,
    retention: Duration,
    /// One flush at a time, so that counts put back after a failed write
    /// are not passed by a later one.
    flushing: Mutex<()>,
}

impl<D: DenialStore> Top<D> {
    /// Writes `tally`'s counts to `store`, which keeps them `retention` long.
    pub fn new(tally: Arc<Tally>, store: D, retention: Duration) -> Self {
        store.keep_denials_for(retention);
        Self { tally, store, retention, flushing: Mutex::new(()) }
    }

    /// Whether denials are counted at all (`PGLIMIT_TOP`).
    pub fn is_on(&self) -> bool {
        self.tally.is_on()
    }

    /// How long minutes are kept (`PGLIMIT_TOP_RETENTION`).
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Writes what was counted since the last flush; returns how many rows.
    /// If the write fails the counts are kept for the next one, and those
    /// that no longer fit in memory are lost (and said so).
    pub async fn flush(&self) -> Result<usize, StoreError> {
        let _one = self.flushing.lock().await;
        let rows = self.tally.take();
        let written = rows.len();
        let result = match self.store.add_denials(&rows).await {
            Ok(()) => Ok(written),
            Err(e) => {
                self.tally.restore(rows);
                Err(e)
            }
        };
        let lost = self.tally.take_lost();
        if lost > 0 {
            tracing::warn!(
                lost,
                "denials left out of the top list: this instance held as many keys and \
                minutes as PGLIMIT_MEMORY_CAPACITY allows (see pglimit_top_lost_total)"
            );
        }
        result
    }

    /// Flushes every [`FLUSH_EVERY`] until aborted.
    pub fn spawn_flushes(self: &Arc<Self>) -> JoinHandle<()> {
        let top = Arc::clone(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(FLUSH_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Err(e) = top.flush().await {
                    tracing::debug!(error = %e, "top list: counts kept in memory until Postgres answers");
                }
            }
        })
    }

    /// The last flush, at shutdown: what cannot be written is said lost.
    pub async fn flush_at_exit(&self) {
        if let Err(e) = self.flush().await {
            let rows = self.tally.take();
            let denials: u64 = rows.iter().map(|r| r.count).sum();
            tracing::warn!(error = %e, denials, "top list: the last counts could not be written and are lost");
        }
    }

    /// The most-denied keys of `query`: this instance's counts written
    /// first, so the list holds every denial it answered.
    pub async fn list(&self, query: &TopQuery) -> Result<TopList, StoreError> {
        self.flush().await?;
        self.store.top(query).await
    }

    /// Each of `keys`' denials from `since` ago and its last minute, this
    /// instance's counts written first (for `POST /admin/explain`).
    pub async fn denials_of(&self, keys: &[Key], since: Duration) -> Result<Vec<KeyDenials>, StoreError> {
        self.flush().await?;
        self.store.denials_of(keys, since).await
    }
}
