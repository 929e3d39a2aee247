//! The time zones the connected server knows: its `pg_timezone_names`,
//! read when start-up prepares a server and again on each reconnect.
//!
//! A calendar window's zone travels in the batch function's `p_zones`,
//! and a zone the server's tzdata lacks (chrono-tz may be newer) fails
//! the whole statement, every check batched with it included. So a check
//! in such a zone is refused alone, before it joins a batch: by the
//! limiter (a 400 naming it, through [`crate::storage::Store::knows_zone`]),
//! and here again for any caller of the store that skipped that.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use sqlx::postgres::PgConnection;
use sqlx::{Executor, Row};

use crate::storage::Check;

/// The server's zone names; none before a server was read, when every
/// zone passes (the model knows them all).
#[derive(Default)]
pub(super) struct ServerZones(ArcSwapOption<HashSet<Box<str>>>);

impl ServerZones {
    /// Reads the names the server on `conn` lists, in place of any before.
    pub async fn read(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        // Qualified, so that no schema on the search path can stand in for
        // it; one simple-protocol message, so that it serves behind any pooler.
        let rows = conn.fetch_all("SELECT name FROM pg_catalog.pg_timezone_names").await?;
        let names = rows.iter().map(|row| row.try_get::<String, _>(0).map(String::into_boxed_str));
        self.0.store(Some(Arc::new(names.collect::<Result<_, _>>()?)));
        Ok(())
    }

    /// Whether the server read last lists `zone` (true before any was).
    pub fn knows(&self, zone: &str) -> bool {
        self.0.load().as_ref().is_none_or(|names| names.contains(zone))
    }

    /// The first calendar zone of `check` the server does not know.
    pub fn first_unknown(&self, check: &Check) -> Option<&'static str> {
        let mut zones = check.buckets.iter().filter_map(|b| b.calendar).map(|c| c.zone.name());
        zones.find(|zone| !self.knows(zone))
    }

    /// Drops `zone` from the names read, as a server with older tzdata
    /// would lack it: for tests of the refusal.
    pub fn forget(&self, zone: &str) {
        self.0.rcu(|names| {
            names.as_ref().map(|names| {
                let mut names = HashSet::clone(names);
                names.remove(zone);
                Arc::new(names)
            })
        });
    }
}
