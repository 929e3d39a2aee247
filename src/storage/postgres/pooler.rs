//! The server settings every statement runs under, and how they travel
//! behind a connection pooler.
//!
//! None travels in the startup packet's `options`: PgBouncer refuses that
//! parameter, and a pooler that ignores it drops the settings silently.
//! Directly or behind a session pooler, a connection keeps a `SET` made
//! once after connecting. Behind a transaction pooler, consecutive
//! transactions may run on different server connections, so each one
//! starts with `SET LOCAL`, and nothing outlives it: no named prepared
//! statement, no LISTEN, no session-level advisory lock.

use std::str::FromStr;
use std::time::Duration;

/// How pglimit reaches Postgres (`PGLIMIT_DB_POOLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Directly: each connection is one server session.
    #[default]
    None,
    /// Through a pooler that gives a client one server connection for as
    /// long as it stays connected (PgBouncer's `pool_mode = session`).
    Session,
    /// Through a pooler that gives a client a server connection for one
    /// transaction at a time (PgBouncer's `pool_mode = transaction`).
    Transaction,
}

impl FromStr for Pooler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "session" => Ok(Self::Session),
            "transaction" => Ok(Self::Transaction),
            other => Err(format!("{other:?} is not \"none\", \"session\" or \"transaction\"")),
        }
    }
}

/// The settings, rendered once for the session or for each transaction.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// `SET ...;` statements, run once after connecting.
    session: String,
    /// `SET LOCAL ...;` statements, run first in every transaction.
    local: String,
}

impl Settings {
    /// Read committed whatever the database default (each statement must see
    /// the latest committed rows), and server-side limits so that a row lock
    /// held by some stuck transaction fails the batch instead of holding a
    /// lane for ever. Both limits end before the caller gives up: a wait for
    /// a hot row is normal under load and must not fail checks early, but a
    /// statement must be over before its caller is answered from memory, or
    /// it could commit a count for that check too.
    /// `search_path`: rendered (quoted where needed); `None` keeps the role's.
    pub fn new(longest_wait: Duration, search_path: Option<&str>) -> Self {
        let limit_ms = (longest_wait.as_millis() * 9 / 10).to_string();
        let mut settings = vec![
            // The statements take arrays whose sizes vary, so one generic
            // plan serves them all without re-planning. But it is planned
            // once, from the statistics of that moment: planned on an empty
            // table it would scan the table for ever after. No statement
            // here wants a sequential scan of the counters, so rule them out.
            ("plan_cache_mode", "force_generic_plan".to_owned()),
            ("enable_seqscan", "off".to_owned()),
            // A plan that must scan a table anyway (the heartbeat's few rows)
            // costs more than `enable_seqscan = off` can add, which would
            // start the JIT compiler on every run: tens of milliseconds of
            // CPU for a statement of a few rows (docs/performance.md).
            ("jit", "off".to_owned()),
            ("lock_timeout", limit_ms.clone()),
            ("statement_timeout", limit_ms),
        ];
        if let Some(path) = search_path {
            settings.push(("search_path", path.to_owned()));
        }
        let render =
            |set: &str| settings.iter().map(|(name, value)| format!("{set} {name} = {value};")).collect();
        let session: String = render("SET");
        let local: String = render("SET LOCAL");
        Self {
            session: format!("SET default_transaction_isolation = 'read committed'; {session}"),
            local: format!("SET LOCAL transaction_isolation = 'read committed'; {local}"),
        }
    }

    pub fn for_session(&self) -> &str {
        &self.session
    }

    pub fn for_transaction(&self) -> &str {
        &self.local
    }
}

/// `name` as an SQL identifier, whatever it holds.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_travels_both_for_the_session_and_for_each_transaction() {
        let settings = Settings::new(Duration::from_millis(1000), Some(&quote_ident("rate \"limits\"")));
        for rendered in [settings.for_session(), settings.for_transaction()] {
            for wanted in ["read committed", "statement_timeout = 900;", "lock_timeout = 900;", "jit = off;"]
            {
                assert!(rendered.contains(wanted), "{wanted} in {rendered}");
            }
            assert!(rendered.contains("search_path = \"rate \"\"limits\"\"\";"), "{rendered}");
        }
        assert!(settings
            .for_transaction()
            .split(';')
            .filter(|s| !s.trim().is_empty())
            .all(|s| s.contains("LOCAL")));
    }

    #[test]
    fn an_unknown_pooler_mode_is_refused_naming_the_modes() {
        assert_eq!(
            "statement".parse::<Pooler>(),
            Err("\"statement\" is not \"none\", \"session\" or \"transaction\"".into())
        );
        assert_eq!("transaction".parse::<Pooler>(), Ok(Pooler::Transaction));
    }
}
