//! What the fallback asks of Postgres: is it there, how fast does it
//! answer, and take back what memory decided during an outage.

use std::time::Duration;

use sqlx::Connection;

use super::session::{self, classify};
use super::{absorb, PgStore};
use crate::storage::{Held, Primary, StoreError, Unabsorbed};

impl Primary for PgStore {
    /// `SELECT 1` on the connection kept for it: the lanes' connections may
    /// all be busy (or dead), so they cannot tell.
    async fn ping(&self, budget: Duration) -> Result<(), StoreError> {
        self.health.ping(&self.session, budget).await
    }

    /// A fresh connection and `SELECT 1`; on success every lane reconnects
    /// before its next check, so no connection from before an outage is
    /// reused, and the fresh one becomes the health connection.
    ///
    /// In Citus mode, every route is pinged through the coordinator: the
    /// coordinator answering says nothing of the workers. The server's
    /// time zones are read again: it may be another server now.
    async fn probe(&self) -> Result<(), StoreError> {
        let mut conn = self.session.open().await.map_err(classify)?;
        session::ping_writable(&mut conn).await.map_err(classify)?;
        self.session.layout().ping_workers(&mut conn).await.map_err(classify)?;
        self.session.zones().read(&mut conn).await.map_err(classify)?;
        self.session.renew();
        self.health.install(&self.session, conn).await;
        Ok(())
    }

    fn recent_latency(&self) -> Duration {
        self.health.recent_latency()
    }

    /// On a connection of its own, closed after, so that a chunk cut short
    /// leaves no transaction behind.
    async fn absorb(&self, outage: Vec<Held>) -> Result<(), Unabsorbed> {
        let mut conn = match self.session.open().await {
            Ok(conn) => conn,
            Err(e) => return Err(Unabsorbed { error: classify(e), left: outage }),
        };
        let result = absorb::absorb_all(&self.session, &mut conn, outage).await;
        let _ = conn.close().await;
        result.map_err(|(e, left)| Unabsorbed { error: classify(e), left })
    }
}
