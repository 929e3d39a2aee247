//! The performance targets in the report of `bench/run`: one row per target,
//! the figure this run measured, and whether it was met or by how much it
//! was missed. Information only: a missed target never fails the run.

use std::collections::HashMap;

use crate::numbers::{ms, number, thousands};
use crate::record::Record;
use crate::{curve, policies, sql};

/// A target and what this run measured for it.
struct Target {
    what: &'static str,
    /// The measured figure in the target's unit (NaN: not measured).
    value: f64,
    /// How the figure is shown, with what it was compared with.
    shown: String,
    bound: f64,
    /// The figure must be at least the bound (else at most).
    at_least: bool,
}

pub const INTRO: &str = "\
The performance targets in this run (one run: the p99 targets ask for three runs out of three): the figure \
of this run for each, *met*, or *missed by* its distance from the bound as a share of the bound. Service CPU per \
check is the service's CPU µs per request (the CPU column) over the HTTP ceiling's at the same client count, and \
the deny path's requests/s over the ceiling's; of those and of the algorithms, the worst client count is shown. \
RSS is pglimit's peak (VmHWM) over all its measurements. A missed target never fails the run. A ratio to raw \
Postgres pairs one measurement of each, taken minutes apart: near its bound, take `bench/ab`'s, which alternates \
raw pgbench and pglimit in rounds (on a shared host single rounds of one build ranged 1.36–1.94 × raw).";

/// CPU µs per request of the server process from bench/run's `cpu` file
/// (ticks: server, Postgres, busy, idle); NaN when it is missing.
pub fn service_us(cpu: &str, requests: f64, clk_tck: f64) -> f64 {
    let server = cpu.split_whitespace().next().map_or(f64::NAN, number);
    if requests > 0.0 && clk_tck > 0.0 {
        server * 1e6 / clk_tck / requests
    } else {
        f64::NAN
    }
}

/// The allow path on random keys may be a point of the curve only.
fn find<'a>(records: &'a [Record], system: &str, scenario: &str, c: f64) -> Option<&'a Record> {
    if scenario == "allow-random" {
        return curve::find(records, system, c);
    }
    crate::record::find(records, system, scenario, c)
}

/// "8 clients", "1 client".
fn at(c: f64) -> String {
    format!("{c} client{}", if c == 1.0 { "" } else { "s" })
}

/// A over B in requests/s at C clients: (value, shown).
fn ratio(records: &[Record], a: (&str, &str), b: (&str, &str), c: f64) -> (f64, String) {
    match (find(records, a.0, a.1, c), find(records, b.0, b.1, c)) {
        (Some(x), Some(y)) if x.rps > 0.0 && y.rps > 0.0 => (
            x.rps / y.rps,
            format!("{:.2} × ({} against {} requests/s)", x.rps / y.rps, thousands(x.rps), thousands(y.rps)),
        ),
        _ => (f64::NAN, format!("not measured at {}", at(c))),
    }
}

/// pglimit's allow-random p99 over raw Postgres' at C clients.
fn p99(records: &[Record], c: f64) -> (f64, String) {
    match (find(records, "pglimit", "allow-random", c), find(records, "raw-pg", "allow-random", c)) {
        (Some(p), Some(raw)) if raw.p99_us > 0.0 => {
            (p.p99_us / raw.p99_us, format!("{} ms against raw's {} ms", ms(p.p99_us), ms(raw.p99_us)))
        }
        _ => (f64::NAN, format!("not measured at {}", at(c))),
    }
}

/// The lowest of FIGURES (value, shown), shown with where it was.
fn worst(figures: impl Iterator<Item = (f64, String)>, lowest: bool) -> (f64, String) {
    let mut worst = (f64::NAN, "not measured".to_string());
    for (value, shown) in figures.filter(|(v, _)| v.is_finite()) {
        let worse = if lowest { value < worst.0 } else { value > worst.0 };
        if worst.0.is_nan() || worse {
            worst = (value, shown);
        }
    }
    worst
}

/// The main table's client counts at which pglimit's allow path was measured.
fn clients(records: &[Record]) -> Vec<f64> {
    let mut clients: Vec<f64> = records
        .iter()
        .filter(|r| r.system == "pglimit" && r.scenario == "allow-random")
        .map(|r| r.concurrency)
        .collect();
    clients.dedup();
    clients
}

fn seed(records: &[Record], meta: &HashMap<String, String>) -> (f64, String) {
    let points = curve::points(meta);
    worst(
        points.iter().map(|&c| match (curve::find(records, "pglimit", c), curve::find(records, "seed", c)) {
            (Some(p), Some(s)) if p.rps > 0.0 && s.rps > 0.0 => {
                (p.rps / s.rps, format!("lowest {:.2} × the seed service, at {}", p.rps / s.rps, at(c)))
            }
            _ => (f64::NAN, String::new()),
        }),
        true,
    )
}

fn algorithms(records: &[Record]) -> (f64, String) {
    let figures = clients(records).into_iter().flat_map(|c| {
        policies::ALGORITHMS.iter().map(move |a| {
            let (value, _) = ratio(records, ("pglimit", a), ("pglimit", "allow-random"), c);
            (value, format!("lowest {value:.2} × the fixed window: {} at {}", &a[6..], at(c)))
        })
    });
    worst(figures, true)
}

