//! Configuration, read once from the environment into a typed struct.
//!
//! Every variable is declared once, in [`variables`], with its flag,
//! default, accepted values and help; `.env.example` is checked against
//! them. Every error names the variable at fault. A secret may instead be
//! read from the file its `_FILE` variable names ([`secret`]), as container
//! platforms mount them.

mod database;
#[cfg(test)]
mod documented;
mod postgres;
mod secret;
pub mod setting;
mod tokens;
pub mod variables;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::storage::{Citus, CitusChecks, Reach};
use database::database;
pub use database::Database;
pub use secret::secret;
pub use tokens::{fingerprint, is_token_name, AdminToken, MAX_TOKEN_NAME};
use variables as v;

#[derive(Clone)]
pub struct Config {
    pub bind: SocketAddr,
    /// Where Envoy's rate limit service (gRPC) listens; `None`: not served.
    pub grpc_bind: Option<SocketAddr>,
    pub database: Database,
    pub policies: Option<PathBuf>,
    pub api_tokens: Vec<String>,
    /// Bearer tokens of the admin routes (blocks), each with who it stands for.
    pub admin_tokens: Vec<AdminToken>,
    pub cleanup_rate: f64,
    pub db_timeout: Duration,
    /// Connections for checks per instance.
    pub db_pool_size: u32,
    /// Through which pooler, and into which schema (`PGLIMIT_DB_POOLER`, `PGLIMIT_DB_SCHEMA`).
    pub db_reach: Reach,
    /// Calls in flight at once on the lane, the other connections spares.
    pub db_pipeline: u32,
    pub memory_capacity: usize,
    /// Keep counters in an UNLOGGED table: faster writes, lost on a crash.
    pub unlogged: bool,
    /// Whether the database is a Citus cluster to distribute the counters over.
    pub citus: Citus,
    /// `PGLIMIT_CITUS_CHECKS`: in Citus mode, whether checks go straight to the workers.
    pub citus_checks: CitusChecks,
    pub log_format: LogFormat,
    /// Serve `GET /metrics` (and record metrics at all).
    pub metrics: bool,
    /// Bearer token for `/metrics`, beside the API tokens.
    pub metrics_token: Option<String>,
    /// Every policy in shadow mode: decided and counted, never refused.
    pub shadow: bool,
    /// Reload the policy file when it changes on disk (SIGHUP always does).
    pub watch_policies: bool,
    /// Longest a request may take before it is answered 503.
    pub request_timeout: Duration,
    /// The slowest checks kept for `GET /admin/slow-checks`; 0: none.
    pub slow_checks: usize,
    /// Most checks held by `max_wait` at once.
    pub max_waiting: usize,
    /// The runtime's worker threads; `None`: one per CPU.
    pub worker_threads: Option<usize>,
    /// Serve the support console at `/console` (`PGLIMIT_CONSOLE=on`).
    pub console: bool,
    /// Write the key secret for the SQL interface (`PGLIMIT_SQL=on`).
    pub sql: bool,
    /// How long the audit log keeps a row.
    pub audit_retention: Duration,
    /// Every variable set, secrets by their fingerprints, and a digest of
    /// them: what the audit log's start-up row records.
    pub shown: BTreeMap<String, String>,
    pub digest: String,
    /// Count denials for the top list (`PGLIMIT_TOP`).
    pub top: bool,
    /// How long the top list keeps a minute (`PGLIMIT_TOP_RETENTION`).
    pub top_retention: Duration,
}

/// Redacts the database URL (it may hold a password) and the API tokens.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("bind", &self.bind)
            .field("database", &self.database)
            .field("policies", &self.policies)
            .field("api_tokens", &self.api_tokens.len())
            .field("admin_tokens", &self.admin_tokens.len())
            .field("db_timeout", &self.db_timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct ConfigError {
    pub var: Cow<'static, str>,
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(var: impl Into<Cow<'static, str>>, reason: impl Into<String>) -> Self {
        Self { var: var.into(), reason: reason.into() }
    }
}

impl Config {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// Reads the configuration through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let (db_reach, db_pool_size) = postgres::reach(&get)?;
        let shown = tokens::shown_settings(&get);
        let config = Self {
            bind: v::BIND.read(&get)?,
            grpc_bind: v::GRPC_BIND.given(&get)?,
            database: database(&get)?,
            policies: v::POLICIES.given(&get)?.map(PathBuf::from),
            api_tokens: tokens(v::API_TOKENS.secret(&get)?),
            admin_tokens: admin_tokens(&get)?,
            cleanup_rate: v::CLEANUP_RATE.read(&get)?,
            db_timeout: Duration::from_millis(v::DB_TIMEOUT_MS.read(&get)?),
            db_pool_size,
            db_reach,
            db_pipeline: v::DB_PIPELINE.read(&get)?,
            memory_capacity: v::MEMORY_CAPACITY.read(&get)?,
            unlogged: v::UNLOGGED.read(&get)?,
            citus: v::CITUS.read(&get)?,
            citus_checks: v::CITUS_CHECKS.read(&get)?,
            log_format: v::LOG_FORMAT.read(&get)?,
            metrics: v::METRICS.read(&get)?,
            metrics_token: v::METRICS_TOKEN
                .secret(&get)?
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty()),
            shadow: v::SHADOW.read(&get)?,
            watch_policies: v::WATCH_POLICIES.read(&get)?,
            slow_checks: v::SLOW_CHECKS.read(&get)?,
            max_waiting: v::MAX_WAITING.read(&get)?,
            worker_threads: v::WORKER_THREADS.given(&get)?,
            console: v::CONSOLE.read(&get)?,
            sql: v::SQL.read(&get)?,
            audit_retention: v::AUDIT_RETENTION.read(&get)?,
            top: v::TOP.read(&get)?,
            top_retention: v::TOP_RETENTION.read(&get)?,
            request_timeout: Duration::ZERO,
            digest: tokens::settings_digest(&shown),
            shown,
        };
        console_needs_admin_tokens(&config)?;
        Ok(Self { request_timeout: request_timeout(&get, config.db_timeout)?, ..config })
    }
}

