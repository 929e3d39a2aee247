//! One measurement's directory, as bench/run leaves it: `meta`, `kind`,
//! `statements`, `cpu`, and `pgbench.out` + `txlog.*` (pgbench) or
//! `wrk.out` + `probe.*` + `expect` (wrk, or grpc-load printing the same
//! summary).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::numbers::{not_positive, number, whole};
use crate::record::Record;
use crate::systems::{is_pglimit, RESETS_SCENARIO};
use crate::{phases, slow, targets};

/// `key=value` lines; a later key wins, lines without `=` (or starting with it) are skipped.
pub fn key_values(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| match line.find('=') {
            Some(i) if i > 0 => Some((line[..i].to_string(), line[i + 1..].to_string())),
            _ => None,
        })
        .collect()
}

/// A file of the measurement, or "" when it is missing.
fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// The measurement in DIR, its problems included; `clk_tck` turns its CPU ticks into time.
pub fn measurement(dir: &Path, clk_tck: f64) -> Record {
    let m = key_values(&read(dir, "meta"));
    let system = m.get("system").cloned().unwrap_or_else(|| "unknown".to_string());
    let mut record = match read(dir, "kind").trim() {
        "pgbench" => pgbench(dir),
        "wrk" => wrk(dir, &system),
        _ => Record::empty(vec!["did not finish".to_string()]),
    };
    record.system = system;
    record.scenario = m.get("scenario").cloned().unwrap_or_else(|| "unknown".to_string());
    record.concurrency = m.get("concurrency").map_or(f64::NAN, |c| number(c));
    if record.scenario == RESETS_SCENARIO {
        resets_alongside(dir, &mut record);
    }
    let figures = read(dir, "statements");
    let mut figures = figures.split_whitespace().map(number);
    record.statements = figures.next().unwrap_or(f64::NAN);
    let exec_ms = figures.next().unwrap_or(f64::NAN);
    let statements = record.statements;
    record.per_decision = if record.requests > 0.0 { statements / record.requests } else { f64::NAN };
    record.exec_ms_per_statement = if statements > 0.0 { exec_ms / statements } else { f64::NAN };
    let cpu = read(dir, "cpu");
    record.cpu = cpu_per_request(&cpu, record.requests, clk_tck);
    record.service_us = targets::service_us(&cpu, record.requests, clk_tck);
    record.phases = phases::read(dir);
    record.slow = slow::read(dir, record.requests);
    no_figure_missing(&mut record);
    record
}

/// Every step must have produced numbers.
fn no_figure_missing(record: &mut Record) {
    for (name, value) in [
        ("requests", record.requests),
        ("rps", record.rps),
        ("p50_us", record.p50_us),
        ("p99_us", record.p99_us),
        ("statements", record.statements),
    ] {
        if !value.is_finite() || (name != "statements" && not_positive(value)) {
            record.problems.push(format!("no {name}"));
        }
    }
}

/// The first run of `pattern` characters right after `prefix` in `text`, and what follows it.
fn after<'a>(text: &'a str, prefix: &str, pattern: fn(char) -> bool) -> Option<(&'a str, &'a str)> {
    text.match_indices(prefix).find_map(|(i, _)| {
        let rest = &text[i + prefix.len()..];
        let end = rest.find(|c: char| !pattern(c)).unwrap_or(rest.len());
        (end > 0).then(|| (&rest[..end], &rest[end..]))
    })
}

fn digits_after(text: &str, prefix: &str) -> f64 {
    after(text, prefix, |c| c.is_ascii_digit()).map_or(f64::NAN, |(n, _)| number(n))
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().clamp(1.0, sorted.len() as f64) as usize;
    sorted[rank - 1]
}

/// pgbench's summary, and its percentiles from the per-transaction logs.
fn pgbench(dir: &Path) -> Record {
    let out = read(dir, "pgbench.out");
    let mut latencies = Vec::new();
    let names = std::fs::read_dir(dir).into_iter().flatten().filter_map(Result::ok);
    let names = names.map(|e| e.file_name().to_string_lossy().into_owned());
    for name in names.filter(|n| n.starts_with("txlog")) {
        for line in read(dir, &name).split('\n') {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() >= 6 {
                latencies.push(number(fields[2]));
            }
        }
    }
    latencies.sort_by(f64::total_cmp);
    let failed = digits_after(&out, "number of failed transactions: ");
    let mut record = Record::empty(Vec::new());
    record.requests = digits_after(&out, "number of transactions actually processed: ");
    record.rps = pgbench_tps(&out);
    record.p50_us = percentile(&latencies, 50.0);
    record.p99_us = percentile(&latencies, 99.0);
    if failed > 0.0 {
        record.problems.push(format!("{failed} failed transactions"));
    }
    record
}

/// "tps = N (without initial connection time)", not the line including it.
fn pgbench_tps(out: &str) -> f64 {
    out.match_indices("tps = ")
        .find_map(|(i, _)| {
            after(&out[i..], "tps = ", |c| c.is_ascii_digit() || c == '.')
                .filter(|(_, rest)| rest.starts_with(" (without initial connection time)"))
                .map(|(n, _)| number(n))
        })
        .unwrap_or(f64::NAN)
}

/// The `WRKJSON` line that bench/check.lua (and grpc-load) print, parsed.
fn wrk_summary(out: &str) -> Option<Value> {
    out.split('\n')
        .find_map(|line| line.strip_prefix("WRKJSON "))
        .and_then(|json| serde_json::from_str(json).ok())
}

