//! The command line: `serve` (the default), `check-policies` and `migrate`.
//!
//! Every environment variable is also a flag of `serve`: drop `PGLIMIT_`,
//! lower-case, dashes for underscores (`PGLIMIT_DB_TIMEOUT_MS` ↔
//! `--db-timeout-ms`, `DATABASE_URL` ↔ `--database-url`); a flag wins over
//! its variable. Flags are plain strings handed to [`Config::from_lookup`]
//! by variable name, so values are parsed, checked and defaulted in one place.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{Config, ConfigError};
use crate::policy::Policies;

const DATABASE_URL: &str = "DATABASE_URL";
const DATABASE_URL_FILE: &str = "DATABASE_URL_FILE";

/// A rate-limit service that keeps one shared, exact limit in PostgreSQL.
///
/// Without a subcommand, pglimit serves. Every flag of `serve` also reads its
/// environment variable (shown in brackets); a flag wins over its variable.
#[derive(Debug, Parser)]
#[command(name = "pglimit", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve checks (the default).
    Serve(Box<ServeArgs>),
    /// Parse and validate a policy file; needs no database.
    CheckPolicies {
        /// The policy file (TOML).
        file: PathBuf,
    },
    /// Apply the migrations to DATABASE_URL and exit (for deploy pipelines).
    Migrate(MigrateArgs),
    /// Exit 0 if the service on PGLIMIT_BIND answers GET /healthz with 200,
    /// else 1 (a container's HEALTHCHECK: the image has no curl).
    Healthcheck {
        /// The service's listen address; a wildcard one is probed on loopback
        /// [default: 127.0.0.1:8080].
        #[arg(long, env = "PGLIMIT_BIND")]
        bind: Option<String>,
    },
}

