//! The command line: `serve` (the default), `check-policies`, `migrate`
//! and `healthcheck`.
//!
//! Every environment variable is also a flag of `serve`: drop `PGLIMIT_`,
//! lower-case, dashes for underscores (`PGLIMIT_DB_TIMEOUT_MS` ↔
//! `--db-timeout-ms`, `DATABASE_URL` ↔ `--database-url`); a flag wins over
//! its variable. The flags are built from the variables' declarations
//! (`cli/flags.rs`) and read as plain strings, handed to
//! [`Config::from_lookup`](crate::config::Config::from_lookup) by variable
//! name, so values are parsed, checked and defaulted in one place.

mod flags;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};

use crate::config::variables::{BIND, DATABASE_URL, DATABASE_URL_FILE};
use crate::policy::Policies;
pub use flags::{MigrateArgs, ServeArgs, Vars};

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
    Serve(ServeArgs),
    /// Parse and validate a policy file; needs no database.
    CheckPolicies {
        /// The policy file (TOML).
        file: PathBuf,
    },
    /// Apply the migrations to DATABASE_URL and exit (for deploy pipelines).
    Migrate(MigrateArgs),
    /// Policies in the database, for pglimit's SQL functions (docs/sql.md).
    Policies {
        #[command(subcommand)]
        command: PoliciesCommand,
    },
    /// Exit 0 if the service on PGLIMIT_BIND answers GET /healthz with 200,
    /// else 1 (a container's HEALTHCHECK: the image has no curl).
    Healthcheck {
        #[arg(long, env = BIND.var, help = probe_help())]
        bind: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PoliciesCommand {
    /// Write FILE's policies and PGLIMIT_KEY_SECRET to DATABASE_URL (migrating
    /// it first), so that pglimit.check decides by them with no service
    /// running; `serve` writes its own at start-up and on every reload.
    Push {
        /// The policy file (TOML).
        file: PathBuf,
        #[command(flatten)]
        serve: ServeArgs,
    },
}

/// The help of `healthcheck --bind`, with `PGLIMIT_BIND`'s default.
fn probe_help() -> String {
    let default = BIND.unset.shown();
    format!("The service's listen address; a wildcard one is probed on loopback [default: {default}]")
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Run {
    Serve(Vars),
    /// With DATABASE_URL or DATABASE_URL_FILE set (see [`Vars::migration`]).
    Migrate(Vars),
    CheckPolicies(PathBuf),
    /// `policies push FILE`, with DATABASE_URL and PGLIMIT_KEY_SECRET read by [`Vars::config`].
    PushPolicies(PathBuf, Vars),
    /// The address to probe, as given (parsed by the caller); `None`: unset.
    Healthcheck(Option<String>),
}

/// Parses the process's arguments and environment; on `--help`, `--version`
/// or a usage error, prints and exits (2 for an error).
pub fn parse() -> Run {
    parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

pub fn parse_from(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> Result<Run, clap::Error> {
    let cli = Cli::try_parse_from(args)?;
    Ok(match cli.command {
        None => Run::Serve(cli.serve.0),
        Some(Command::Serve(ServeArgs(vars))) => Run::Serve(vars),
        Some(Command::CheckPolicies { file }) => Run::CheckPolicies(file),
        Some(Command::Policies { command: PoliciesCommand::Push { file, serve: ServeArgs(vars) } }) => {
            Run::PushPolicies(file, vars)
        }
        Some(Command::Healthcheck { bind }) => Run::Healthcheck(bind.filter(|b| !b.is_empty())),
        Some(Command::Migrate(MigrateArgs(vars))) => {
            if vars.get(DATABASE_URL.var).or_else(|| vars.get(DATABASE_URL_FILE.var)).is_none() {
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
    use crate::config::Config;
    use clap::CommandFactory;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    fn serve(args: &[&str]) -> Vars {
        match parse_from(args) {
            Ok(Run::Serve(vars)) => vars,
            other => panic!("not serve: {other:?}"),
        }
    }

    /// The variables the flags of `A` read.
    fn variables_of<A: Args>() -> BTreeSet<String> {
        let cmd = A::augment_args(clap::Command::new("pglimit"));
        cmd.get_arguments().filter_map(|a| a.get_env()?.to_str().map(String::from)).collect()
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_has_a_flag_for_every_variable_the_configuration_reads_and_no_other() {
        let asked = RefCell::new(BTreeSet::new());
        Config::from_lookup(|var| {
            asked.borrow_mut().insert(var.to_owned());
            None
        })
        .expect("the defaults are valid");
        assert_eq!(asked.into_inner(), variables_of::<ServeArgs>());
        assert!(variables_of::<MigrateArgs>().is_subset(&variables_of::<ServeArgs>()));
    }

    #[test]
    fn every_flag_is_its_variable_renamed() {
        let serve = ServeArgs::augment_args(clap::Command::new("serve"));
        let migrate = MigrateArgs::augment_args(clap::Command::new("migrate"));
        for cmd in [Cli::command(), serve, migrate] {
            for arg in cmd.get_arguments().filter(|a| a.get_env().is_some()) {
                let var = arg.get_env().and_then(|v| v.to_str()).expect("a variable name");
                let flag = var.trim_start_matches("PGLIMIT_").to_lowercase().replace('_', "-");
                assert_eq!(arg.get_long(), Some(flag.as_str()), "{var}");
            }
        }
    }

    #[test]
    fn a_flags_help_gives_the_accepted_values_and_the_default_of_its_variable() {
        let mut serve = ServeArgs::augment_args(clap::Command::new("serve"));
        let help = serve.render_long_help().to_string();
        let flag = help.split("--db-timeout-ms").nth(1).and_then(|h| h.split("\n      -").next());
        let flag = flag.unwrap_or_else(|| panic!("no --db-timeout-ms in:\n{help}"));
        assert!(flag.contains("[milliseconds from 10 to 60000] [default: 250]"), "{flag}");
        assert!(help.contains("[auto, true or false] [default: auto]"), "{help}");
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
    fn the_vars_debug_output_names_the_variables_set_never_their_values() {
        let vars = serve(&["pglimit", "--database-url", "postgres://u:hunter2@db/x", "--shadow", "true"]);
        let shown = format!("{vars:?}");
        assert!(shown.contains("DATABASE_URL") && shown.contains("PGLIMIT_SHADOW"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
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
