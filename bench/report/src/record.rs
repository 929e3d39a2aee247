//! One measurement of bench/run as the report holds it, and the results
//! directory read into a list of them in the tables' order.

use std::cmp::Ordering;
use std::path::Path;

use crate::systems::{order, SCENARIOS, SYSTEMS};
use crate::{parse, phases, slow};

pub struct Record {
    pub system: String,
    pub scenario: String,
    pub concurrency: f64,
    pub requests: f64,
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// wrk's mean latency.
    pub mean_us: f64,
    /// pglimit's phases, from its `/metrics`.
    pub phases: Option<phases::Phases>,
    /// pglimit's slowest checks, from its slow-check log (`BENCH_SLOW=1`).
    pub slow: Option<slow::Slowest>,
    /// Answers other than 2xx/3xx, as wrk counts them.
    pub status_errors: f64,
    /// CPU µs per request of the server process.
    pub service_us: f64,
    pub statements: f64,
    pub per_decision: f64,
    pub exec_ms_per_statement: f64,
    pub cpu: String,
    /// deny-resets: the resets per second of the stream beside the checks.
    pub resets_per_s: f64,
    pub problems: Vec<String>,
}

impl Record {
    /// A record with no figures yet (NaN) and these problems.
    pub fn empty(problems: Vec<String>) -> Record {
        Record {
            system: String::new(),
            scenario: String::new(),
            concurrency: f64::NAN,
            requests: f64::NAN,
            rps: f64::NAN,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            mean_us: f64::NAN,
            phases: None,
            slow: None,
            status_errors: f64::NAN,
            service_us: f64::NAN,
            statements: f64::NAN,
            per_decision: f64::NAN,
            exec_ms_per_statement: f64::NAN,
            cpu: String::new(),
            resets_per_s: f64::NAN,
            problems,
        }
    }

    /// Its requests/s over OTHER's, two decimals; blank when either is
    /// missing or not positive.
    pub fn times(&self, other: Option<&Record>) -> String {
        match other {
            Some(other) if self.rps > 0.0 && other.rps > 0.0 => format!("{:.2}", self.rps / other.rps),
            _ => String::new(),
        }
    }

    /// `ok`, or its problems.
    pub fn check(&self) -> String {
        if self.problems.is_empty() {
            "ok".to_string()
        } else {
            self.problems.join("; ")
        }
    }
}

/// SYSTEM's measurement of SCENARIO at CONCURRENCY clients.
pub fn find<'a>(records: &'a [Record], system: &str, scenario: &str, concurrency: f64) -> Option<&'a Record> {
    records.iter().find(|r| r.system == system && r.scenario == scenario && r.concurrency == concurrency)
}

/// Every measurement of RESULTS_DIR (one directory each), in the tables'
/// order: by scenario (the deny path's variants together), client count,
/// system.
pub fn collect(results_dir: &Path, clk_tck: f64) -> std::io::Result<Vec<Record>> {
    let mut names: Vec<String> = std::fs::read_dir(results_dir)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let mut records: Vec<Record> =
        names.into_iter().map(|name| parse::measurement(&results_dir.join(name), clk_tck)).collect();
    let scenario_order = |s: &str| order(&SCENARIOS, s);
    let system_order = |s: &str| order(&SYSTEMS, s);
    let group = |s: &str| if s.starts_with("deny") { scenario_order("deny") } else { scenario_order(s) };
    records.sort_by(|a, b| {
        group(&a.scenario)
            .cmp(&group(&b.scenario))
            .then(a.concurrency.partial_cmp(&b.concurrency).unwrap_or(Ordering::Equal))
            .then(system_order(&a.system).cmp(&system_order(&b.system)))
            .then(scenario_order(&a.scenario).cmp(&scenario_order(&b.scenario)))
    });
    Ok(records)
}