/// The request timeout must outlast the longest wait on Postgres, or a
/// check could be cut off while its count is being written.
fn request_timeout(
    get: &impl Fn(&str) -> Option<String>,
    db_timeout: Duration,
) -> Result<Duration, ConfigError> {
    let floor = crate::storage::longest_wait(db_timeout) + Duration::from_secs(5);
    let Some(ms) = v::REQUEST_TIMEOUT_MS.given(get)? else {
        return Ok(floor.max(Duration::from_secs(30)));
    };
    let timeout = Duration::from_millis(ms);
    if timeout < floor {
        let reason = format!(
            "{ms} ms is shorter than the longest wait on Postgres plus 5 s ({} ms: 20 × PGLIMIT_DB_TIMEOUT_MS + 5000)",
            floor.as_millis()
        );
        return Err(ConfigError::new(v::REQUEST_TIMEOUT_MS.var, reason));
    }
    Ok(timeout)
}

/// The console's page holds no data, and every call it makes takes an
/// admin token: without one it would be a page that can do nothing, or,
/// were the admin routes open on loopback, a way in for any local page.
fn console_needs_admin_tokens(config: &Config) -> Result<(), ConfigError> {
    if config.console && config.admin_tokens.is_empty() {
        let reason = "is on but PGLIMIT_ADMIN_TOKENS is not set: the console's calls take an admin token \
                      (set PGLIMIT_ADMIN_TOKENS or PGLIMIT_ADMIN_TOKENS_FILE, or PGLIMIT_CONSOLE=off)";
        return Err(ConfigError::new(v::CONSOLE.var, reason));
    }
    Ok(())
}

/// The admin tokens, each `name:secret` or a bare secret; an error names
/// the variable they were read from.
fn admin_tokens(get: &impl Fn(&str) -> Option<String>) -> Result<Vec<AdminToken>, ConfigError> {
    let entries = tokens(v::ADMIN_TOKENS.secret(get)?);
    let var =
        if get(v::ADMIN_TOKENS_FILE.var).is_some() { v::ADMIN_TOKENS_FILE.var } else { v::ADMIN_TOKENS.var };
    tokens::admin_tokens(var, entries)
}

