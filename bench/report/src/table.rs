//! The main table: one row per measurement off the curve, with its ratios
//! to the references of the same scenario and client count.

use std::fmt::Write as _;

use crate::curve;
use crate::numbers::{ms, thousands};
use crate::record::{find, Record};
use crate::render::Run;
use crate::systems::{is_pglimit, scenario_label, system_label};

/// The table; with a baseline, a "× baseline" column and the baseline's rows
/// named after its revision; with pglimit-nometrics measured, a "× metrics
/// off" column.
pub fn table(run: &Run) -> String {
    // After "Postgres ms / statement": "× metrics off", only in a run that measured
    // pglimit-nometrics, then "× baseline", only in a run with a baseline.
    let (metrics_off_head, metrics_off_rule) =
        if run.metrics_off { ("| × metrics off ", "---:|") } else { ("", "") };
    let (baseline_head, baseline_rule) =
        if run.baseline.is_some() { ("| × baseline ", "---:|") } else { ("", "") };
    let mut rows = vec![
        format!(
            "| system | scenario | clients | requests/s | p50 ms | p99 ms | statements / decision \
             | Postgres ms / statement {metrics_off_head}{baseline_head}| × raw Postgres | × HTTP ceiling \
             | × rate-limiter-flexible | × runlimit-postgres | × seed service \
             | CPU µs / request: service · Postgres · rest | check |"
        ),
        format!(
            "|---|---|---:|---:|---:|---:|---:|---:|{metrics_off_rule}{baseline_rule}---:|---:|---:|---:|---:|---:|---|"
        ),
    ];
    // The curve's own points have a table of their own (curve.rs).
    for r in run.records.iter().filter(|r| r.scenario != curve::SCENARIO) {
        rows.push(row(run, r));
    }
    rows.join("\n")
}

/// R's row.
fn row(run: &Run, r: &Record) -> String {
    let label = match run.baseline {
        Some(rev) if r.system == "baseline" => format!("pglimit at {rev} (baseline)"),
        _ => system_label(&r.system).to_string(),
    };
    let (per_decision, exec) = statements(r);
    let mut check = r.check();
    if r.resets_per_s.is_finite() {
        write!(check, " ({} resets/s alongside)", thousands(r.resets_per_s)).expect("a String");
    }
    format!(
        "| {label} | {} | {} | {} | {} | {} | {per_decision} | {exec} | {} | {} | {check} |",
        scenario_label(&r.scenario),
        r.concurrency,
        thousands(r.rps),
        ms(r.p50_us),
        ms(r.p99_us),
        references(run, r),
        r.cpu,
    )
}

/// Statements per decision (the ceiling's count, it has none) and their
/// mean execution time.
fn statements(r: &Record) -> (String, String) {
    let fixed3 = |x: f64| if x.is_finite() { format!("{x:.3}") } else { String::new() };
    let per_decision =
        if r.system == "ceiling" { format!("{}", r.statements) } else { fixed3(r.per_decision) };
    (per_decision, fixed3(r.exec_ms_per_statement))
}

/// The "×" cells, from "× metrics off" (when measured) to "× seed service".
fn references(run: &Run, r: &Record) -> String {
    let records = run.records;
    let (system, scenario, conc) = (r.system.as_str(), r.scenario.as_str(), r.concurrency);
    let http = is_pglimit(system) || matches!(system, "rlflex" | "runlimit" | "seed");
    let raw_shape = matches!(scenario, "allow-random" | "allow-hot" | "allow-login");
    // pglimit.check from SQL too, per pgbench transaction (sql.rs).
    let vs_raw = if (http || system == crate::sql::SYSTEM) && raw_shape {
        r.times(find(records, "raw-pg", scenario, conc))
    } else {
        String::new()
    };
    // The ceiling speaks HTTP/1.1 and JSON, not gRPC.
    let vs_ceiling = if http && scenario != "allow-grpc" {
        r.times(find(records, "ceiling", "allow-random", conc))
    } else {
        String::new()
    };
    // pglimit's rows alone are set against its twins and the peers.
    let vs = |other: &str| {
        if system == "pglimit" {
            r.times(find(records, other, scenario, conc))
        } else {
            String::new()
        }
    };
    let mut vs_peer = vs("rlflex");
    if system == "pglimit" && scenario == "deny" {
        let block = r.times(find(records, "rlflex", "deny-inmemory-block", conc));
        if !block.is_empty() {
            write!(vs_peer, " ({block} vs block)").expect("a String");
        }
    }
    let mut cells = Vec::new();
    if run.metrics_off {
        cells.push(vs("pglimit-nometrics"));
    }
    if run.baseline.is_some() {
        cells.push(vs("baseline"));
    }
    cells.extend([vs_raw, vs_ceiling, vs_peer, vs("runlimit"), vs("seed")]);
    cells.join(" | ")
}

/// A table of pglimit's records that have a `part` (their slow checks,
/// their phases): the `head` lines, then `row` of each such record; none if
/// no record has one.
pub fn pglimit_table<'a, T: 'a>(
    records: &'a [Record],
    head: &str,
    part: impl Fn(&'a Record) -> Option<&'a T>,
    row: impl Fn(&Record, &T) -> String,
) -> Option<String> {
    let rows: Vec<String> =
        records.iter().filter(|r| r.system == "pglimit").filter_map(|r| Some(row(r, part(r)?))).collect();
    (!rows.is_empty()).then(|| format!("{head}\n{}", rows.join("\n")))
}