/// The flags of `serve`, one per variable, in the order of `.env.example`
/// but for those shared with `migrate`. Values are read by flag id (see
/// [`Vars`]), not from these fields.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080]. Without API tokens,
    /// only a loopback address is accepted.
    #[arg(long, env = "PGLIMIT_BIND")]
    pub bind: Option<String>,
    /// Address of Envoy's rate limit service (gRPC) [default: not served].
    /// Without API tokens, only a loopback address is accepted.
    #[arg(long, env = "PGLIMIT_GRPC_BIND")]
    pub grpc_bind: Option<String>,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// HMAC key for stored keys, at least 32 bytes, the same on every instance;
    /// required with DATABASE_URL. As a flag, visible to other users in the
    /// process list (ps): prefer the variable or its file.
    #[arg(long, env = "PGLIMIT_KEY_SECRET", hide_env_values = true)]
    pub key_secret: Option<String>,
    /// A file holding the key secret (a container secret), its trailing
    /// newline dropped; not with PGLIMIT_KEY_SECRET.
    #[arg(long, env = "PGLIMIT_KEY_SECRET_FILE")]
    pub key_secret_file: Option<String>,
    /// Zero-config only: where the private cluster and its generated key
    /// secret live [default: .pglimit].
    #[arg(long, env = "PGLIMIT_DATA_DIR")]
    pub data_dir: Option<String>,
    /// Zero-config only: directory of initdb and pg_ctl [default: PATH, then
    /// the newest /usr/lib/postgresql/<version>/bin].
    #[arg(long, env = "PGLIMIT_PG_BIN")]
    pub pg_bin: Option<String>,
    /// Policy file (TOML), replacing the built-in policies [default: the
    /// built-ins, login and contact_confirmation].
    #[arg(long, env = "PGLIMIT_POLICIES")]
    pub policies: Option<String>,
    /// Comma-separated bearer tokens accepted on /check [default: none: /check
    /// open, loopback only]. As a flag, visible to other users in the
    /// process list (ps): prefer the variable or its file.
    #[arg(long, env = "PGLIMIT_API_TOKENS", hide_env_values = true)]
    pub api_tokens: Option<String>,
    /// A file holding the API tokens, separated by commas or newlines; not
    /// with PGLIMIT_API_TOKENS.
    #[arg(long, env = "PGLIMIT_API_TOKENS_FILE")]
    pub api_tokens_file: Option<String>,
    /// Comma-separated bearer tokens of the admin routes (/admin/blocks)
    /// [default: none: admin routes on a loopback bind only, open]. As a
    /// flag, visible to other users in the process list (ps): prefer the
    /// variable or its file.
    #[arg(long, env = "PGLIMIT_ADMIN_TOKENS", hide_env_values = true)]
    pub admin_tokens: Option<String>,
    /// A file holding the admin tokens, separated by commas or newlines;
    /// not with PGLIMIT_ADMIN_TOKENS.
    #[arg(long, env = "PGLIMIT_ADMIN_TOKENS_FILE")]
    pub admin_tokens_file: Option<String>,
    /// Fraction of checks that start a background delete of expired rows,
    /// 0 to 1 [default: 0.01].
    #[arg(long, env = "PGLIMIT_CLEANUP_RATE")]
    pub cleanup_rate: Option<String>,
    /// Milliseconds Postgres may make no progress before the instance falls
    /// back to memory [default: 250].
    #[arg(long, env = "PGLIMIT_DB_TIMEOUT_MS")]
    pub db_timeout_ms: Option<String>,
    /// Connections per instance for checks: PGLIMIT_DB_PIPELINE of them with
    /// calls in flight at once, the rest spares for when calls stall
    /// [default: 4].
    #[arg(long, env = "PGLIMIT_DB_POOL_SIZE")]
    pub db_pool_size: Option<String>,
    /// Calls to Postgres in flight at once, so that one commits while the
    /// next runs; at most PGLIMIT_DB_POOL_SIZE [default: 1].
    #[arg(long, env = "PGLIMIT_DB_PIPELINE")]
    pub db_pipeline: Option<String>,
    /// Most connections one instance opens to Postgres, the kept ones
    /// included: sets PGLIMIT_DB_POOL_SIZE to what remains [default: unset].
    #[arg(long, env = "PGLIMIT_DB_MAX_CONNECTIONS")]
    pub db_max_connections: Option<String>,
    /// none, session or transaction: the connection pooler DATABASE_URL
    /// goes through, and its pool mode [default: none].
    #[arg(long, env = "PGLIMIT_DB_POOLER")]
    pub db_pooler: Option<String>,
    /// The schema pglimit's tables and functions live in, created by
    /// `pglimit migrate` if missing [default: the role's search path].
    #[arg(long, env = "PGLIMIT_DB_SCHEMA")]
    pub db_schema: Option<String>,
    /// Most keys the memory fallback holds per instance, and denials
    /// remembered [default: 100000].
    #[arg(long, env = "PGLIMIT_MEMORY_CAPACITY")]
    pub memory_capacity: Option<String>,
    /// true/false: serve /metrics [default: true].
    #[arg(long, env = "PGLIMIT_METRICS")]
    pub metrics: Option<String>,
    /// Bearer token for /metrics [default: none: open on a loopback bind, else
    /// this or an API token]. As a flag, visible to other users in the
    /// process list (ps): prefer the variable or its file.
    #[arg(long, env = "PGLIMIT_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// A file holding the metrics token, its trailing newline dropped; not
    /// with PGLIMIT_METRICS_TOKEN.
    #[arg(long, env = "PGLIMIT_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<String>,
    /// true/false: every policy in shadow mode, decided and counted but never
    /// refused [default: false].
    #[arg(long, env = "PGLIMIT_SHADOW")]
    pub shadow: Option<String>,
    /// Longest a request may take before a 503, in ms [default: 30000, or
    /// 20 × PGLIMIT_DB_TIMEOUT_MS + 5000 if longer].
    #[arg(long, env = "PGLIMIT_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<String>,
    /// true/false: reload the policy file when a new version is closed or
    /// renamed into place; SIGHUP always reloads it [default: true].
    #[arg(long, env = "PGLIMIT_WATCH_POLICIES")]
    pub watch_policies: Option<String>,
    /// The slowest checks kept, with their phases, for GET
    /// /admin/slow-checks, 0 to 100000; 0 keeps none [default: 128].
    #[arg(long, env = "PGLIMIT_SLOW_CHECKS")]
    pub slow_checks: Option<String>,
    /// Threads that serve requests, 1 to 1024 [default: one per CPU]; 1 costs
    /// less CPU per check where the service shares a small machine.
    #[arg(long, env = "PGLIMIT_WORKER_THREADS")]
    pub worker_threads: Option<String>,
}