/// Comma-separated; a newline separates too, so that a file of tokens may
/// hold one a line.
fn tokens(raw: Option<String>) -> Vec<String> {
    raw.map(|s| s.split([',', '\n']).map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::MIN_SECRET_LEN;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_gives_the_documented_defaults() {
        let c = config(&[]).expect("defaults are valid");
        assert_eq!(c.bind.to_string(), "127.0.0.1:8080");
        assert_eq!(c.db_timeout, Duration::from_millis(250));
        assert_eq!(c.cleanup_rate, 0.01);
        assert!(matches!(c.database, Database::Private { secret: None, .. }) && c.api_tokens.is_empty());
        assert_eq!(c.grpc_bind, None, "the gRPC service is off unless asked for");
        assert_eq!(c.slow_checks, 128);
        assert!(c.top, "the top list is on");
        assert_eq!(c.top_retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(c.worker_threads, None, "one worker thread per CPU");
        assert_eq!(c.audit_retention, Duration::from_secs(90 * 86_400));
        assert_eq!(config(&[("PGLIMIT_WORKER_THREADS", "1")]).expect("valid").worker_threads, Some(1));
    }

    #[test]
    fn a_database_url_without_a_secret_is_refused_naming_the_variable() {
        let err = config(&[("DATABASE_URL", "postgres://x")]).unwrap_err();
        assert_eq!(err.var, "PGLIMIT_KEY_SECRET");
        let err = config(&[("DATABASE_URL", "postgres://x"), ("PGLIMIT_KEY_SECRET", "short")]).unwrap_err();
        assert!(err.to_string().starts_with("PGLIMIT_KEY_SECRET: is 5 bytes"), "{err}");
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (var, value) in [
            ("PGLIMIT_BIND", "nope"),
            ("PGLIMIT_GRPC_BIND", "8081"),
            ("PGLIMIT_CLEANUP_RATE", "2"),
            ("PGLIMIT_DB_TIMEOUT_MS", "x"),
            ("PGLIMIT_LOG_FORMAT", "xml"),
            ("PGLIMIT_METRICS", "yes"),
            ("PGLIMIT_REQUEST_TIMEOUT_MS", "1000"),
            ("PGLIMIT_SLOW_CHECKS", "100001"),
            ("PGLIMIT_WORKER_THREADS", "0"),
            ("PGLIMIT_CONSOLE", "true"),
            ("PGLIMIT_AUDIT_RETENTION", "90"),
            ("PGLIMIT_AUDIT_RETENTION", "1m"),
            ("PGLIMIT_ADMIN_TOKENS", "a b:secret"),
            ("PGLIMIT_TOP", "true"),
            ("PGLIMIT_TOP_RETENTION", "30s"),
            ("PGLIMIT_TOP_RETENTION", "7 days"),
        ] {
            let err = config(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var);
        }
    }

    #[test]
    fn the_console_is_off_unless_asked_for_and_then_needs_admin_tokens() {
        assert!(!config(&[]).expect("valid").console);
        let err = config(&[("PGLIMIT_CONSOLE", "on")]).unwrap_err().to_string();
        assert!(err.starts_with("PGLIMIT_CONSOLE: is on but PGLIMIT_ADMIN_TOKENS is not set"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
        let on = config(&[("PGLIMIT_CONSOLE", "on"), ("PGLIMIT_ADMIN_TOKENS", "alice:s3cret")]);
        assert!(on.expect("valid").console);
    }

    #[test]
    fn the_request_timeout_outlasts_the_longest_wait_on_postgres() {
        let c = config(&[("PGLIMIT_DB_TIMEOUT_MS", "2000")]).expect("valid");
        assert_eq!(c.request_timeout, Duration::from_secs(45));
        assert_eq!(config(&[]).expect("valid").request_timeout, Duration::from_secs(30));
    }

    #[test]
    fn api_tokens_are_a_comma_separated_list() {
        let c = config(&[("PGLIMIT_API_TOKENS", "a, b,,c ")]).expect("valid");
        assert_eq!(c.api_tokens, ["a", "b", "c"]);
    }

    #[test]
    fn every_secret_setting_can_be_read_from_the_file_its_file_variable_names() {
        use secret::tests::SecretFile;
        let url = SecretFile::new("url", b"postgres://u:hunter2@db/app\n");
        let key = SecretFile::new("key", &[b'k'; MIN_SECRET_LEN]);
        let [api, admin, metrics] = ["api", "admin", "metrics"]
            .map(|name| SecretFile::new(name, format!("{name}-1\n{name}-2\n").as_bytes()));
        let c = config(&[
            ("DATABASE_URL_FILE", &url.path()),
            ("PGLIMIT_KEY_SECRET_FILE", &key.path()),
            ("PGLIMIT_API_TOKENS_FILE", &api.path()),
            ("PGLIMIT_ADMIN_TOKENS_FILE", &admin.path()),
            ("PGLIMIT_METRICS_TOKEN_FILE", &metrics.path()),
        ])
        .expect("valid");
        assert!(matches!(&c.database, Database::Shared { url, .. } if url == "postgres://u:hunter2@db/app"));
        assert_eq!(c.api_tokens, ["api-1", "api-2"], "a newline separates tokens");
        let secrets: Vec<&str> = c.admin_tokens.iter().map(|t| t.secret.as_str()).collect();
        assert_eq!(secrets, ["admin-1", "admin-2"]);
        assert_eq!(c.metrics_token.as_deref(), Some("metrics-1\nmetrics-2"), "one token, as given");
        let named = SecretFile::new("named", b"alice:admin-1\nbad name:admin-2\n");
        let err = config(&[("PGLIMIT_ADMIN_TOKENS_FILE", &named.path())]).unwrap_err();
        assert_eq!(err.var, "PGLIMIT_ADMIN_TOKENS_FILE", "the variable the tokens came from");
        assert!(!err.to_string().contains("admin-2"), "{err}");
        let short = SecretFile::new("short-key", b"short");
        let err = config(&[("DATABASE_URL", "postgres://x"), ("PGLIMIT_KEY_SECRET_FILE", &short.path())]);
        assert!(err.unwrap_err().to_string().starts_with("PGLIMIT_KEY_SECRET: is 5 bytes"));
    }
}
