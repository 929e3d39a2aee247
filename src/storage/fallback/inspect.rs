//! Explain's read through the fallback: Postgres' rows while it answers,
//! else what this instance holds in memory, at the share of each limit it
//! enforces there.

use super::{longest_wait, FallbackStore};
use crate::storage::{Check, InspectStore, Inspection, MemoryFallback, Primary, Store, StoreError};

impl<P: Primary + InspectStore> InspectStore for FallbackStore<P> {
    async fn inspect(&self, check: &Check) -> Result<Inspection, StoreError> {
        if !self.is_degraded() {
            let read = self.inner.primary.inspect(check);
            match tokio::time::timeout(longest_wait(self.inner.timeout), read).await {
                Ok(Ok(inspection)) => return Ok(inspection),
                // Explain changes nothing, so it never trips the fallback: the
                // checks decide that. It says the answer is from memory.
                Ok(Err(error)) => tracing::debug!(%error, "explain could not read postgres"),
                Err(_) => tracing::debug!("explain's read of postgres timed out"),
            }
        }
        let share = match check.fallback {
            MemoryFallback::Split => self.instances(),
            MemoryFallback::Full | MemoryFallback::Refuse => 1,
        };
        let mut inspection = self.inner.memory.inspection(check, share);
        inspection.degraded = true;
        Ok(inspection)
    }
}
