//! Policies and algorithms in the report of `bench/run`: the
//! shipped `login` and `contact_confirmation` policies on random identities,
//! a mixed load, and the four algorithms other than the fixed window on the
//! allow path's random keys, each set against its reference.

use std::collections::HashMap;

use crate::numbers::{ms, number, thousands};
use crate::record::{find, Record};
use crate::systems::{scenario_label, RESETS_SCENARIO};

/// pglimit's policy and algorithm scenarios, in the table's order.
pub const SCENARIOS: [&str; 7] = [
    "allow-login",
    "allow-contact",
    "mixed",
    "allow-sliding_window",
    "allow-sliding_log",
    "allow-token_bucket",
    "allow-concurrency",
];

/// The algorithms' scenarios: allow-random with another `"algorithm"`.
pub const ALGORITHMS: [&str; 3] = ["allow-sliding_window", "allow-sliding_log", "allow-token_bucket"];

/// The target: each other algorithm within 20% of the fixed window's throughput.
pub const ALGORITHM_FLOOR: f64 = 0.8;

pub const INTRO: &str = "Policies and algorithms: pglimit with the shipped `login` and \
`contact_confirmation` policies on random identities, a mixed load, and the allow path's random keys \
under the other four algorithms (see *Policies and algorithms* below).";

/// Whether pglimit's comparison run TWIN is measured in SCENARIO: of these
/// scenarios, the metrics-off run only in the login policy; none on the
/// curve; the deny path during resets, only the baseline.
pub fn twin_measures(twin: &str, scenario: &str) -> bool {
    if scenario == crate::curve::SCENARIO {
        return false;
    }
    if scenario == RESETS_SCENARIO {
        return twin == "baseline";
    }
    !(twin == "pglimit-nometrics" && SCENARIOS.contains(&scenario) && scenario != "allow-login")
}

/// A client count at which pglimit's allow path was measured without one of
/// these scenarios, or raw Postgres' login transaction.
pub fn missing(records: &[Record]) -> Vec<String> {
    let mut missing = Vec::new();
    for r in records.iter().filter(|r| r.system == "pglimit" && r.scenario == "allow-random") {
        let wanted = SCENARIOS.iter().map(|s| ("pglimit", *s)).chain([("raw-pg", "allow-login")]);
        for (system, scenario) in wanted {
            if find(records, system, scenario, r.concurrency).is_none() {
                missing.push(format!("{system} {scenario} c={}", r.concurrency));
            }
        }
    }
    missing
}

/// The share of answers other than 2xx/3xx (429 denials, in these scenarios).
pub fn denied(r: &Record) -> f64 {
    if r.requests > 0.0 {
        r.status_errors / r.requests
    } else {
        f64::NAN
    }
}

/// An algorithm's requests/s over the fixed window's, marked below the floor.
fn against_fixed(r: &Record, fixed_window: Option<&Record>) -> String {
    match fixed_window {
        Some(f) if r.rps > 0.0 && f.rps > 0.0 && r.rps / f.rps < ALGORITHM_FLOOR => {
            format!("**{:.2}** (more than 20% slower)", r.rps / f.rps)
        }
        _ => r.times(fixed_window),
    }
}

/// One row per scenario and client count of pglimit's: requests/s, p50,
/// p99, the denied share, the login policy over its raw transaction and each
/// algorithm over the fixed window. None when none of them was measured.
pub fn table(records: &[Record]) -> Option<String> {
    let mut rows = vec![
        "| scenario | clients | requests/s | p50 ms | p99 ms | denied | × raw Postgres | × fixed window |"
            .to_string(),
        "|---|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    for scenario in SCENARIOS {
        for r in records.iter().filter(|r| r.system == "pglimit" && r.scenario == scenario) {
            let vs_raw = r.times(find(records, "raw-pg", scenario, r.concurrency));
            let vs_fixed = if ALGORITHMS.contains(&scenario) {
                against_fixed(r, find(records, "pglimit", "allow-random", r.concurrency))
            } else {
                String::new()
            };
            let denied = denied(r);
            let denied = if denied.is_finite() { format!("{:.2}%", 100.0 * denied) } else { String::new() };
            rows.push(format!(
                "| {} | {} | {} | {} | {} | {denied} | {vs_raw} | {vs_fixed} |",
                scenario_label(scenario),
                r.concurrency,
                thousands(r.rps),
                ms(r.p50_us),
                ms(r.p99_us),
            ));
        }
    }
    (rows.len() > 2).then(|| rows.join("\n"))
}

/// How to read the table, with the identity spaces of this run.
pub fn how_to_read(meta: &HashMap<String, String>) -> String {
    let count = |key: &str| meta.get(key).map_or_else(|| "?".to_string(), |v| thousands(number(v)));
    format!(
        "- *Policies and algorithms*: `login` and `contact_confirmation` are policies.default.toml's, byte for \
         byte (bench/run checks). *allow-login*: `{{\"policy\":\"login\",\"identifiers\":{{\"email\":\
         \"u<E>@example.org\",\"ip\":\"198.<18-19>.<x>.<y>\"}}}}` with E random of {} and the address random of \
         {} (198.18.0.0/15), drawn apart: three buckets (email+ip 5/1m, ip 20/1m, email 50/15m), so every check \
         has three buckets (a policy's road); its raw figure is pgbench running the three reference upserts on the \
         same identities, keys hashed from `email_ip/…`, `ip/…` and `email/…`, in one transaction \
         (`bench/pgbench/login.sql`). *allow-contact*: `{{\"policy\":\"contact_confirmation\",\"identifiers\":\
         {{\"recipient\":\"r<R>@example.net\"}}}}`, R random of {} (limit 3 a day). *mixed*: each request at \
         random 40% login and 15% contact (the same identities), 30% ad hoc one-off keys (limit 100 a minute, \
         the four algorithms in turn), 15% ad hoc hot keys (10 keys, fixed window). Their requests are \
         pre-rendered per wrk thread, each drawn at random, and sent in order, enough of them that none repeats \
         below 20,000 requests/s; the spaces are big enough that at that rate under 1% of checks would be \
         denied (bench/scenarios.sh shows how). *denied*: the share of answers that were not 2xx/3xx (wrk \
         counts them together; the run fails above 1%). *allow-<algorithm>*: the allow path's random keys and \
         limit with that `\"algorithm\"`; *× fixed window*: its requests/s over `allow, random keys` (the fixed \
         window) at the same client count, in bold below {ALGORITHM_FLOOR} (the target: within 20%).",
        count("login_emails"),
        count("login_ips"),
        count("contact_recipients"),
    )
}
