//! What one configuration variable is: its name, its flag, the values it
//! takes, what unset means, its help and whether it is a secret. The
//! variables themselves are declared in [`super::variables`]; the command
//! line, [`Config`](super::Config) and the documentation tests all read
//! them from there, so a default or a range is written once.

use std::fmt::Display;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use super::ConfigError;

/// One variable: `var` in the environment, `--flag` on the command line,
/// taking the values `V` describes.
#[derive(Debug, Clone, Copy)]
pub struct Setting<V> {
    pub var: &'static str,
    /// `var` without `PGLIMIT_`, lower-case, dashes for underscores.
    pub flag: &'static str,
    pub values: V,
    pub unset: Unset,
    /// A sentence or two for `--help`, to which the accepted values and the
    /// default are added.
    pub help: &'static str,
    /// Hidden in `--help` and warned of as a flag (ps shows it); read with
    /// [`Setting::secret`], which also reads the file `{var}_FILE` names.
    pub secret: bool,
}

/// What an unset (or empty) variable stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unset {
    /// This value, as it would be written.
    Is(&'static str),
    /// Something no value says ("one per CPU"); the reader of the
    /// configuration decides it.
    Means(&'static str),
}

impl Unset {
    /// As `--help` and the documentation show it.
    pub fn shown(self) -> &'static str {
        match self {
            Self::Is(value) | Self::Means(value) => value,
        }
    }
}

/// The values a variable takes, and the typed value each stands for.
pub trait Values: Sync {
    type Value;

    /// The value `raw` stands for, or why it is refused (without the
    /// variable's name, which [`Setting::parse`] adds).
    fn parse(&self, raw: &str) -> Result<Self::Value, String>;

    /// The accepted values in words, for `--help`; `None`: what `help` says.
    fn accepted(&self) -> Option<String>;
}

impl<V: Values> Setting<V> {
    /// The value set, or else the default; an error names the variable.
    pub fn read(&self, get: &impl Fn(&str) -> Option<String>) -> Result<V::Value, ConfigError> {
        self.value_of(get(self.var))
    }

    /// The value `given`, or else the default. A variable whose unset
    /// [`Unset::Means`] something has no value to fall back on: read it
    /// with [`Setting::given`] (here it is parsed from nothing, which the
    /// test of the defaults in `config.rs` would catch).
    pub fn value_of(&self, given: Option<String>) -> Result<V::Value, ConfigError> {
        match (given, self.unset) {
            (Some(raw), _) => self.parse(&raw),
            (None, Unset::Is(default)) => self.parse(default),
            (None, Unset::Means(_)) => self.parse(""),
        }
    }

    /// The value set, if any: for a variable whose default depends on
    /// others ([`Unset::Means`]).
    pub fn given(&self, get: &impl Fn(&str) -> Option<String>) -> Result<Option<V::Value>, ConfigError> {
        get(self.var).map(|raw| self.parse(&raw)).transpose()
    }

    /// `raw` as this variable's value; an error names the variable.
    pub fn parse(&self, raw: &str) -> Result<V::Value, ConfigError> {
        self.values.parse(raw).map_err(|reason| ConfigError::new(self.var, reason))
    }
}

impl Setting<Text> {
    /// The variable, or else the contents of the file `{var}_FILE` names.
    pub fn secret(&self, get: &impl Fn(&str) -> Option<String>) -> Result<Option<String>, ConfigError> {
        super::secret(get, self.var)
    }
}

/// Any text: a path, a URL, tokens.
#[derive(Debug, Clone, Copy)]
pub struct Text;

impl Values for Text {
    type Value = String;

    fn parse(&self, raw: &str) -> Result<String, String> {
        Ok(raw.to_owned())
    }

    fn accepted(&self) -> Option<String> {
        None
    }
}

/// A socket address; `example` shows one in the error.
#[derive(Debug, Clone, Copy)]
pub struct Address {
    pub example: &'static str,
}

impl Values for Address {
    type Value = SocketAddr;