/// The flags of `migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// The flags `migrate` shares with `serve`.
#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL to keep counters in, required by migrate [serve's default: a
    /// private cluster in PGLIMIT_DATA_DIR]. As a flag, visible to other
    /// users in the process list (ps), password included: prefer the
    /// variable or its file.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// A file holding DATABASE_URL (a container secret), its trailing
    /// newline dropped; not with DATABASE_URL.
    #[arg(long, env = "DATABASE_URL_FILE")]
    pub database_url_file: Option<String>,
    /// true/false: counters in an UNLOGGED table, cheaper writes but emptied
    /// after a crash; set on a new, empty table only [default: false].
    #[arg(long, env = "PGLIMIT_UNLOGGED")]
    pub unlogged: Option<String>,
    /// auto, true or false: distribute the counters over a Citus cluster,
    /// each call on one shard; auto when the citus extension is there
    /// [default: auto].
    #[arg(long, env = "PGLIMIT_CITUS")]
    pub citus: Option<String>,
    /// text or json; levels from RUST_LOG [default: text].
    #[arg(long, env = "PGLIMIT_LOG_FORMAT")]
    pub log_format: Option<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Run {
    Serve(Vars),
    /// With DATABASE_URL or DATABASE_URL_FILE set (see [`Vars::migration`]).
    Migrate(Vars),
    CheckPolicies(PathBuf),
    /// The address to probe, as given (parsed by the caller).
    Healthcheck(String),
}

