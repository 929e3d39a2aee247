//! Explain through the deny cache: the store's state, and whether this
//! instance would repeat a remembered denial of the same check instead of
//! asking the store (a support engineer's "still denied after a reset?").

use std::time::Instant;

use chrono::Utc;

use super::{fingerprint, DenyCache};
use crate::storage::{Check, InspectStore, Inspection, Store, StoreError};

impl<S: Store + InspectStore> InspectStore for DenyCache<S> {
    async fn inspect(&self, check: &Check) -> Result<Inspection, StoreError> {
        let mut inspection = self.inner.inspect(check).await?;
        // What a check would do first: forget denials an action made stale.
        if let Some(stale) = self.inner.take_stale() {
            self.forget(&stale);
        }
        let now = Instant::now();
        let until = self.lock().entries.get(fingerprint(check)).map(|r| r.until).filter(|u| now < *u);
        let left = until.map(|u| u.saturating_duration_since(now));
        inspection.remembered_until =
            left.and_then(|l| chrono::TimeDelta::from_std(l).ok()).map(|l| Utc::now() + l);
        Ok(inspection)
    }
}