    fn parse(&self, raw: &str) -> Result<SocketAddr, String> {
        raw.trim().parse().map_err(|_| format!("{raw:?} is not an address like {}", self.example))
    }

    fn accepted(&self) -> Option<String> {
        None
    }
}

/// A number from `min` to `max`, of what `noun` says ("milliseconds").
#[derive(Debug, Clone, Copy)]
pub struct Range<T> {
    pub noun: &'static str,
    pub min: T,
    pub max: T,
}

impl<T: FromStr + PartialOrd + Display + Sync> Range<T> {
    fn what(&self) -> String {
        format!("{} from {} to {}", self.noun, self.min, self.max)
    }
}

impl<T: FromStr + PartialOrd + Display + Sync> Values for Range<T> {
    type Value = T;

    fn parse(&self, raw: &str) -> Result<T, String> {
        let value: T = raw.trim().parse().map_err(|_| format!("{raw:?} is not {}", self.what()))?;
        if value < self.min || value > self.max {
            return Err(format!("out of range: expected {}", self.what()));
        }
        Ok(value)
    }

    fn accepted(&self) -> Option<String> {
        Some(self.what())
    }
}

/// A duration written as a window is (`15m`, `7d`), from `min` to 366 days.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub min: Duration,
    /// `min` as written, for the error.
    pub min_text: &'static str,
}

impl Values for Span {
    type Value = Duration;

    fn parse(&self, raw: &str) -> Result<Duration, String> {
        let span = crate::policy::parse_window(raw.trim()).map_err(|e| format!("{raw:?}: {e}"))?;
        if span < self.min {
            return Err(format!("{raw:?} is shorter than {}", self.min_text));
        }
        Ok(span)
    }

    fn accepted(&self) -> Option<String> {
        Some(format!("a duration such as 1h or 7d, from {} to 366d", self.min_text))
    }
}

/// One of a few words, each standing for a `T`; matched exactly.
#[derive(Debug, Clone, Copy)]
pub struct OneOf<T: 'static>(pub &'static [(&'static str, T)]);

/// `true` or `false`.
pub const BOOLEAN: OneOf<bool> = OneOf(&[("true", true), ("false", false)]);

impl<T: Copy + Sync> OneOf<T> {
    /// The words, as "a, b or c" with each word passed through `show`.
    fn listed(&self, show: impl Fn(&str) -> String) -> String {
        let words: Vec<String> = self.0.iter().map(|(word, _)| show(word)).collect();
        match words.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => words.concat(),
        }
    }
}

impl<T: Copy + Sync> Values for OneOf<T> {
    type Value = T;

    fn parse(&self, raw: &str) -> Result<T, String> {
        match self.0.iter().find(|(word, _)| *word == raw) {
            Some((_, value)) => Ok(*value),
            None => Err(format!("{raw:?} is not {}", self.listed(|word| format!("{word:?}")))),
        }
    }

    fn accepted(&self) -> Option<String> {
        Some(self.listed(str::to_owned))
    }
}

/// A [`Setting`] of any values, for what goes over them all: the command
/// line and the documentation tests.
pub trait Variable: Sync {
    /// The setting, its values known only through [`Check`].
    fn erased(&self) -> Setting<&dyn Check>;
}

/// What is left of [`Values`] without the value's type.
pub trait Check {
    /// Why `raw` is refused, if it is.
    fn check(&self, raw: &str) -> Result<(), String>;
    fn accepted(&self) -> Option<String>;
}

impl<V: Values> Check for V {
    fn check(&self, raw: &str) -> Result<(), String> {
        self.parse(raw).map(drop)
    }

    fn accepted(&self) -> Option<String> {
        Values::accepted(self)
    }
}

impl<V: Values> Variable for Setting<V> {
    fn erased(&self) -> Setting<&dyn Check> {
        let Self { var, flag, ref values, unset, help, secret } = *self;
        Setting { var, flag, values, unset, help, secret }
    }
}
