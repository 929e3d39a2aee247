//! Releasing and renewing a concurrency bucket's lease: each one call of a
//! function of `sql/leases.sql`, in its own transaction on the actions'
//! connection. A release notifies every instance itself (in SQL), so that
//! they forget the key's denials and a waiter may take the slot.

use chrono::{DateTime, Utc};

use super::actions::ActionConn;
use super::session::Session;
use crate::storage::{Key, Renewal, StoreError};

const RELEASE: &str = "SELECT pglimit_release($1)";
const RENEW: &str = "SELECT o_ends, o_ends_by, o_renewed FROM pglimit_renew($1)";

/// What `pglimit_renew` answers: when the lease ends, the latest it may,
/// and whether it was extended.
type Renewed = (Option<DateTime<Utc>>, Option<DateTime<Utc>>, bool);

impl ActionConn {
    pub async fn release(&self, session: &Session, id: &Key) -> Result<Option<bool>, StoreError> {
        let id = id.to_vec();
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let (freed,): (Option<bool>,) =
                    sqlx::query_as(RELEASE).persistent(keep).bind(id).fetch_one(&mut *tx).await?;
                Ok(freed)
            })
        })
        .await
    }

    pub async fn renew(&self, session: &Session, id: &Key) -> Result<Renewal, StoreError> {
        let id = id.to_vec();
        self.transaction(session, move |tx, keep| {
            Box::pin(async move {
                let row: Renewed =
                    sqlx::query_as(RENEW).persistent(keep).bind(id).fetch_one(&mut *tx).await?;
                Ok(renewal(row))
            })
        })
        .await
    }
}

fn renewal(row: Renewed) -> Renewal {
    match row {
        (Some(ends), _, true) => Renewal::Renewed(ends),
        (Some(ends), Some(ends_by), false) => Renewal::PastMaxLife { ends, ends_by },
        _ => Renewal::Unknown,
    }
}
