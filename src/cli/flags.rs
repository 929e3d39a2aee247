//! The flags of `serve` and `migrate`, one per variable of
//! [`variables`], built from its declaration: the flag's name, its help
//! with the accepted values and the default, and its variable.

use std::collections::BTreeMap;
use std::fmt;

use clap::error::ErrorKind;
use clap::{Arg, ArgMatches, Args, FromArgMatches};

use crate::config::setting::{Check, Setting, Variable};
use crate::config::variables::{self, DATABASE_URL, DATABASE_URL_FILE};
use crate::config::{Config, ConfigError};

/// The flags of `serve`: every variable.
#[derive(Debug)]
pub struct ServeArgs(pub Vars);

/// The flags of `migrate`.
#[derive(Debug)]
pub struct MigrateArgs(pub Vars);

/// Implements clap's traits for a struct of [`Vars`] with one flag for each
/// of `$variables`.
macro_rules! flags_of {
    ($args:ident, $variables:expr) => {
        impl Args for $args {
            fn augment_args(cmd: clap::Command) -> clap::Command {
                cmd.args($variables.iter().map(|v| arg(v.erased())))
            }

            fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
                Self::augment_args(cmd)
            }
        }

        impl FromArgMatches for $args {
            fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
                Vars::of($variables, matches).map(Self)
            }

            fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
                *self = Self::from_arg_matches(matches)?;
                Ok(())
            }
        }
    };
}

flags_of!(ServeArgs, variables::ALL);
flags_of!(MigrateArgs, variables::MIGRATE);

/// The flag's id, also its value's name in `--help`: the variable without
/// `PGLIMIT_`.
fn id(setting: &Setting<&dyn Check>) -> &'static str {
    setting.var.strip_prefix("PGLIMIT_").unwrap_or(setting.var)
}

fn arg(setting: Setting<&dyn Check>) -> Arg {
    Arg::new(id(&setting))
        .long(setting.flag)
        .env(setting.var)
        .hide_env_values(setting.secret)
        .help(help(&setting))
}

/// The declared help, then the accepted values and the default.
fn help(setting: &Setting<&dyn Check>) -> String {
    let mut help = setting.help.to_owned();
    if setting.secret {
        help +=
            " As a flag, visible to other users in the process list (ps): prefer the variable or its file.";
    }
    if let Some(accepted) = setting.values.accepted() {
        help += &format!(" [{accepted}]");
    }
    help + &format!(" [default: {}]", setting.unset.shown())
}

/// Variable name → value, from a flag or else the environment; an empty
/// value is unset, as in [`Config::from_env`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Vars(BTreeMap<&'static str, String>);

/// Names only: values may be secrets.
impl fmt::Debug for Vars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Vars {
    fn of(variables: &[&dyn Variable], matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut vars = BTreeMap::new();
        for setting in variables.iter().map(|v| v.erased()) {
            let value = matches.try_get_one::<String>(id(&setting));
            match value.map_err(|e| clap::Error::raw(ErrorKind::InvalidValue, e))? {
                Some(value) if !value.is_empty() => vars.insert(setting.var, value.clone()),
                _ => None,
            };
        }
        Ok(Self(vars))
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
        let url = DATABASE_URL
            .secret(&|var| self.get(var))?
            .ok_or_else(|| ConfigError::new(DATABASE_URL.var, "migrate needs it, or DATABASE_URL_FILE"))?;
        let without = |var: &str| {
            if [DATABASE_URL.var, DATABASE_URL_FILE.var].contains(&var) {
                None
            } else {
                self.get(var)
            }
        };
        Ok((url, Config::from_lookup(without)?))
    }
}
