//! How pglimit reaches a shared Postgres: through which pooler, into which
//! schema, and within how many connections.

use super::setting::Values;
use super::variables::{DB_MAX_CONNECTIONS, DB_POOLER, DB_POOL_SIZE, DB_SCHEMA};
use super::ConfigError;
use crate::storage::{kept_connections, Pooler, Reach};

/// The pooler, the schema, and the connections for checks: the pool size
/// as configured, or what `PGLIMIT_DB_MAX_CONNECTIONS` leaves once the
/// kept connections and one for writing back are counted.
pub(super) fn reach(get: &impl Fn(&str) -> Option<String>) -> Result<(Reach, u32), ConfigError> {
    let pooler = DB_POOLER.read(get)?;
    let schema = DB_SCHEMA.given(get)?;
    Ok((Reach { pooler, schema }, pool_size(get, pooler)?))
}

/// A schema's name as PostgreSQL keeps it whole.
#[derive(Debug, Clone, Copy)]
pub struct SchemaName;

impl Values for SchemaName {
    type Value = String;

    fn parse(&self, raw: &str) -> Result<String, String> {
        // PostgreSQL truncates a longer name, which would then name another schema.
        if raw.len() > 63 || raw.contains('\0') {
            return Err("a schema name of at most 63 bytes".into());
        }
        Ok(raw.to_owned())
    }

    fn accepted(&self) -> Option<String> {
        Some("a name of at most 63 bytes".into())
    }
}

fn pool_size(get: &impl Fn(&str) -> Option<String>, pooler: Pooler) -> Result<u32, ConfigError> {
    let Some(max) = DB_MAX_CONNECTIONS.given(get)? else {
        return DB_POOL_SIZE.read(get);
    };
    let others = kept_connections(pooler) + 1;
    let fits = max.saturating_sub(others);
    if fits == 0 {
        let reason =
            format!("{max} leaves no connection for checks: an instance keeps {others} besides them");
        return Err(ConfigError::new(DB_MAX_CONNECTIONS.var, reason));
    }
    let pool = DB_POOL_SIZE.parse(&get(DB_POOL_SIZE.var).unwrap_or_else(|| fits.to_string()))?;
    if pool > fits {
        let reason = format!(
            "{pool} connections for checks and {others} others exceed {}={max}: \
             set it to at most {fits}, or leave it unset",
            DB_MAX_CONNECTIONS.var
        );
        return Err(ConfigError::new(DB_POOL_SIZE.var, reason));
    }
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach_of(vars: &[(&str, &str)]) -> Result<(Reach, u32), ConfigError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        reach(&|name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn a_connection_budget_sizes_the_pool_around_the_kept_connections() {
        assert_eq!(reach_of(&[]).expect("defaults").1, 4);
        assert_eq!(reach_of(&[("PGLIMIT_DB_MAX_CONNECTIONS", "20")]).expect("budget").1, 14);
        let transaction = [("PGLIMIT_DB_MAX_CONNECTIONS", "20"), ("PGLIMIT_DB_POOLER", "transaction")];
        assert_eq!(reach_of(&transaction).expect("no listener").1, 15);
    }

    #[test]
    fn a_budget_too_small_for_the_pool_is_refused_naming_both_settings() {
        let err =
            reach_of(&[("PGLIMIT_DB_MAX_CONNECTIONS", "8"), ("PGLIMIT_DB_POOL_SIZE", "4")]).unwrap_err();
        assert_eq!(err.var, "PGLIMIT_DB_POOL_SIZE");
        assert!(
            err.reason.contains("PGLIMIT_DB_MAX_CONNECTIONS=8") && err.reason.contains("at most 2"),
            "{err}"
        );
        let err = reach_of(&[("PGLIMIT_DB_MAX_CONNECTIONS", "6")]).unwrap_err();
        assert_eq!(err.var, "PGLIMIT_DB_MAX_CONNECTIONS");
    }

    #[test]
    fn an_unknown_pooler_mode_stops_start_up_naming_the_setting() {
        let err = reach_of(&[("PGLIMIT_DB_POOLER", "statement")]).unwrap_err();
        assert_eq!(err.var, "PGLIMIT_DB_POOLER");
    }
}
