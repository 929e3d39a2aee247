//! Every configuration variable, declared once as a
//! [`Setting`](super::setting::Setting): the flags of `serve` and
//! `migrate`, [`Config`](super::Config)'s parsing and the check of
//! `.env.example` all come from these lists.

mod database;
mod service;

pub use database::*;
pub use service::*;

use super::setting::Variable;

/// Every variable, in the order of `.env.example`: each is a flag of `serve`.
pub static ALL: &[&dyn Variable] = &[
    &BIND,
    &GRPC_BIND,
    &DATABASE_URL,
    &DATABASE_URL_FILE,
    &KEY_SECRET,
    &KEY_SECRET_FILE,
    &DATA_DIR,
    &PG_BIN,
    &POLICIES,
    &API_TOKENS,
    &API_TOKENS_FILE,
    &ADMIN_TOKENS,
    &ADMIN_TOKENS_FILE,
    &CLEANUP_RATE,
    &DB_TIMEOUT_MS,
    &DB_POOL_SIZE,
    &DB_PIPELINE,
    &DB_MAX_CONNECTIONS,
    &DB_POOLER,
    &DB_SCHEMA,
    &UNLOGGED,
    &CITUS,
    &CITUS_CHECKS,
    &MEMORY_CAPACITY,
    &LOG_FORMAT,
    &METRICS,
    &METRICS_TOKEN,
    &METRICS_TOKEN_FILE,
    &SHADOW,
    &WATCH_POLICIES,
    &REQUEST_TIMEOUT_MS,
    &SLOW_CHECKS,
    &MAX_WAITING,
    &TOP,
    &TOP_RETENTION,
    &WORKER_THREADS,
    &CONSOLE,
    &SQL,
    &AUDIT_RETENTION,
];

/// The variables `migrate` reads, its flags: the database, how to reach
/// it, and where and how to lay out the tables in it.
pub static MIGRATE: &[&dyn Variable] =
    &[&DATABASE_URL, &DATABASE_URL_FILE, &DB_POOLER, &DB_SCHEMA, &UNLOGGED, &CITUS, &LOG_FORMAT];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::setting::Unset;
    use std::collections::BTreeSet;

    #[test]
    fn every_flag_is_its_variable_renamed_and_named_once() {
        let mut seen = BTreeSet::new();
        for setting in ALL.iter().map(|v| v.erased()) {
            let flag = setting.var.trim_start_matches("PGLIMIT_").to_lowercase().replace('_', "-");
            assert_eq!(setting.flag, flag, "{}", setting.var);
            assert!(seen.insert(setting.var), "{} declared twice", setting.var);
        }
        let migrate: BTreeSet<_> = MIGRATE.iter().map(|v| v.erased().var).collect();
        assert!(migrate.is_subset(&seen), "{migrate:?}");
    }

    #[test]
    fn every_default_is_a_value_its_variable_accepts() {
        for setting in ALL.iter().map(|v| v.erased()) {
            if let Unset::Is(value) = setting.unset {
                assert_eq!(setting.values.check(value), Ok(()), "{}", setting.var);
            }
        }
    }

    #[test]
    fn every_secret_and_only_a_secret_may_be_read_from_a_file_declared_beside_it() {
        let vars: BTreeSet<&str> = ALL.iter().map(|v| v.erased().var).collect();
        let secrets: BTreeSet<&str> =
            ALL.iter().map(|v| v.erased()).filter(|s| s.secret).map(|s| s.var).collect();
        let files: BTreeSet<&str> = vars.iter().filter_map(|var| var.strip_suffix("_FILE")).collect();
        assert_eq!(secrets, files);
        assert!(secrets.len() >= 5, "{secrets:?}");
    }
}
