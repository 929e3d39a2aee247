//! The slowest checks of each pglimit measurement, in the report of
//! `bench/run` with `BENCH_SLOW=1`: pglimit's slow-check log,
//! reset before the measurement and read after it (`slow.json`).
//!
//! The figures are those of `bench/slow.jq` (bench/ab's `AB_SLOW` line):
//! keep the two alike.

use std::path::Path;

use serde_json::Value;

use crate::numbers::thousands;
use crate::record::Record;

/// The phases of a slow check, as `/admin/slow-checks` names them.
const PHASES: [&str; 4] = ["total_us", "queue_us", "call_us", "rest_us"];

/// A measurement's slowest 0.1% of checks.
#[derive(Debug, Clone)]
pub struct Slowest {
    /// 0.1% of the measurement's requests, rounded up.
    want: usize,
    /// How many the log kept of those.
    kept: usize,
    capacity: usize,
    /// Per phase of [`PHASES`]: the median (the lower one of an even count) and the max, in µs.
    phases: [(f64, f64); 4],
    /// How many were dominated by the queue, the call and the rest.
    dominated: [usize; 3],
}

/// The slowest 0.1% of `requests` checks, from DIR's `slow.json`.
pub fn read(dir: &Path, requests: f64) -> Option<Slowest> {
    let text = std::fs::read_to_string(dir.join("slow.json")).ok()?;
    let log: Value = serde_json::from_str(&text).ok()?;
    let want = (requests / 1000.0).ceil();
    let want = if want.is_finite() && want > 0.0 { want as usize } else { 0 };
    let top: Vec<&Value> = log["checks"].as_array()?.iter().take(want).collect();
    let field = |c: &Value, f: &str| c[f].as_f64().unwrap_or(f64::NAN);
    let phases = PHASES.map(|f| median_and_max(top.iter().map(|c| field(c, f)).collect()));
    let mut dominated = [0; 3];
    for c in &top {
        let v = [field(c, "queue_us"), field(c, "call_us"), field(c, "rest_us")];
        let largest = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if let Some(i) = v.iter().position(|x| *x == largest) {
            dominated[i] += 1;
        }
    }
    let capacity = log["capacity"].as_u64().unwrap_or(0) as usize;
    Some(Slowest { want, kept: top.len(), capacity, phases, dominated })
}

fn median_and_max(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len().saturating_sub(1) / 2).copied().unwrap_or(f64::NAN);
    (median, values.last().copied().unwrap_or(f64::NAN))
}

pub const INTRO: &str = "The slowest 0.1% of each pglimit measurement's checks (`BENCH_SLOW=1`), from \
its slow-check log (see *The slowest checks* below).";

pub const HOW_TO_READ: &str = "\
### The slowest checks

With `BENCH_SLOW=1`, pglimit keeps its `BENCH_SLOW_CAPACITY` slowest checks (`PGLIMIT_SLOW_CHECKS`, \
default 2,048); `bench/run` empties that log (`DELETE /admin/slow-checks`) right before each \
measurement and reads it (`GET`) right after. Of the measurement's requests, the slowest 0.1% (wrk's \
count / 1,000, rounded up) are taken: *checks* says how many, of how many wanted (fewer when the log \
is smaller: *capped*). Per phase, the median (the lower one of an even count) and the max in ms: \
**total**, from the handler starting to decide until the decision is back; **queue**, waiting in the \
instance for a call to Postgres; **call**, that call (statement, commit, round trip); **rest**, the \
total minus both (the policy and keys, the deny cache, the fallback, the answer); a check no call \
decided (the deny path) has all its time in the rest. *Dominated by* counts the checks whose largest \
phase was each (a tie goes to the earlier of queue, call, rest).
";

/// One row per pglimit measurement with a slow-check log.
pub fn table(records: &[Record]) -> Option<String> {
    let head = "| scenario | clients | checks | total ms (max) | queue ms (max) | call ms (max) | rest ms (max) | dominated by queue · call · rest |\n|---|---:|---:|---:|---:|---:|---:|---:|";
    crate::table::pglimit_table(records, head, |r| r.slow.as_ref(), row)
}

fn row(r: &Record, s: &Slowest) -> String {
    let ms = |(median, max): (f64, f64)| format!("{:.2} ({:.2})", median / 1000.0, max / 1000.0);
    let checks = if s.kept < s.want {
        let why = if s.want > s.capacity { "capped" } else { "kept" };
        format!("{} of {} ({why})", thousands(s.kept as f64), thousands(s.want as f64))
    } else {
        thousands(s.kept as f64)
    };
    let [queue, call, rest] = s.dominated;
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {queue} · {call} · {rest} |",
        r.scenario,
        r.concurrency,
        checks,
        ms(s.phases[0]),
        ms(s.phases[1]),
        ms(s.phases[2]),
        ms(s.phases[3]),
    )
}
