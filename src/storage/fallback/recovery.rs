//! Returning to Postgres: probe until it answers, then hand back what
//! memory admitted during the outage, then serve from Postgres again.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;

use super::{longest_wait, FallbackStore};
use crate::storage::{Primary, StoreError};

/// Smallest budget for a recovery probe, which must open a connection.
const MIN_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

impl<P: Primary> FallbackStore<P> {
    /// Runs until Postgres is back and has taken what memory admitted.
    pub(super) async fn recover(self) {
        let budget = self.inner.timeout.max(MIN_PROBE_TIMEOUT);
        loop {
            tokio::time::sleep(self.inner.probe_every).await;
            if !matches!(tokio::time::timeout(budget, self.inner.primary.probe()).await, Ok(Ok(()))) {
                continue;
            }
            let written = match self.write_back().await {
                Ok(written) => written,
                Err(error) => {
                    tracing::warn!(%error, "postgres answered, but taking back what memory admitted failed; retrying");
                    continue;
                }
            };
            self.inner.degraded.store(false, Ordering::Release);
            // Checks admitted from memory while the first write-back ran.
            let late = self.write_back().await.unwrap_or_else(|error| {
                tracing::warn!(%error, "postgres is back, but some checks admitted from memory were not written back");
                0
            });
            tracing::info!(buckets = written + late, "postgres is back: serving from postgres again");
            return;
        }
    }

    /// Moves every state memory holds into Postgres; on failure, puts them
    /// back in memory. Returns how many buckets were written.
    async fn write_back(&self) -> Result<usize, StoreError> {
        let held = self.inner.memory.drain(Utc::now());
        if held.is_empty() {
            return Ok(0);
        }
        let count = held.len();
        let budget = longest_wait(self.inner.timeout);
        match tokio::time::timeout(budget, self.inner.primary.absorb(held.clone())).await {
            Ok(Ok(())) => Ok(count),
            Ok(Err(error)) => {
                self.inner.memory.restore(held, Utc::now());
                Err(error)
            }
            Err(_) => {
                self.inner.memory.restore(held, Utc::now());
                Err(StoreError::Unreachable("writing back what memory admitted timed out".into()))
            }
        }
    }
}
