//! Where a check's time goes, in the report of `bench/run`: from
//! pglimit's own `pglimit_check_phase_seconds` histograms, scraped from
//! `/metrics` before and after each measurement, and pg_stat_statements.

use std::path::Path;

use crate::numbers::thousands;
use crate::record::Record;

/// One histogram's change over a measurement: bucket bounds (seconds) with
/// their cumulative counts, the sum and the count.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    fn mean_ms(&self) -> f64 {
        if self.count > 0.0 {
            1000.0 * self.sum / self.count
        } else {
            f64::NAN
        }
    }

    /// The upper bound of the bucket that holds the 99th percentile.
    fn p99_ms(&self) -> f64 {
        let wanted = 0.99 * self.count;
        let bound = self.buckets.iter().find(|(_, n)| *n >= wanted).map_or(f64::INFINITY, |(le, _)| *le);
        1000.0 * bound
    }
}

/// A measurement's phases: waiting in the instance, the call to Postgres,
/// and the whole check as the limiter saw it.
#[derive(Debug, Default, Clone)]
pub struct Phases {
    queue: Histogram,
    call: Histogram,
    check: Histogram,
}

/// The phases measured in DIR, when its `/metrics` was scraped.
pub fn read(dir: &Path) -> Option<Phases> {
    let before = std::fs::read_to_string(dir.join("metrics.before")).ok()?;
    let after = std::fs::read_to_string(dir.join("metrics.after")).ok()?;
    let delta = |name: &str, label: &str| {
        let (b, a) = (histogram(&before, name, label), histogram(&after, name, label));
        let buckets = a.buckets.iter().zip(&b.buckets).map(|((le, n), (_, m))| (*le, n - m)).collect();
        Histogram { buckets, sum: a.sum - b.sum, count: a.count - b.count }
    };
    let phases = Phases {
        queue: delta("pglimit_check_phase_seconds", "phase=\"queue\""),
        call: delta("pglimit_check_phase_seconds", "phase=\"postgres\""),
        check: delta("pglimit_check_duration_seconds", "store=\"postgres\""),
    };
    (phases.check.count > 0.0).then_some(phases)
}

/// NAME's histogram among the series whose labels contain LABEL.
fn histogram(text: &str, name: &str, label: &str) -> Histogram {
    let mut h = Histogram::default();
    for line in text.lines().filter(|l| l.starts_with(name) && l.contains(label)) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let value: f64 = value.parse().unwrap_or(f64::NAN);
        if series.starts_with(&format!("{name}_bucket")) {
            let le = series.split("le=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or("+Inf");
            h.buckets.push((le.parse().unwrap_or(f64::INFINITY), value));
        } else if series.starts_with(&format!("{name}_sum")) {
            h.sum = value;
        } else if series.starts_with(&format!("{name}_count")) {
            h.count = value;
        }
    }
    h
}

pub const INTRO: &str = "Where a check's time goes: pglimit's checks decided by Postgres, from its \
`pglimit_check_phase_seconds` histograms (see *Where a check's time goes* below).";

pub const HOW_TO_READ: &str = "\
### Where a check's time goes

From pglimit's `/metrics`, scraped before and after each measurement (means, and p99 as the upper \
bound of the histogram bucket that holds it): **queue** is the time a check waits in the instance for a \
call to Postgres (the call in flight must end first); **call** is the call's round trip, which holds the \
statement (pg_stat_statements' mean execution time, **statement**), the commit with its WAL flush, and the \
wire; **check** is the whole check as the limiter saw it; **outside** is wrk's mean latency minus the \
check's mean: HTTP, JSON, the policy and the deny cache, and the load generator itself. The \
slowest checks' own phases: `BENCH_SLOW=1` (*The slowest checks*).
";

/// One row per pglimit measurement with phases.
pub fn table(records: &[Record]) -> Option<String> {
    let head = "| scenario | clients | checks/s | queue ms (p99) | call ms (p99) | statement ms | check ms (p99) | outside ms |\n|---|---:|---:|---:|---:|---:|---:|---:|";
    crate::table::pglimit_table(records, head, |r| r.phases.as_ref(), row)
}

fn row(r: &Record, p: &Phases) -> String {
    let both = |h: &Histogram| format!("{:.2} ({:.1})", h.mean_ms(), h.p99_ms());
    format!(
        "| {} | {} | {} | {} | {} | {:.3} | {} | {:.2} |",
        r.scenario,
        r.concurrency,
        thousands(r.rps),
        both(&p.queue),
        both(&p.call),
        r.exec_ms_per_statement,
        both(&p.check),
        r.mean_us / 1000.0 - p.check.mean_ms(),
    )
}
