//! Behind a connection pooler, in the report of `bench/run`: pglimit behind
//! Debian's PgBouncer in session and in transaction mode
//! (`PGLIMIT_DB_POOLER`), each in a database of its own, set against
//! pglimit's direct connections in the same run.

use crate::numbers::{ms, thousands};
use crate::record::{find, Record};
use crate::systems::scenario_label;

/// The pooled systems, one per pool mode.
pub const SYSTEMS: [&str; 2] = ["pglimit-session", "pglimit-transaction"];

/// The scenarios each pooled system is measured in.
pub const SCENARIOS: [&str; 3] = ["allow-random", "allow-login", "deny"];

pub const INTRO: &str = "Behind PgBouncer: pglimit with `PGLIMIT_DB_POOLER=session` and `=transaction` \
through Debian's PgBouncer in that pool mode, against pglimit's direct connections in this run (see \
*Behind PgBouncer* below).";

pub const HOW_TO_READ: &str = "\
- *Behind PgBouncer*: the same binary and policies as pglimit, its `DATABASE_URL` pointing at a PgBouncer \
(`pool_mode` as named, `default_pool_size = 20`, `ignore_startup_parameters = extra_float_digits`) on the same \
machine, each mode in a database of its own prefilled as pglimit's was; *× direct*: requests/s over pglimit's \
at the same scenario and client count. Session mode sends the same statements as a direct connection, through \
one more hop; transaction mode sends each batch as one simple-protocol message (`SET LOCAL` settings, then a \
batch function with its values written out), which the server parses and plans every time, while the \
function keeps its statements' plans. PgBouncer's own CPU \
is not in the CPU columns.";

/// A scenario and client count at which pglimit was measured and a pooled
/// system, measured at all, was not.
pub fn missing(records: &[Record]) -> Vec<String> {
    let mut missing = Vec::new();
    for system in SYSTEMS.iter().filter(|s| records.iter().any(|r| r.system == **s)) {
        for r in records.iter().filter(|r| r.system == "pglimit" && SCENARIOS.contains(&r.scenario.as_str()))
        {
            if find(records, system, &r.scenario, r.concurrency).is_none() {
                missing.push(format!("{system} {} c={}", r.scenario, r.concurrency));
            }
        }
    }
    missing
}

/// One row per scenario and client count of pglimit's in [`SCENARIOS`]:
/// its requests/s and p99, then each mode's, with its requests/s over
/// pglimit's. None when no pooled system ran.
pub fn against_direct(records: &[Record]) -> Option<String> {
    if !SYSTEMS.iter().any(|s| records.iter().any(|r| r.system == *s)) {
        return None;
    }
    let mut rows = vec![
        "| scenario | clients | direct requests/s | direct p99 ms | session requests/s | session p99 ms \
         | session × direct | transaction requests/s | transaction p99 ms | transaction × direct |"
            .to_string(),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    for direct in records.iter().filter(|r| r.system == "pglimit" && SCENARIOS.contains(&r.scenario.as_str()))
    {
        let mut row = format!(
            "| {} | {} | {} | {} |",
            scenario_label(&direct.scenario),
            direct.concurrency,
            thousands(direct.rps),
            ms(direct.p99_us)
        );
        for system in SYSTEMS {
            let (rps, p99, times) = match find(records, system, &direct.scenario, direct.concurrency) {
                Some(r) => (thousands(r.rps), ms(r.p99_us), r.times(Some(direct))),
                None => (String::new(), String::new(), String::new()),
            };
            row.push_str(&format!(" {rps} | {p99} | {times} |"));
        }
        rows.push(row);
    }
    Some(rows.join("\n"))
}
