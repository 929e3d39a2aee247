//! Connections to PostgreSQL: how they are opened and configured, and
//! what their errors mean for the instance. What start-up does to the
//! database first (migrations, persistence, Citus) is in `prepare.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor, Postgres, Transaction};

use super::layout::Layout;
use super::node::Node;
use super::pooler::{quote_ident, Pooler, Settings};
use super::tls::{self, Target};
use super::zones::ServerZones;
use crate::storage::StoreError;

#[path = "prepare.rs"]
mod prepare;
pub use prepare::migrate;

/// Everything needed to open a configured connection, shared by the lanes,
/// the cleanup and the probes.
pub(super) struct Session {
    connect: Target,
    /// How long a call may wait on the server before its connection is dropped.
    hard_limit: Duration,
    /// Bumped when Postgres comes back, so lanes drop connections from before.
    generation: AtomicU64,
    /// Set by [`Session::prepare`]; a single node until then.
    layout: OnceLock<Layout>,
    pooler: Pooler,
    longest_wait: Duration,
    /// How soon a caller may stop waiting and answer without Postgres.
    patience: Duration,
    /// The settings until [`Session::prepare`] knows where this build's functions are.
    first_settings: Settings,
    /// The settings from then on: the search path starts with the functions' schema.
    settings: OnceLock<Settings>,
    /// `PGLIMIT_DB_SCHEMA`: where pglimit's objects are; `None`: the role's search path.
    schema: Option<String>,
    /// The zones the server knows, read by [`Session::prepare`] and on reconnect.
    zones: ServerZones,
}

/// How to reach Postgres, besides the URL.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    pub pooler: Pooler,
    pub schema: Option<String>,
}

impl Session {
    /// `longest_wait` is the longest any caller waits for an answer; every
    /// server-side limit ends before it.
    pub fn new(url: &str, longest_wait: Duration, reach: Reach) -> Result<Self, sqlx::Error> {
        let connect = tls::connect_options(url)?;
        // A lane never abandons a call its caller still awaits; the floor
        // leaves room for a handshake under a short timeout.
        let hard_limit = longest_wait.max(Duration::from_secs(2));
        let (generation, layout) = (AtomicU64::new(0), OnceLock::new());
        let path = reach.schema.as_deref().map(quote_ident);
        let first_settings = Settings::new(longest_wait, path.as_deref());
        let (pooler, schema, settings) = (reach.pooler, reach.schema, OnceLock::new());
        Ok(Self {
            connect,
            hard_limit,
            generation,
            layout,
            pooler,
            longest_wait,
            patience: longest_wait,
            first_settings,
            settings,
            schema,
            zones: ServerZones::default(),
        })
    }

    /// The time zones the server last prepared or probed knows.
    pub fn zones(&self) -> &ServerZones {
        &self.zones
    }

    fn settings(&self) -> &Settings {
        self.settings.get().unwrap_or(&self.first_settings)
    }

    /// Whether a statement may stay prepared on its connection: not behind
    /// a transaction pooler, where the next transaction may run on another
    /// server connection.
    pub fn keeps_statements(&self) -> bool {
        self.pooler != Pooler::Transaction
    }

    /// Behind a transaction pooler, the `SET LOCAL` statements each
    /// transaction starts with; `None` when the connection keeps them.
    pub fn per_transaction(&self) -> Option<&str> {
        (self.pooler == Pooler::Transaction).then(|| self.settings().for_transaction())
    }

    /// A transaction on `conn`, under the settings.
    pub async fn begin<'c>(
        &self,
        conn: &'c mut PgConnection,
    ) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
        match self.per_transaction() {
            Some(settings) => conn.begin_with(format!("BEGIN; {settings}")).await,
            None => conn.begin().await,
        }
    }

    /// How the URL asks connections to be opened, for connections managed
    /// elsewhere (the listener's, which decides `prefer` for each itself).
    pub fn url_options(&self) -> &PgConnectOptions {
        self.connect.options()
    }

    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    pub fn patience(&self) -> Duration {
        self.patience
    }

    pub fn hard_limit(&self) -> Duration {
        self.hard_limit
    }

    pub async fn open(&self) -> Result<PgConnection, sqlx::Error> {
        self.open_on(None).await
    }

    /// A configured connection to `node` (a Citus worker, with the
    /// coordinator's credentials and TLS settings), or to the URL's server.
    pub async fn open_on(&self, node: Option<&Node>) -> Result<PgConnection, sqlx::Error> {
        let open = async {
            let mut conn = self.connect(node).await?;
            if self.pooler != Pooler::Transaction {
                conn.execute(self.settings().for_session()).await?;
            }
            self.layout().configure(&mut conn, node.is_some()).await?;
            Ok(conn)
        };
        match tokio::time::timeout(self.hard_limit, open).await {
            Ok(conn) => conn,
            Err(_) => Err(timed_out("connecting")),
        }
    }

    /// A connection to `node`, or to the URL's server, as `sslmode` asks
    /// ([`tls::open_preferring`]).
    async fn connect(&self, node: Option<&Node>) -> Result<PgConnection, sqlx::Error> {
        let options = match node {
            None => self.connect.options().clone(),
            Some(node) => self.connect.options().clone().host(&node.host).port(node.port),
        };
        let open = |options: PgConnectOptions| async move { PgConnection::connect_with(&options).await };
        Ok(tls::open_preferring(&options, open).await?.0)
    }

    /// Which connections are current: a lane holding an older one reconnects.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Marks every open connection as from before an outage.
    pub fn renew(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Where the rows are: on a single node until [`Session::prepare`] knows.
    pub fn layout(&self) -> &Layout {
        static SINGLE: Layout = Layout::Single;
        self.layout.get().unwrap_or(&SINGLE)
    }
}

/// What a probe asks: the server answers and takes writes. A standby
/// answers `SELECT 1` but cannot count a check, so it is gone for pglimit.
pub(super) async fn ping_writable(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let writable = "SELECT NOT (pg_is_in_recovery() OR current_setting('transaction_read_only')::bool)";
    // One simple-protocol message: no statement is prepared, so it serves behind any pooler.
    let row = conn.fetch_one(writable).await?;
    let writable: bool = sqlx::Row::try_get(&row, 0)?;
    if writable {
        return Ok(());
    }
    let read_only = "the server is read-only (a standby, or a primary being demoted)";
    Err(sqlx::Error::Io(std::io::Error::other(read_only)))
}

pub(super) fn timed_out(what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("postgres timed out {what}")))
}

/// Connection-level failures mean Postgres is away for everyone; anything
/// else (an error the server answered with, a row we could not decode)
/// concerns this batch only and must not switch the whole instance to memory.
pub(super) fn classify(e: sqlx::Error) -> StoreError {
    let server_going_away = |code: &str| {
        // 08: connection exception, 53: insufficient resources,
        // 57P: shutdown, crash, starting up (not 57014, a statement timeout),
        // 25006: read-only (a standby, or a primary being demoted: where a
        // DNS name points during a failover).
        ["08", "53", "57P", "25006"].iter().any(|class| code.starts_with(class))
    };
    let unreachable = match &e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| server_going_away(&c)),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            true
        }
        sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    if unreachable {
        StoreError::Unreachable(e.to_string())
    } else {
        StoreError::Failed(e.to_string())
    }
}
