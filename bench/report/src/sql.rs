//! pglimit.check from SQL, in the report of `bench/run`: pgbench calling
//! `SELECT * FROM pglimit.check(...)` (system `pglimit-sql`) set against
//! raw Postgres' pgbench of the same shape, per transaction: the one-bucket
//! policy `bench_one` against the single-row upsert, the `login` policy
//! against its three-upsert transaction.

use crate::numbers::{ms, thousands};
use crate::record::{find, Record};

/// pglimit.check under pgbench.
pub const SYSTEM: &str = "pglimit-sql";

/// Its scenarios, each with the policy checked: the pgbench script and its call.
pub const SCENARIOS: [(&str, &str); 2] = [
    (
        "allow-random",
        "`bench_one` (one fixed-window bucket, limit 10⁹ per 1 h) on 10,000 random keys: \
         `bench/pgbench/check.sql` against the single-row upsert of `upsert.sql`",
    ),
    (
        "allow-login",
        "`login` (three buckets) on random identities: `bench/pgbench/check-login.sql` against the \
         three-upsert transaction of `login.sql`",
    ),
];

/// The target: at least this share of raw Postgres' transactions/s, one bucket against one upsert.
pub const FLOOR: f64 = 0.8;

pub const INTRO: &str =
    "pglimit.check from SQL: `SELECT * FROM pglimit.check(...)` under pgbench, one check \
per transaction, against raw Postgres' pgbench of the same shape in this run (see *pglimit.check from SQL* \
below).";

pub const HOW_TO_READ: &str = "\
- *pglimit.check from SQL*: pgbench (`-n -M prepared`, the clients, threads and seconds of raw Postgres' rows, \
measured right after them on the same cluster) running `SELECT * FROM pglimit.check('<policy>', \
jsonb_build_object(...))`, one call per transaction, in a database of its own into which `pglimit policies \
push` wrote `bench/policies.toml` followed by `bench/policies-sql.toml` and the key secret (no service runs); \
a check must be admitted after each measurement. *× raw*: its transactions/s over raw Postgres' at the same \
scenario and client count, per transaction: `bench_one`'s one bucket against the single-row upsert (the fair \
match: one row each; the target is at least 0.8, in bold below), `login`'s three buckets against the \
three-upsert transaction. The difference is what the SQL interface does besides the upsert: the policy read \
from `pglimit_policies`, the identifiers validated and keyed (HMAC-SHA256 in SQL), overrides and blocks \
looked up, and the answer built.";

/// A scenario and client count of raw Postgres' with no pglimit.check twin,
/// once pglimit.check was measured at all.
pub fn missing(records: &[Record]) -> Vec<String> {
    if !records.iter().any(|r| r.system == SYSTEM) {
        return Vec::new();
    }
    let raw =
        records.iter().filter(|r| r.system == "raw-pg" && SCENARIOS.iter().any(|(s, _)| *s == r.scenario));
    raw.filter(|r| find(records, SYSTEM, &r.scenario, r.concurrency).is_none())
        .map(|r| format!("{SYSTEM} {} c={}", r.scenario, r.concurrency))
        .collect()
}

/// pglimit.check's transactions/s over raw's, in bold below [`FLOOR`] for
/// the one-bucket scenario (the target's).
fn against_raw(scenario: &str, r: &Record, raw: Option<&Record>) -> String {
    match raw {
        Some(raw)
            if scenario == "allow-random" && r.rps > 0.0 && raw.rps > 0.0 && r.rps / raw.rps < FLOOR =>
        {
            format!("**{:.2}** (below {FLOOR})", r.rps / raw.rps)
        }
        _ => r.times(raw),
    }
}

/// One row per scenario and client count of pglimit.check's: the policy,
/// raw's transactions/s and p99, pglimit.check's, and the ratio. None when
/// it was not measured.
pub fn table(records: &[Record]) -> Option<String> {
    let mut rows = vec![
        "| policy checked, against | clients | raw transactions/s | raw p99 ms | pglimit.check transactions/s \
         | pglimit.check p99 ms | × raw |"
            .to_string(),
        "|---|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    for (scenario, policy) in SCENARIOS {
        for r in records.iter().filter(|r| r.system == SYSTEM && r.scenario == scenario) {
            let raw = find(records, "raw-pg", scenario, r.concurrency);
            let (raw_rps, raw_p99) =
                raw.map_or((String::new(), String::new()), |w| (thousands(w.rps), ms(w.p99_us)));
            rows.push(format!(
                "| {policy} | {} | {raw_rps} | {raw_p99} | {} | {} | {} |",
                r.concurrency,
                thousands(r.rps),
                ms(r.p99_us),
                against_raw(scenario, r, raw),
            ));
        }
    }
    (rows.len() > 2).then(|| rows.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(system: &str, scenario: &str, concurrency: f64, rps: f64) -> Record {
        let mut r = Record::empty(Vec::new());
        (r.system, r.scenario, r.concurrency, r.rps, r.p99_us) =
            (system.to_string(), scenario.to_string(), concurrency, rps, 1500.0);
        r
    }

    #[test]
    fn the_table_sets_each_check_against_raw_of_the_same_shape_and_marks_one_bucket_below_the_floor() {
        let records = [
            record("raw-pg", "allow-random", 8.0, 1000.0),
            record("raw-pg", "allow-login", 8.0, 400.0),
            record(SYSTEM, "allow-random", 8.0, 700.0),
            record(SYSTEM, "allow-login", 8.0, 300.0),
        ];
        let table = table(&records).expect("a table");
        assert!(table.contains("| 8 | 1,000 | 1.50 | 700 | 1.50 | **0.70** (below 0.8) |"), "{table}");
        assert!(table.contains("| 8 | 400 | 1.50 | 300 | 1.50 | 0.75 |"), "{table}");
    }

    #[test]
    fn a_raw_measurement_without_its_pglimit_check_twin_is_missing_once_pglimit_check_ran() {
        let raw = || {
            vec![record("raw-pg", "allow-random", 8.0, 1000.0), record("raw-pg", "allow-login", 32.0, 1.0)]
        };
        assert!(
            missing(&raw()).is_empty(),
            "not measured at all: the system's absence is reported elsewhere"
        );
        let mut records = raw();
        records.push(record(SYSTEM, "allow-random", 8.0, 900.0));
        assert_eq!(missing(&records), ["pglimit-sql allow-login c=32"]);
    }

    #[test]
    fn no_table_without_a_pglimit_check_measurement() {
        assert!(table(&[record("raw-pg", "allow-random", 8.0, 1000.0)]).is_none());
    }
}