/// A field of a wrk summary, NaN when it has none.
fn field(summary: &Value, name: &str) -> f64 {
    summary.get(name).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// deny-resets: the rate of the stream of resets beside the checks, from
/// its own wrk's `resets.out`; a problem if it did not run or failed.
fn resets_alongside(dir: &Path, record: &mut Record) {
    let Some(w) = wrk_summary(&read(dir, "resets.out")) else {
        record.problems.push("no stream of resets alongside".to_string());
        return;
    };
    let failed = ["status_errors", "connect_errors", "read_errors", "timeouts"].map(|f| field(&w, f));
    let failed: f64 = failed.iter().sum();
    if failed > 0.0 {
        record.problems.push(format!("{failed} resets failed"));
    }
    record.resets_per_s = field(&w, "requests") / (field(&w, "duration_us") / 1e6);
    if not_positive(record.resets_per_s) {
        record.problems.push("no resets alongside".to_string());
    }
}

/// wrk's summary, its answers and the probe after it.
fn wrk(dir: &Path, system: &str) -> Record {
    let Some(w) = wrk_summary(&read(dir, "wrk.out")) else {
        return Record::empty(vec!["no wrk summary".to_string()]);
    };
    let requests = field(&w, "requests");
    let mut problems = Vec::new();
    let expect = read(dir, "expect").trim().to_string();
    let deny = expect == "429";
    let unexpected = if deny { requests - field(&w, "status_errors") } else { field(&w, "status_errors") };
    if unexpected > 0.01 * requests {
        let what = if deny { "2xx/3xx" } else { "4xx/5xx" };
        problems.push(format!("{unexpected} answers were {what}"));
    }
    let socket: f64 =
        ["connect_errors", "read_errors", "write_errors", "timeouts"].map(|f| field(&w, f)).iter().sum();
    if socket > 0.0 {
        problems.push(format!("{socket} socket errors or timeouts"));
    }
    probe(dir, system, &expect, &mut problems);
    let mut record = Record::empty(problems);
    record.requests = requests;
    record.rps = requests / (field(&w, "duration_us") / 1e6);
    record.p50_us = field(&w, "lat_p50_us");
    record.p99_us = field(&w, "lat_p99_us");
    record.mean_us = field(&w, "lat_mean_us");
    record.status_errors = field(&w, "status_errors");
    record
}

/// The check after the run must have answered EXPECT, and pglimit's must
/// have been decided by Postgres and matched no override (pglimit-actions'
/// overrides are there to be tried, not to apply).
fn probe(dir: &Path, system: &str, expect: &str, problems: &mut Vec<String>) {
    let status = read(dir, "probe.status").trim().to_string();
    if status != expect {
        let answered = if status.is_empty() { "nothing" } else { &status };
        problems.push(format!("probe answered {answered}, expected {expect}"));
    }
    let body = read(dir, "probe.body");
    if is_pglimit(system) && !body.contains(r#""store":"postgres""#) {
        problems.push("probe not decided by Postgres".to_string());
    }
    if is_pglimit(system) && body.contains(r#""override":"#) {
        problems.push("an override matched the probe".to_string());
    }
}

/// "service · Postgres · rest" in µs of CPU per request, and the machine's
/// idle share, from the tick counts bench/run sampled around the run.
fn cpu_per_request(text: &str, requests: f64, clk_tck: f64) -> String {
    let ticks: Vec<f64> = text.split_whitespace().map(number).collect();
    let get = |i: usize| ticks.get(i).copied().unwrap_or(f64::NAN);
    let (server, pg, busy, idle) = (get(0), get(1), get(2), get(3));
    if ![server, pg, busy, idle].iter().all(|t| t.is_finite()) || not_positive(requests) {
        return String::new();
    }
    let us = |ticks: f64| whole((ticks * 1e6) / clk_tck / requests);
    let idle_share = whole((100.0 * idle) / (busy + idle));
    format!("{} · {} · {}; {idle_share}% idle", us(server), us(pg), us(busy - server - pg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percentile_is_the_nearest_rank() {
        let sorted: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50.0), 100.0);
        assert_eq!(percentile(&sorted, 99.0), 198.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn pgbench_tps_is_read_from_the_line_without_connection_time() {
        let out =
            "tps = 900.5 (including reconnection times)\ntps = 1234.5 (without initial connection time)";
        assert_eq!(pgbench_tps(out), 1234.5);
        assert!(pgbench_tps("tps = 900.5 (including reconnection times)").is_nan());
    }

    #[test]
    fn cpu_per_request_splits_service_postgres_and_the_rest() {
        // 100 ticks a second; 1,000 requests: 1 tick is 10 µs per request.
        assert_eq!(cpu_per_request("5 10 40 60", 1000.0, 100.0), "50 · 100 · 250; 60% idle");
        // Busy a tick short of the two: noise, shown as none.
        assert_eq!(cpu_per_request("500 1000 1499 500", 1e6, 100.0), "5 · 10 · 0; 25% idle");
        assert_eq!(cpu_per_request("5 10", 1000.0, 100.0), "");
        assert_eq!(cpu_per_request("5 10 40 60", 0.0, 100.0), "");
    }

    #[test]
    fn key_values_skip_lines_without_a_key() {
        let kv = key_values("a=1\n=2\nno equals\nb=x=y\na=3");
        assert_eq!(kv.get("a").map(String::as_str), Some("3"));
        assert_eq!(kv.get("b").map(String::as_str), Some("x=y"));
        assert_eq!(kv.len(), 2);
    }
}
