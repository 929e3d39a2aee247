//! Where counters are kept, and the secret their keys are made with.

use std::path::PathBuf;

use super::variables as v;
use super::ConfigError;
use crate::limiter::{KeySecret, MIN_SECRET_LEN};

/// Where counters are kept, and the secret their keys are made with.
#[derive(Clone)]
pub enum Database {
    /// `DATABASE_URL`, shared by every instance, which must all use the same
    /// secret (so one is required).
    Shared { url: String, secret: KeySecret },
    /// No `DATABASE_URL`: a private cluster in `data_dir`, with the configured
    /// secret or one generated once and kept beside it.
    Private {
        data_dir: PathBuf,
        /// Where `initdb` and `pg_ctl` are; `None`: PATH, then /usr/lib/postgresql.
        pg_bin: Option<PathBuf>,
        secret: Option<KeySecret>,
    },
}

/// Redacts the database URL (it may hold a password) and the secret.
impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Shared { .. } => f.write_str("Shared { url: <set> }"),
            Self::Private { data_dir, .. } => write!(f, "Private {{ data_dir: {data_dir:?} }}"),
        }
    }
}

pub(super) fn database(get: &impl Fn(&str) -> Option<String>) -> Result<Database, ConfigError> {
    let key_secret = match v::KEY_SECRET.secret(get)? {
        Some(s) => Some(KeySecret::new(s.as_bytes()).ok_or_else(|| short_secret(s.len()))?),
        None => None,
    };
    Ok(match (v::DATABASE_URL.secret(get)?, key_secret) {
        (Some(url), Some(secret)) => Database::Shared { url, secret },
        (Some(_), None) => return Err(missing_secret()),
        (None, secret) => Database::Private {
            data_dir: PathBuf::from(v::DATA_DIR.read(get)?),
            pg_bin: v::PG_BIN.given(get)?.map(PathBuf::from),
            secret,
        },
    })
}

fn missing_secret() -> ConfigError {
    let reason = format!(
        "required when DATABASE_URL is set: every instance sharing the database must use the same secret \
         (at least {MIN_SECRET_LEN} bytes, e.g. from `openssl rand -hex 32`), or their counters silently diverge"
    );
    ConfigError::new(v::KEY_SECRET.var, reason)
}

fn short_secret(len: usize) -> ConfigError {
    let reason =
        format!("is {len} bytes; it must be at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 32`)");
    ConfigError::new(v::KEY_SECRET.var, reason)
}
