//! A connection kept open between uses, for the work that is not a check:
//! the health pings, the heartbeat, the cleanup and the actions (the lanes
//! own theirs, see [`super::call`]; the listener opens its own).
//!
//! It is opened on first need, used under a time limit, and reopened before
//! the next use when a use failed, timed out or was abandoned (its state is
//! unknown then), or when it is from before an outage ([`Session::renew`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sqlx::postgres::PgConnection;
use tokio::sync::Mutex;

use super::node::Node;
use super::session::{timed_out, Session};

/// The work of one use, borrowing the connection (and the session, which
/// [`Connection::within`] passes in so that the work need capture no borrow).
pub(super) type Work<'c, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// A connection and the session generation it was opened in.
type OpenConnection = Option<(PgConnection, u64)>;

pub(super) struct Connection {
    /// Taken out while in use and put back only after a success, so that
    /// a use cut short by its time limit leaves nothing behind.
    slot: Mutex<OpenConnection>,
    /// What the connection is for, as in "postgres timed out {what}".
    what: &'static str,
    /// The Citus worker it is opened on; `None`: the URL's server.
    node: Option<Node>,
}

impl Connection {
    /// Nothing open yet: the first use connects.
    pub fn new(what: &'static str) -> Self {
        Self { slot: Mutex::new(None), what, node: None }
    }

    /// As [`Connection::new`], on a Citus worker.
    pub fn on(what: &'static str, node: Node) -> Self {
        Self { slot: Mutex::new(None), what, node: Some(node) }
    }

    /// Keeps `conn`, a connection known to work, opened in the session's current generation.
    pub fn opened(what: &'static str, session: &Session, conn: PgConnection) -> Self {
        Self { slot: Mutex::new(Some((conn, session.generation()))), what, node: None }
    }

    /// Replaces the kept connection with `conn`, one known to work.
    pub async fn install(&self, session: &Session, conn: PgConnection) {
        *self.slot.lock().await = Some((conn, session.generation()));
    }

    /// Runs `work` on the connection within the session's hard limit.
    pub async fn with<T, F>(&self, session: &Session, work: F) -> Result<T, sqlx::Error>
    where
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Session) -> Work<'c, T> + Send,
    {
        self.within(session, session.hard_limit(), work).await
    }

    /// Runs `work` on the connection within `limit`, which includes waiting
    /// for another use to end and opening a connection.
    pub async fn within<T, F>(&self, session: &Session, limit: Duration, work: F) -> Result<T, sqlx::Error>
    where
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Session) -> Work<'c, T> + Send,
    {
        let run = async { self.run(&mut *self.slot.lock().await, session, work).await };
        tokio::time::timeout(limit, run).await.unwrap_or_else(|_| Err(timed_out(self.what)))
    }

    /// As [`Connection::within`], but when the kept connection fails (the server
    /// or a network device may have closed it while idle), `work` is tried
    /// once more on a fresh one, in what is left of `limit`.
    pub async fn within_or_afresh<T, F>(
        &self,
        session: &Session,
        limit: Duration,
        work: F,
    ) -> Result<T, sqlx::Error>
    where
        F: for<'c> Fn(&'c mut PgConnection, &'c Session) -> Work<'c, T> + Send + Sync,
    {
        let run = async {
            let mut slot = self.slot.lock().await;
            let kept = slot.as_ref().is_some_and(|(_, g)| *g == session.generation());
            match self.run(&mut slot, session, &work).await {
                Err(_) if kept => self.run(&mut slot, session, &work).await,
                done => done,
            }
        };
        tokio::time::timeout(limit, run).await.unwrap_or_else(|_| Err(timed_out(self.what)))
    }

    /// One use: the kept connection if it is current, else a new one; kept
    /// again only if `work` succeeds.
    async fn run<T, F>(&self, slot: &mut OpenConnection, session: &Session, work: F) -> Result<T, sqlx::Error>
    where
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Session) -> Work<'c, T>,
    {
        let generation = session.generation();
        let mut conn = match slot.take() {
            Some((conn, g)) if g == generation => conn,
            _ => session.open_on(self.node.as_ref()).await?,
        };
        let done = work(&mut conn, session).await?;
        *slot = Some((conn, generation));
        Ok(done)
    }
}
