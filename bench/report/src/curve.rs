//! The concurrency curve in the report of `bench/run`: the allow
//! path on random keys at each of `BENCH_CURVE`'s client counts, for
//! pglimit, raw Postgres, the seed service and rate-limiter-flexible; a
//! table, and the data its chart (bench/chart) is drawn from.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::numbers::{ms, number, thousands};
use crate::record::Record;

/// The systems on the curve, in the legend's order, with their labels.
pub const SYSTEMS: [(&str, &str); 4] = [
    ("pglimit", "pglimit"),
    ("raw-pg", "raw Postgres (pgbench upsert)"),
    ("seed", "seed service (axum + SQLx, one upsert)"),
    ("rlflex", "rate-limiter-flexible"),
];

/// The measurements of client counts off the main table's.
pub const SCENARIO: &str = "curve";

pub const HOW_TO_READ: &str = "\
- *Concurrency curve*: the allow path on random keys (10,000 keys, one bucket) at each client count of \
`BENCH_CURVE`; at the main table's client counts it is that table's `allow, random keys` measurement, at the \
others one of its own (the same scenario, measured right after the main table's scenarios on the same \
instance; wrk and pgbench with one thread per client below `BENCH_THREADS`). *× raw* and *× seed*: pglimit's \
requests/s over raw Postgres' and the seed service's at the same client count.";

/// The line over the table, with the chart (the meta's `curve_png`, beside the report).
pub fn intro(meta: &HashMap<String, String>) -> String {
    let chart = match meta.get("curve_png").filter(|png| !png.is_empty()) {
        Some(png) => format!("\n\n![requests/s against client connections]({png})"),
        None => String::new(),
    };
    format!(
        "Concurrency curve: the allow path on random keys at each client count, requests/s and p99 (see \
         *Concurrency curve* below).{chart}"
    )
}

/// The curve's client counts, from the meta's `curve` (none: no curve).
pub fn points(meta: &HashMap<String, String>) -> Vec<f64> {
    let mut points: Vec<f64> = meta
        .get("curve")
        .map(|c| c.split_whitespace().map(number).filter(|c| c.is_finite()).collect())
        .unwrap_or_default();
    points.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    points.dedup();
    points
}

/// SYSTEM's curve point at CONCURRENCY: its own measurement or the main table's.
pub fn find<'a>(records: &'a [Record], system: &str, concurrency: f64) -> Option<&'a Record> {
    records.iter().find(|r| {
        r.system == system
            && (r.scenario == SCENARIO || r.scenario == "allow-random")
            && r.concurrency == concurrency
    })
}

/// Points of the curve that some system has no measurement for.
pub fn missing(records: &[Record], meta: &HashMap<String, String>) -> Vec<String> {
    let mut missing = Vec::new();
    for c in points(meta) {
        for (system, _) in SYSTEMS {
            if find(records, system, c).is_none() {
                missing.push(format!("{system} curve c={c}"));
            }
        }
    }
    missing
}

/// requests/s over another's, two decimals; blank when either is missing.
fn times(a: Option<&Record>, b: Option<&Record>) -> String {
    a.map_or_else(String::new, |a| a.times(b))
}

/// `ok` when every system's point at C had no problem, else theirs.
fn check(records: &[Record], c: f64) -> String {
    let problems: Vec<String> = SYSTEMS
        .iter()
        .filter_map(|(system, _)| find(records, system, c))
        .filter(|r| !r.problems.is_empty())
        .map(|r| format!("{}: {}", r.system, r.problems.join("; ")))
        .collect();
    if problems.is_empty() {
        "ok".to_string()
    } else {
        problems.join("; ")
    }
}

/// One row per point: each system's requests/s and p99, then pglimit's
/// requests/s over raw Postgres' and the seed service's. None without points.
pub fn table(records: &[Record], points: &[f64]) -> Option<String> {
    if points.is_empty() {
        return None;
    }
    let mut head = "| clients |".to_string();
    let mut rule = "|---:|".to_string();
    for (_, label) in SYSTEMS {
        head.push_str(&format!(" {label} requests/s | p99 ms |"));
        rule.push_str("---:|---:|");
    }
    head.push_str(" pglimit × raw | pglimit × seed | check |");
    rule.push_str("---:|---:|---|");
    let mut rows = vec![head, rule];
    for &c in points {
        let mut row = format!("| {c} |");
        for (system, _) in SYSTEMS {
            let r = find(records, system, c);
            let (rps, p99) = r.map_or((String::new(), String::new()), |r| (thousands(r.rps), ms(r.p99_us)));
            row.push_str(&format!(" {rps} | {p99} |"));
        }
        let pglimit = find(records, "pglimit", c);
        row.push_str(&format!(
            " {} | {} | {} |",
            times(pglimit, find(records, "raw-pg", c)),
            times(pglimit, find(records, "seed", c)),
            check(records, c)
        ));
        rows.push(row);
    }
    Some(rows.join("\n"))
}

/// Writes the chart's data to the meta's `curve_tsv`, when it names a file.
pub fn write_data(records: &[Record], meta: &HashMap<String, String>) -> std::io::Result<()> {
    match meta.get("curve_tsv").filter(|path| !path.is_empty()) {
        Some(path) => std::fs::write(path, tsv(records, &points(meta))),
        None => Ok(()),
    }
}

/// The chart's data: `label<TAB>clients<TAB>requests/s`, one point a line.
fn tsv(records: &[Record], points: &[f64]) -> String {
    let mut out = String::new();
    for (system, label) in SYSTEMS {
        for &c in points {
            if let Some(r) = find(records, system, c).filter(|r| r.rps.is_finite() && r.rps > 0.0) {
                out.push_str(&format!("{label}\t{c}\t{}\n", r.rps));
            }
        }
    }
    out
}