/// Parses the process's arguments and environment; on `--help`, `--version`
/// or a usage error, prints and exits (2 for an error).
pub fn parse() -> Run {
    parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

pub fn parse_from(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> Result<Run, clap::Error> {
    let matches = Cli::command().try_get_matches_from(args)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let sub = matches.subcommand().map_or(&matches, |(_, sub)| sub);
    Ok(match cli.command {
        None | Some(Command::Serve(_)) => Run::Serve(Vars::of::<ServeArgs>(sub)),
        Some(Command::CheckPolicies { file }) => Run::CheckPolicies(file),
        Some(Command::Healthcheck { bind }) => {
            Run::Healthcheck(bind.filter(|b| !b.is_empty()).unwrap_or_else(|| "127.0.0.1:8080".into()))
        }
        Some(Command::Migrate(_)) => {
            let vars = Vars::of::<MigrateArgs>(sub);
            if vars.get(DATABASE_URL).or_else(|| vars.get(DATABASE_URL_FILE)).is_none() {
                return Err(missing_database());
            }
            Run::Migrate(vars)
        }
    })
}

/// A usage error, as clap reports a missing argument (exit status 2).
fn missing_database() -> clap::Error {
    let why = "migrate needs DATABASE_URL (or --database-url) or DATABASE_URL_FILE: the database to migrate";
    MigrateArgs::augment_args(clap::Command::new("pglimit migrate"))
        .error(ErrorKind::MissingRequiredArgument, why)
}

/// Variable name → value, from a flag or else the environment; an empty
/// value is unset, as in [`Config::from_env`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(HashMap<String, String>);

impl Vars {
    /// Reads each flag of `A` that has a variable, by its id, so that every
    /// variable is named once, in its `env` attribute.
    fn of<A: Args>(matches: &ArgMatches) -> Self {
        let cmd = A::augment_args(clap::Command::new("pglimit"));
        let values = cmd.get_arguments().filter_map(|arg| {
            let var = arg.get_env()?.to_str()?;
            let value = matches.try_get_one::<String>(arg.get_id().as_str()).ok()??;
            (!value.is_empty()).then(|| (var.to_owned(), value.clone()))
        });
        Self(values.collect())
    }

    pub fn get(&self, var: &str) -> Option<String> {
        self.0.get(var).cloned()
    }

    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::from_lookup(|var| self.get(var))
    }

    /// What `migrate` needs: DATABASE_URL (or the file DATABASE_URL_FILE
    /// names), and the configuration without it, whose key secret
    /// migrating does not need.
    pub fn migration(&self) -> Result<(String, Config), ConfigError> {
        let url = crate::config::secret(&|var| self.get(var), DATABASE_URL)?
            .ok_or_else(|| ConfigError::new(DATABASE_URL, "migrate needs it, or DATABASE_URL_FILE"))?;
        let without =
            |var: &str| if [DATABASE_URL, DATABASE_URL_FILE].contains(&var) { None } else { self.get(var) };
        Ok((url, Config::from_lookup(without)?))
    }
}

/// `check-policies`: prints what the file defines, or the error start-up
/// would print (with its line and column).
pub fn check_policies(file: &Path) -> ExitCode {
    match Policies::load(file) {
        Ok(policies) => {
            let mut names: Vec<&str> = policies.names().collect();
            names.sort_unstable();
            let noun = if names.len() == 1 { "policy" } else { "policies" };
            println!("{}: {} {noun} ({}) OK", file.display(), names.len(), names.join(", "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pglimit: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    fn serve(args: &[&str]) -> Vars {
        match parse_from(args) {
            Ok(Run::Serve(vars)) => vars,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_variable_the_configuration_reads_has_a_flag() {
        let asked = RefCell::new(BTreeSet::new());
        Config::from_lookup(|var| {
            asked.borrow_mut().insert(var.to_owned());
            None
        })
        .expect("the defaults are valid");
        let serve = ServeArgs::augment_args(clap::Command::new("serve"));
        let flags: BTreeSet<String> =
            serve.get_arguments().filter_map(|a| a.get_env()?.to_str().map(String::from)).collect();
        let missing: Vec<_> = asked.borrow().difference(&flags).cloned().collect();
        assert!(missing.is_empty(), "variables without a flag: {missing:?}");
        assert!(asked.borrow().len() >= 13, "{asked:?}");
    }

    #[test]
    fn every_flag_is_its_variable_renamed() {
        for cmd in [Cli::command(), ServeArgs::augment_args(clap::Command::new("serve"))] {
            for arg in cmd.get_arguments().filter(|a| a.get_env().is_some()) {
                let var = arg.get_env().and_then(|v| v.to_str()).expect("a variable name");
                let flag = var.trim_start_matches("PGLIMIT_").to_lowercase().replace('_', "-");
                assert_eq!(arg.get_long(), Some(flag.as_str()), "{var}");
            }
        }
    }

    #[test]
    fn a_flag_is_read_under_its_variables_name_with_or_without_serve() {
        for args in [&["serve"][..], &[]] {
            // DATABASE_URL emptied: the test runner's own would ask for a key secret.
            let rest = ["--db-timeout-ms", "99", "--database-url", ""];
            let args: Vec<&str> = ["pglimit"].iter().chain(args).chain(&rest).copied().collect();
            let vars = serve(&args);
            assert_eq!(vars.get("PGLIMIT_DB_TIMEOUT_MS").as_deref(), Some("99"));
            let config = vars.config().expect("valid");
            assert_eq!(config.db_timeout, std::time::Duration::from_millis(99));
        }
    }

    #[test]
    fn an_empty_flag_counts_as_unset() {
        let vars = serve(&["pglimit", "serve", "--bind", ""]);
        assert_eq!(vars.get("PGLIMIT_BIND"), None);
    }

    #[test]
    fn migrate_reads_its_database_and_settings_without_a_key_secret() {
        let args = ["pglimit", "migrate", "--database-url", "postgres://db/x", "--unlogged", "true"];
        let Ok(Run::Migrate(vars)) = parse_from(args) else { panic!("not migrate") };
        assert!(vars.config().is_err(), "serving would need a key secret");
        let (url, config) = vars.migration().expect("valid");
        assert_eq!((url.as_str(), config.unlogged), ("postgres://db/x", true));
    }

    #[test]
    fn flags_of_serve_are_refused_after_another_subcommand() {
        let err = parse_from(["pglimit", "migrate", "--bind", "x"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
    }
}