/// pglimit.check's one-bucket transactions/s over raw's single-row upsert,
/// at the worst of the client counts both were measured at.
fn sql_check(records: &[Record]) -> (f64, String) {
    let clients = records.iter().filter(|r| r.system == sql::SYSTEM && r.scenario == "allow-random");
    let figures = clients.map(|r| {
        let (value, shown) =
            ratio(records, (sql::SYSTEM, "allow-random"), ("raw-pg", "allow-random"), r.concurrency);
        (value, format!("lowest {shown}, at {}", at(r.concurrency)))
    });
    worst(figures, true)
}

fn cpu(records: &[Record]) -> (f64, String) {
    let figures = clients(records).into_iter().map(|c| {
        match (find(records, "pglimit", "allow-random", c), find(records, "ceiling", "allow-random", c)) {
            (Some(p), Some(h)) if h.service_us > 0.0 && p.service_us.is_finite() => (
                p.service_us / h.service_us,
                format!(
                    "{:.1} µs against {:.1} µs ({:.2} ×), at {}",
                    p.service_us,
                    h.service_us,
                    p.service_us / h.service_us,
                    at(c)
                ),
            ),
            _ => (f64::NAN, String::new()),
        }
    });
    worst(figures, false)
}

fn deny(records: &[Record]) -> (f64, String) {
    let figures = clients(records).into_iter().map(|c| {
        let (value, shown) = ratio(records, ("pglimit", "deny"), ("ceiling", "allow-random"), c);
        (value, format!("{shown}, at {}", at(c)))
    });
    worst(figures, true)
}

fn rss(meta: &HashMap<String, String>) -> (f64, String) {
    let mib = meta.get("pglimit_rss_kib").map_or(f64::NAN, |k| number(k) / 1024.0);
    if mib > 0.0 {
        (mib, format!("{mib:.1} MiB"))
    } else {
        (f64::NAN, "not measured".to_string())
    }
}

fn at_least(what: &'static str, (value, shown): (f64, String), bound: f64) -> Target {
    Target { what, value, shown, bound, at_least: true }
}

fn at_most(what: &'static str, (value, shown): (f64, String), bound: f64) -> Target {
    Target { what, value, shown, bound, at_least: false }
}

/// The throughput targets: against raw Postgres, the seed service, the fixed window.
fn throughput(records: &[Record], meta: &HashMap<String, String>) -> Vec<Target> {
    let raw = |scenario, c| ratio(records, ("pglimit", scenario), ("raw-pg", scenario), c);
    vec![
        at_least("allow path, random keys, 8 clients: ≥ 1.3 × raw Postgres", raw("allow-random", 8.0), 1.3),
        at_least("allow path, random keys, 32 clients: ≥ 2 × raw Postgres", raw("allow-random", 32.0), 2.0),
        at_least(
            "allow path, random keys: ≥ the seed service at every point of the curve",
            seed(records, meta),
            1.0,
        ),
        at_least(
            "`login`, random identities, 32 clients: ≥ 2 × the three-upsert transaction",
            raw("allow-login", 32.0),
            2.0,
        ),
        at_least(
            "each other algorithm within 20% of the fixed window's requests/s",
            algorithms(records),
            policies::ALGORITHM_FLOOR,
        ),
        at_least("hot key, 32 clients: ≥ 5 × raw Postgres", raw("allow-hot", 32.0), 5.0),
        at_least(
            "pglimit.check from SQL, one bucket: ≥ 0.8 × the single-row upsert per transaction",
            sql_check(records),
            sql::FLOOR,
        ),
    ]
}

/// The latency and cost targets.
fn costs(records: &[Record], meta: &HashMap<String, String>) -> Vec<Target> {
    vec![
        at_most("p99 at 8 clients ≤ raw's p99 (allow path, random keys)", p99(records, 8.0), 1.0),
        at_most("p99 at 32 clients ≤ raw's p99 (allow path, random keys)", p99(records, 32.0), 1.0),
        at_most(
            "service CPU per check ≤ 2 × the HTTP ceiling's (allow path, random keys)",
            cpu(records),
            2.0,
        ),
        at_least("deny flood ≥ 0.8 of the HTTP ceiling", deny(records), 0.8),
        at_most("peak RSS ≤ 64 MiB", rss(meta), 64.0),
    ]
}

/// met, or missed by the figure's distance from the bound over the bound.
fn verdict(t: &Target) -> String {
    if !t.value.is_finite() {
        return "not measured".to_string();
    }
    let met = if t.at_least { t.value >= t.bound } else { t.value <= t.bound };
    if met {
        return "met".to_string();
    }
    let by = (t.value - t.bound).abs() / t.bound;
    format!("**missed** by {:.1}%", 100.0 * by)
}

/// The targets table.
pub fn table(records: &[Record], meta: &HashMap<String, String>) -> String {
    let mut rows = vec!["| target | this run | result |".to_string(), "|---|---|---|".to_string()];
    for t in throughput(records, meta).into_iter().chain(costs(records, meta)) {
        rows.push(format!("| {} | {} | {} |", t.what, t.shown, verdict(&t)));
    }
    rows.join("\n")
}
