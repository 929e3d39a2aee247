//! The report of `bench/run`: turns its measurements into one Markdown table.
//!
//! `bench-report RESULTS_DIR META_FILE OUT.md`
//!
//! RESULTS_DIR holds one directory per measurement (`meta`, `kind`,
//! `statements`, and `pgbench.out` + `txlog.*` or `wrk.out` + `probe.*` +
//! `cpu`); META_FILE holds `key=value` lines about the run (machine, versions,
//! command). Prints the report, writes it to OUT.md, and exits 1 if a
//! measurement produced no numbers or answered with the wrong status, if a
//! system or one of pglimit's comparison runs is missing, if /metrics did
//! not answer as the metrics setting says, or if pglimit-actions did not have
//! its blocks and overrides (or pglimit had some) (nothing is asserted about
//! speed); 2 on a usage error.
//!
//! Under the table, the deny path against the HTTP ceiling: pglimit's
//! requests/s as a fraction of the ceiling's at each client count, with
//! metrics on and off and (with BENCH_BASELINE) at the baseline revision, so
//! that a fall of that fraction can be read off directly. Then blocks and
//! overrides: pglimit-actions' requests/s over pglimit's, scenario by
//! scenario (issue 12's budget; information only, never a failure). Then
//! behind a proxy: the `bench` policy through forward-auth and Envoy's gRPC
//! protocol against `/check`'s policy form, requests/s and p99 (proxies.rs).
//! Then issue 16's: policies and algorithms (policies.rs), the concurrency
//! curve, whose chart data it writes to the meta's `curve_tsv` (curve.rs),
//! and the targets (targets.rs). Where a check's time goes (phases.rs) and,
//! with `BENCH_SLOW=1`, the slowest checks' own phases (slow.rs) come
//! before the curve.

// Modules of their own, so that this file does not grow further.
mod curve;
mod phases;
mod policies;
mod pooler;
mod proxies;
mod slow;
mod targets;

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

const NAN: f64 = f64::NAN;

/// How far pglimit's deny-path fraction of the HTTP ceiling may fall against
/// metrics off or the baseline before the report marks it (the budget of the
/// metrics change: "must not fall by more than 5%").
const DENY_BUDGET_PERCENT: f64 = 5.0;

/// How much slower pglimit may be with blocks and overrides configured (none
/// matching) than without, before the report marks it (issue 12: "costs no
/// more than 5%"). Information only: it never fails the run.
const ACTIONS_BUDGET_PERCENT: f64 = 5.0;

/// The scenarios pglimit-actions is measured in, each against pglimit's.
const ACTIONS_SCENARIOS: [&str; 3] = ["allow-random", "allow-policy", "deny"];

/// pglimit, at any revision or setting: its probes must be decided by Postgres.
fn is_pglimit(system: &str) -> bool {
    matches!(system, "pglimit" | "pglimit-nometrics" | "pglimit-actions" | "baseline")
        || pooler::SYSTEMS.contains(&system)
}

const SCENARIOS: [(&str, &str); 15] = [
    ("allow-random", "allow, random keys (10,000)"),
    ("allow-hot", "allow, one hot key"),
    ("allow-policy", "allow, policy form (2 buckets)"),
    // The policy form's policy and identifiers behind a proxy (pglimit only).
    ("allow-auth", "allow, forward-auth `GET /auth/bench` (2 buckets)"),
    ("allow-grpc", "allow, gRPC `ShouldRateLimit` (2 buckets)"),
    // Issue 16's (pglimit, its twins, and raw Postgres' login transaction).
    ("allow-login", "allow, `login` policy (3 buckets), random identities"),
    ("allow-contact", "allow, `contact_confirmation` policy, random recipients"),
    ("mixed", "mixed: login, contact, one-off keys over 4 algorithms, hot keys"),
    ("allow-sliding_window", "allow, random keys (10,000), sliding window"),
    ("allow-sliding_log", "allow, random keys (10,000), sliding log"),
    ("allow-token_bucket", "allow, random keys (10,000), token bucket"),
    // Points of the concurrency curve off the table's client counts (curve.rs).
    ("curve", "allow, random keys (10,000), curve point"),
    ("deny", "deny, 100 keys over limit"),
    ("deny-inmemory-block", "deny, `inMemoryBlockOnConsumed`"),
    // Issue 26: pglimit and the baseline only (bench/scenarios.sh).
    (RESETS_SCENARIO, "deny, 10,000 remembered keys, during a stream of resets"),
];

/// The deny path while one client resets other keys (bench/scenarios.sh's
/// run_deny_resets), whose rate the check column gives.
const RESETS_SCENARIO: &str = "deny-resets";
const SYSTEMS: [(&str, &str); 11] = [
    ("raw-pg", "raw Postgres (pgbench upsert)"),
    ("ceiling", "HTTP ceiling (axum, no store)"),
    ("pglimit", "**pglimit**"),
    // The same binary with PGLIMIT_METRICS=false, measured right after pglimit.
    ("pglimit-nometrics", "pglimit, metrics off"),
    // The same binary with overrides and blocks that never apply, measured
    // right after pglimit-nometrics, in ACTIONS_SCENARIOS only.
    ("pglimit-actions", "pglimit, blocks and overrides"),
    // Behind PgBouncer, in allow-random, allow-login and deny (pooler.rs).
    ("pglimit-session", "pglimit behind PgBouncer (session)"),
    ("pglimit-transaction", "pglimit behind PgBouncer (transaction)"),
    // Only with BENCH_BASELINE; its label names the revision (see `table`).
    ("baseline", "pglimit (baseline)"),
    ("rlflex", "rate-limiter-flexible (Node, pg)"),
    ("runlimit", "runlimit-postgres (Rust, sqlx)"),
    ("seed", "seed service (axum + SQLx, one upsert)"),
];

/// A scenario's label in the tables.
fn scenario_label(id: &str) -> &str {
    SCENARIOS.iter().find(|(k, _)| *k == id).map_or(id, |(_, v)| v)
}

struct Record {
    system: String,
    scenario: String,
    concurrency: f64,
    requests: f64,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    /// wrk's mean latency.
    mean_us: f64,
    /// pglimit's phases, from its `/metrics`.
    phases: Option<phases::Phases>,
    /// pglimit's slowest checks, from its slow-check log (`BENCH_SLOW=1`).
    slow: Option<slow::Slowest>,
    /// Answers other than 2xx/3xx, as wrk counts them.
    status_errors: f64,
    /// CPU µs per request of the server process.
    service_us: f64,
    statements: f64,
    per_decision: f64,
    exec_ms_per_statement: f64,
    cpu: String,
    /// deny-resets: the resets per second of the stream beside the checks.
    resets_per_s: f64,
    problems: Vec<String>,
}

/// `key=value` lines; a later key wins, lines without `=` (or starting with it) are skipped.
fn key_values(text: &str) -> HashMap<String, String> {
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

/// A number as JavaScript's Number() reads one: blank is 0, anything else unparsable NaN.
fn number(text: &str) -> f64 {
    let text = text.trim();
    if text.is_empty() {
        0.0
    } else {
        text.parse().unwrap_or(NAN)
    }
}

/// Not a positive number (NaN included).
fn not_positive(x: f64) -> bool {
    x.is_nan() || x <= 0.0
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
    after(text, prefix, |c| c.is_ascii_digit()).map_or(NAN, |(n, _)| number(n))
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().clamp(1.0, sorted.len() as f64) as usize;
    sorted[rank - 1]
}

fn record(problems: Vec<String>) -> Record {
    Record {
        system: String::new(),
        scenario: String::new(),
        concurrency: NAN,
        requests: NAN,
        rps: NAN,
        p50_us: NAN,
        p99_us: NAN,
        mean_us: NAN,
        phases: None,
        slow: None,
        status_errors: NAN,
        service_us: NAN,
        statements: NAN,
        per_decision: NAN,
        exec_ms_per_statement: NAN,
        cpu: String::new(),
        resets_per_s: NAN,
        problems,
    }
}

fn pgbench_record(dir: &Path) -> Record {
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
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    let failed = digits_after(&out, "number of failed transactions: ");
    // "tps = N (without initial connection time)", not the line including it.
    let rps = out
        .match_indices("tps = ")
        .find_map(|(i, _)| {
            after(&out[i..], "tps = ", |c| c.is_ascii_digit() || c == '.')
                .filter(|(_, rest)| rest.starts_with(" (without initial connection time)"))
                .map(|(n, _)| number(n))
        })
        .unwrap_or(NAN);
    let mut record = record(Vec::new());
    record.requests = digits_after(&out, "number of transactions actually processed: ");
    record.rps = rps;
    record.p50_us = percentile(&latencies, 50.0);
    record.p99_us = percentile(&latencies, 99.0);
    if failed.is_finite() && failed > 0.0 {
        record.problems.push(format!("{} failed transactions", js_number(failed)));
    }
    record
}

/// The `WRKJSON` line that bench/check.lua (and grpc-load) print, parsed.
fn wrk_summary(out: &str) -> Option<serde_json::Value> {
    out.split('\n')
        .find_map(|line| line.strip_prefix("WRKJSON "))
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
}

/// deny-resets: the rate of the stream of resets beside the checks, from
/// its own wrk's `resets.out`; a problem if it did not run or failed.
fn resets_alongside(dir: &Path, record: &mut Record) {
    let Some(w) = wrk_summary(&read(dir, "resets.out")) else {
        record.problems.push("no stream of resets alongside".to_string());
        return;
    };
    let field = |name: &str| w.get(name).and_then(serde_json::Value::as_f64).unwrap_or(NAN);
    let failed = field("status_errors") + field("connect_errors") + field("read_errors") + field("timeouts");
    if failed > 0.0 {
        record.problems.push(format!("{} resets failed", js_number(failed)));
    }
    record.resets_per_s = field("requests") / (field("duration_us") / 1e6);
    if not_positive(record.resets_per_s) {
        record.problems.push("no resets alongside".to_string());
    }
}

fn wrk_record(dir: &Path, system: &str) -> Record {
    let Some(w) = wrk_summary(&read(dir, "wrk.out")) else {
        return record(vec!["no wrk summary".to_string()]);
    };
    let field = |name: &str| w.get(name).and_then(serde_json::Value::as_f64).unwrap_or(NAN);
    let requests = field("requests");
    let mut problems = Vec::new();
    let expect = read(dir, "expect").trim().to_string();
    let deny = expect == "429";
    let unexpected = if deny { requests - field("status_errors") } else { field("status_errors") };
    if unexpected > 0.01 * requests {
        let what = if deny { "2xx/3xx" } else { "4xx/5xx" };
        problems.push(format!("{} answers were {what}", js_number(unexpected)));
    }
    let socket = field("connect_errors") + field("read_errors") + field("write_errors") + field("timeouts");
    if socket > 0.0 {
        problems.push(format!("{} socket errors or timeouts", js_number(socket)));
    }
    let probe = read(dir, "probe.status").trim().to_string();
    if probe != expect {
        let answered = if probe.is_empty() { "nothing" } else { &probe };
        problems.push(format!("probe answered {answered}, expected {expect}"));
    }
    let probe_body = read(dir, "probe.body");
    if is_pglimit(system) && !probe_body.contains(r#""store":"postgres""#) {
        problems.push("probe not decided by Postgres".to_string());
    }
    // The bench's identifiers must match no override (pglimit-actions'
    // overrides are there to be tried, not to apply).
    if is_pglimit(system) && probe_body.contains(r#""override":"#) {
        problems.push("an override matched the probe".to_string());
    }
    let mut record = record(problems);
    record.requests = requests;
    record.rps = requests / (field("duration_us") / 1e6);
    record.p50_us = field("lat_p50_us");
    record.p99_us = field("lat_p99_us");
    record.mean_us = field("lat_mean_us");
    record.status_errors = field("status_errors");
    record
}

/// "service · Postgres · rest" in µs of CPU per request, and the machine's
/// idle share, from the tick counts bench/run sampled around the run.
fn cpu_per_request(text: &str, requests: f64, clk_tck: f64) -> String {
    let ticks: Vec<f64> = text.split_whitespace().map(number).collect();
    let get = |i: usize| ticks.get(i).copied().unwrap_or(NAN);
    let (server, pg, busy, idle) = (get(0), get(1), get(2), get(3));
    if ![server, pg, busy, idle].iter().all(|t| t.is_finite()) || not_positive(requests) {
        return String::new();
    }
    let us = |ticks: f64| js_number(js_round((ticks * 1e6) / clk_tck / requests));
    let idle_share = js_number(js_round((100.0 * idle) / (busy + idle)));
    format!("{} · {} · {}; {idle_share}% idle", us(server), us(pg), us(busy - server - pg))
}

// --- numbers as the report prints them -------------------------------------

/// Rounds half up (towards +∞), as the report always has.
fn js_round(x: f64) -> f64 {
    let floor = x.floor();
    if x - floor >= 0.5 {
        floor + 1.0
    } else {
        floor
    }
}

/// A number printed plainly: integers without a fraction, "NaN" when it is not one.
fn js_number(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        format!("{}", x + 0.0) // + 0.0: no "-0"
    }
}

/// `digits` decimals, an exact tie rounded away from zero (Rust's formatting
/// rounds it to even: 1.125 would print as 1.12, not 1.13).
fn fixed(x: f64, digits: usize) -> String {
    if !x.is_finite() {
        return js_number(x);
    }
    const EXTRA: usize = 40;
    let wide = format!("{:.*}", digits + EXTRA, x.abs());
    let (head, tail) = wide.split_at(wide.len() - EXTRA);
    let head = head.strip_suffix('.').unwrap_or(head);
    let tie = tail.starts_with('5') && tail[1..].bytes().all(|b| b == b'0');
    let text = if tie { increment_last_digit(head) } else { format!("{:.*}", digits, x.abs()) };
    if x < 0.0 {
        format!("-{text}")
    } else {
        text
    }
}

fn increment_last_digit(decimal: &str) -> String {
    let mut bytes = decimal.as_bytes().to_vec();
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            b'.' => continue,
            b'9' => bytes[i] = b'0',
            _ => {
                bytes[i] += 1;
                return String::from_utf8(bytes).expect("ASCII");
            }
        }
    }
    format!("1{}", String::from_utf8(bytes).expect("ASCII"))
}

/// Rounded, with thousands separators: 12,345.
fn int(x: f64) -> String {
    if !x.is_finite() {
        return String::new();
    }
    let rounded = js_round(x) + 0.0;
    let digits = format!("{:.0}", rounded.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if rounded < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

fn ms(us: f64) -> String {
    if us.is_finite() {
        fixed(us / 1000.0, 2)
    } else {
        String::new()
    }
}

fn mib(kib: Option<&String>) -> String {
    let kib = kib.map_or(NAN, |k| number(k));
    if kib > 0.0 {
        format!("{} MiB", fixed(kib / 1024.0, 1))
    } else {
        "unknown".to_string()
    }
}

// --- the report --------------------------------------------------------------

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [results_dir, meta_file, out_file] = args.as_slice() else {
        eprintln!("usage: bench-report RESULTS_DIR META_FILE OUT.md");
        return ExitCode::from(2);
    };
    let meta = match std::fs::read_to_string(meta_file) {
        Ok(text) => key_values(&text),
        Err(e) => {
            eprintln!("bench/run: cannot read {meta_file}: {e}");
            return ExitCode::from(2);
        }
    };
    let clk_tck = meta.get("clk_tck").filter(|v| !v.is_empty()).map_or(100.0, |v| number(v));
    let mut records = match collect(Path::new(results_dir), clk_tck) {
        Ok(records) => records,
        Err(e) => {
            eprintln!("bench/run: cannot read {results_dir}: {e}");
            return ExitCode::from(2);
        }
    };
    check_metrics_endpoints(&mut records, &meta);
    check_actions_setup(&mut records, &meta);
    let report = render(&records, &meta);
    if let Err(e) = std::fs::write(out_file, &report) {
        eprintln!("bench/run: cannot write {out_file}: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = curve::write_data(&records, &meta) {
        eprintln!("bench/run: cannot write the curve's data: {e}");
        return ExitCode::FAILURE;
    }
    print!("{report}");
    let failed = records.iter().filter(|r| !r.problems.is_empty()).count();
    let missing = missing(&records, &meta);
    if !missing.is_empty() {
        eprintln!("bench/run: missing measurements: {}", missing.join(", "));
    }
    if failed > 0 {
        eprintln!("bench/run: {failed} measurement(s) with problems (see the check column)");
    }
    if failed > 0 || !missing.is_empty() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// What the run should have measured and did not: a system without a single
/// measurement (the baseline only when the meta names one), or a scenario
/// and client count of pglimit's without its metrics-off (or baseline) twin,
/// or (in ACTIONS_SCENARIOS) without its pglimit-actions twin, or a client
/// count of pglimit's policy form without its proxy scenarios.
fn missing(records: &[Record], meta: &HashMap<String, String>) -> Vec<String> {
    let with_baseline = meta.get("baseline").is_some_and(|b| !b.is_empty());
    let has = |system: &str| records.iter().any(|r| r.system == system);
    let mut missing: Vec<String> = SYSTEMS
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| (*id != "baseline" || with_baseline) && !has(id))
        .map(str::to_string)
        .collect();
    missing.extend(proxies::missing(records));
    missing.extend(pooler::missing(records));
    missing.extend(policies::missing(records));
    missing.extend(curve::missing(records, meta));
    let twins =
        if with_baseline { &["pglimit-nometrics", "baseline"][..] } else { &["pglimit-nometrics"][..] };
    // The proxy scenarios are pglimit's alone: no twin is measured for them.
    let checks = records.iter().filter(|r| !proxies::SCENARIOS.contains(&r.scenario.as_str()));
    for r in checks.filter(|r| r.system == "pglimit") {
        let actions = ACTIONS_SCENARIOS.contains(&r.scenario.as_str()).then_some("pglimit-actions");
        let twins = twins.iter().copied().filter(|twin| policies::twin_measures(twin, &r.scenario));
        for twin in twins.chain(actions) {
            let found = records
                .iter()
                .any(|t| t.system == *twin && t.scenario == r.scenario && t.concurrency == r.concurrency);
            if !found && has(twin) {
                missing.push(format!("{twin} {} c={}", r.scenario, js_number(r.concurrency)));
            }
        }
    }
    missing
}

/// bench/run asks each pglimit instance for /metrics before stopping it: 200
/// with metrics on (pglimit), 404 with PGLIMIT_METRICS=false; anything else
/// means the setting did not take, and every measurement of that instance is
/// marked. A meta without the status (an older run) is not checked.
fn check_metrics_endpoints(records: &mut [Record], meta: &HashMap<String, String>) {
    for (system, key, expected) in [
        ("pglimit", "pglimit_metrics_status", "200"),
        ("pglimit-nometrics", "nometrics_metrics_status", "404"),
        ("pglimit-actions", "actions_metrics_status", "200"),
    ] {
        let Some(status) = meta.get(key).map(|s| s.trim()) else { continue };
        if status == expected {
            continue;
        }
        let answered = if status.is_empty() { "nothing" } else { status };
        for r in records.iter_mut().filter(|r| r.system == system) {
            r.problems.push(format!("/metrics answered {answered}, expected {expected}"));
        }
    }
}

/// bench/run counts each instance's active blocks and sends it a check that
/// the deny-list override of bench/policies-actions.toml matches, before
/// stopping it: pglimit must have no blocks and answer "200 none" (no
/// override loaded), pglimit-actions must have its blocks (as many as
/// `actions_blocks_expected`) and answer "429 deny". Otherwise the two did not
/// differ only in blocks and overrides, and every measurement of the one at
/// fault is marked. A meta without these keys (an older run) is not checked.
fn check_actions_setup(records: &mut [Record], meta: &HashMap<String, String>) {
    let get = |key: &str| meta.get(key).map(|s| s.trim().to_string());
    let expected_blocks = get("actions_blocks_expected").unwrap_or_default();
    for (system, key, expected, what) in [
        ("pglimit", "pglimit_blocks", "0".to_string(), "active blocks"),
        ("pglimit", "pglimit_override_probe", "200 none".to_string(), "the override probe answered"),
        ("pglimit-actions", "actions_blocks", expected_blocks, "active blocks"),
        ("pglimit-actions", "actions_override_probe", "429 deny".to_string(), "the override probe answered"),
    ] {
        let Some(found) = get(key) else { continue };
        if found == expected {
            continue;
        }
        let found = if found.is_empty() { "nothing".to_string() } else { found };
        for r in records.iter_mut().filter(|r| r.system == system) {
            r.problems.push(format!("{what}: {found}, expected {expected}"));
        }
    }
}

fn collect(results_dir: &Path, clk_tck: f64) -> std::io::Result<Vec<Record>> {
    let mut names: Vec<String> = std::fs::read_dir(results_dir)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let mut records = Vec::new();
    for name in names {
        let dir = results_dir.join(name);
        let m = key_values(&read(&dir, "meta"));
        let system = m.get("system").cloned().unwrap_or_else(|| "undefined".to_string());
        let mut record = match read(&dir, "kind").trim() {
            "pgbench" => pgbench_record(&dir),
            "wrk" => wrk_record(&dir, &system),
            _ => record(vec!["did not finish".to_string()]),
        };
        record.system = system;
        record.scenario = m.get("scenario").cloned().unwrap_or_else(|| "undefined".to_string());
        record.concurrency = m.get("concurrency").map_or(NAN, |c| number(c));
        if record.scenario == RESETS_SCENARIO {
            resets_alongside(&dir, &mut record);
        }
        let figures = read(&dir, "statements");
        let mut figures = figures.split_whitespace().map(number);
        let statements = figures.next().unwrap_or(NAN);
        let exec_ms = figures.next().unwrap_or(NAN);
        record.statements = statements;
        record.per_decision = if record.requests > 0.0 { statements / record.requests } else { NAN };
        record.exec_ms_per_statement = if statements > 0.0 { exec_ms / statements } else { NAN };
        record.cpu = cpu_per_request(&read(&dir, "cpu"), record.requests, clk_tck);
        record.service_us = targets::service_us(&read(&dir, "cpu"), record.requests, clk_tck);
        record.phases = phases::read(&dir);
        record.slow = slow::read(&dir, record.requests);
        // Every step must have produced numbers.
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
        records.push(record);
    }
    let scenario_order = |s: &str| SCENARIOS.iter().position(|(id, _)| *id == s).map_or(-1, |i| i as i64);
    let system_order = |s: &str| SYSTEMS.iter().position(|(id, _)| *id == s).map_or(-1, |i| i as i64);
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

/// The table; with `baseline` (the short revision of BENCH_BASELINE), a
/// "× baseline" column and the baseline's rows named after it; with
/// `metrics_off` (pglimit-nometrics was measured), a "× metrics off" column.
fn table(records: &[Record], baseline: Option<&str>, metrics_off: bool) -> String {
    let find = |system: &str, scenario: &str, concurrency: f64| {
        records.iter().find(|r| r.system == system && r.scenario == scenario && r.concurrency == concurrency)
    };
    let ratio = |a: &Record, b: Option<&Record>| match b {
        Some(b) if a.rps > 0.0 && b.rps > 0.0 => fixed(a.rps / b.rps, 2),
        _ => String::new(),
    };
    let name = |names: &[(&str, &'static str)], id: &str| {
        names.iter().find(|(k, _)| *k == id).map_or_else(|| id.to_string(), |(_, v)| v.to_string())
    };
    // After "Postgres ms / statement": "× metrics off", only in a run that measured
    // pglimit-nometrics, then "× baseline", only in a run with a baseline.
    let (metrics_off_head, metrics_off_rule) =
        if metrics_off { ("| × metrics off ", "---:|") } else { ("", "") };
    let (baseline_head, baseline_rule) =
        if baseline.is_some() { ("| × baseline ", "---:|") } else { ("", "") };
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
    for r in records.iter().filter(|r| r.scenario != curve::SCENARIO) {
        let (system, scenario, conc) = (r.system.as_str(), r.scenario.as_str(), r.concurrency);
        let http = is_pglimit(system) || matches!(system, "rlflex" | "runlimit" | "seed");
        let raw_shape = matches!(scenario, "allow-random" | "allow-hot" | "allow-login");
        let vs_raw = if http && raw_shape { ratio(r, find("raw-pg", scenario, conc)) } else { String::new() };
        // The ceiling speaks HTTP/1.1 and JSON, not gRPC.
        let vs_ceiling = if http && scenario != "allow-grpc" {
            ratio(r, find("ceiling", "allow-random", conc))
        } else {
            String::new()
        };
        let mut vs_peer = String::new();
        let mut vs_runlimit = String::new();
        let mut vs_seed = String::new();
        let mut vs_metrics_off = String::new();
        let mut vs_baseline = String::new();
        if system == "pglimit" {
            vs_metrics_off = ratio(r, find("pglimit-nometrics", scenario, conc));
            vs_baseline = ratio(r, find("baseline", scenario, conc));
            vs_runlimit = ratio(r, find("runlimit", scenario, conc));
            vs_seed = ratio(r, find("seed", scenario, conc));
            vs_peer = ratio(r, find("rlflex", scenario, conc));
            if scenario == "deny" {
                let block = ratio(r, find("rlflex", "deny-inmemory-block", conc));
                if !block.is_empty() {
                    write!(vs_peer, " ({block} vs block)").expect("a String");
                }
            }
        }
        let per_decision = if system == "ceiling" {
            js_number(r.statements)
        } else if r.per_decision.is_finite() {
            fixed(r.per_decision, 3)
        } else {
            String::new()
        };
        let exec = if r.exec_ms_per_statement.is_finite() {
            fixed(r.exec_ms_per_statement, 3)
        } else {
            String::new()
        };
        let mut check = if r.problems.is_empty() { "ok".to_string() } else { r.problems.join("; ") };
        if r.resets_per_s.is_finite() {
            write!(check, " ({} resets/s alongside)", int(r.resets_per_s)).expect("a String");
        }
        let label = match baseline {
            Some(rev) if system == "baseline" => format!("pglimit at {rev} (baseline)"),
            _ => name(&SYSTEMS, system),
        };
        let vs_metrics_off = if metrics_off { format!("{vs_metrics_off} | ") } else { String::new() };
        let vs_baseline = if baseline.is_some() { format!("{vs_baseline} | ") } else { String::new() };
        rows.push(format!(
            "| {label} | {} | {} | {} | {} | {} | {per_decision} | {exec} | {vs_metrics_off}{vs_baseline}{vs_raw} \
             | {vs_ceiling} \
             | {vs_peer} | {vs_runlimit} | {vs_seed} | {} | {check} |",
            name(&SCENARIOS, scenario),
            js_number(conc),
            int(r.rps),
            ms(r.p50_us),
            ms(r.p99_us),
            r.cpu,
        ));
    }
    rows.join("\n")
}

/// A table of pglimit's records that have a `part` (their slow checks,
/// their phases): the `head` lines, then `row` of each such record; none if
/// no record has one.
fn pglimit_table<'a, T: 'a>(
    records: &'a [Record],
    head: &str,
    part: impl Fn(&'a Record) -> Option<&'a T>,
    row: impl Fn(&Record, &T) -> String,
) -> Option<String> {
    let rows: Vec<String> =
        records.iter().filter(|r| r.system == "pglimit").filter_map(|r| Some(row(r, part(r)?))).collect();
    (!rows.is_empty()).then(|| format!("{head}\n{}", rows.join("\n")))
}

/// The deny path against the HTTP ceiling, one row per client count at which
/// pglimit's deny path was measured: the ceiling's requests/s, then pglimit's
/// requests/s over it with metrics on, with metrics off and (with `baseline`)
/// at the baseline revision, and pglimit's fraction against each of the other
/// two as a change in percent, marked when it falls by more than the budget.
/// None when pglimit's deny path was not measured.
fn deny_vs_ceiling(records: &[Record], baseline: Option<&str>) -> Option<String> {
    let find = |system: &str, scenario: &str, concurrency: f64| {
        records.iter().find(|r| r.system == system && r.scenario == scenario && r.concurrency == concurrency)
    };
    // requests/s over the ceiling's; NaN when either is missing or not positive.
    let fraction = |r: Option<&Record>, ceiling: Option<&Record>| match (r, ceiling) {
        (Some(r), Some(c)) if r.rps > 0.0 && c.rps > 0.0 => r.rps / c.rps,
        _ => NAN,
    };
    let shown = |x: f64| if x.is_finite() { fixed(x, 3) } else { String::new() };
    let change = |now: f64, then: f64| {
        if !(now.is_finite() && then.is_finite() && then > 0.0) {
            return String::new();
        }
        let percent = 100.0 * (now / then - 1.0);
        let sign = if percent >= 0.0 { "+" } else { "" };
        let text = format!("{sign}{}%", fixed(percent, 1));
        if percent < -DENY_BUDGET_PERCENT {
            format!("**{text}** (over {}%)", js_number(DENY_BUDGET_PERCENT))
        } else {
            text
        }
    };
    let mut clients: Vec<f64> = records
        .iter()
        .filter(|r| r.system == "pglimit" && r.scenario == "deny")
        .map(|r| r.concurrency)
        .collect();
    if clients.is_empty() {
        return None;
    }
    clients.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    clients.dedup();
    let (baseline_head, baseline_rule) = match baseline {
        Some(rev) => {
            (format!(" pglimit at {rev} (baseline) × ceiling | pglimit vs baseline |"), "---:|---:|")
        }
        None => (String::new(), ""),
    };
    let mut rows = vec![
        format!(
            "| clients | HTTP ceiling requests/s | **pglimit** × ceiling | pglimit, metrics off × ceiling \
             | pglimit vs metrics off |{baseline_head}"
        ),
        format!("|---:|---:|---:|---:|---:|{baseline_rule}"),
    ];
    for conc in clients {
        let ceiling = find("ceiling", "allow-random", conc);
        let pglimit = fraction(find("pglimit", "deny", conc), ceiling);
        let off = fraction(find("pglimit-nometrics", "deny", conc), ceiling);
        let mut row = format!(
            "| {} | {} | {} | {} | {} |",
            js_number(conc),
            ceiling.map_or_else(String::new, |c| int(c.rps)),
            shown(pglimit),
            shown(off),
            change(pglimit, off)
        );
        if baseline.is_some() {
            let base = fraction(find("baseline", "deny", conc), ceiling);
            write!(row, " {} | {} |", shown(base), change(pglimit, base)).expect("a String");
        }
        rows.push(row);
    }
    Some(rows.join("\n"))
}

/// Blocks and overrides against none: one row per scenario of
/// ACTIONS_SCENARIOS and client count at which pglimit was measured, with
/// pglimit's and pglimit-actions' requests/s, the second over the first ("×
/// without blocks and overrides") and that as a change in percent, marked
/// when it falls by more than ACTIONS_BUDGET_PERCENT. None when
/// pglimit-actions was not measured.
fn actions_vs_plain(records: &[Record]) -> Option<String> {
    let find = |system: &str, scenario: &str, concurrency: f64| {
        records.iter().find(|r| r.system == system && r.scenario == scenario && r.concurrency == concurrency)
    };
    if !records.iter().any(|r| r.system == "pglimit-actions") {
        return None;
    }
    let mut rows = vec![
        "| scenario | clients | **pglimit** requests/s | pglimit, blocks and overrides requests/s \
         | × without blocks and overrides | change |"
            .to_string(),
        "|---|---:|---:|---:|---:|---:|".to_string(),
    ];
    // In the main table's order: by scenario, then by client count.
    for r in
        records.iter().filter(|r| r.system == "pglimit" && ACTIONS_SCENARIOS.contains(&r.scenario.as_str()))
    {
        let actions = find("pglimit-actions", &r.scenario, r.concurrency);
        let rps = |r: Option<&Record>| r.map_or_else(String::new, |r| int(r.rps));
        let (times, change) = match actions {
            Some(a) if a.rps > 0.0 && r.rps > 0.0 => {
                let times = a.rps / r.rps;
                let percent = 100.0 * (times - 1.0);
                let sign = if percent >= 0.0 { "+" } else { "" };
                let text = format!("{sign}{}%", fixed(percent, 1));
                let change = if percent < -ACTIONS_BUDGET_PERCENT {
                    format!("**{text}** (over {}%)", js_number(ACTIONS_BUDGET_PERCENT))
                } else {
                    text
                };
                (fixed(times, 3), change)
            }
            _ => (String::new(), String::new()),
        };
        rows.push(format!(
            "| {} | {} | {} | {} | {times} | {change} |",
            SCENARIOS.iter().find(|(id, _)| *id == r.scenario).map_or(r.scenario.as_str(), |(_, v)| v),
            js_number(r.concurrency),
            rps(Some(r)),
            rps(actions),
        ));
    }
    Some(rows.join("\n"))
}

fn render(records: &[Record], meta: &HashMap<String, String>) -> String {
    let undefined = "undefined".to_string();
    let m = |key: &str| meta.get(key).unwrap_or(&undefined).as_str();
    let smoke = if m("smoke") == "1" { " (smoke run: too short to quote)" } else { "" };
    let warnings = meta.get("pglimit_warnings").filter(|w| !w.is_empty()).map_or("0", |w| w.as_str());
    // BENCH_BASELINE's revision: from the meta, or unnamed when only its measurements are there.
    let baseline = meta.get("baseline").map(String::as_str).filter(|b| !b.is_empty());
    let baseline =
        baseline.or_else(|| records.iter().any(|r| r.system == "baseline").then_some("an unknown revision"));
    let metrics_off = records.iter().any(|r| r.system == "pglimit-nometrics");
    // What /metrics answered before each instance stopped, as bench/run recorded it.
    let metrics_status =
        |key: &str| meta.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()).map_or("not recorded", |s| s);
    let mut lines = vec![
        format!("# pglimit throughput, {}{smoke}", m("date")),
        String::new(),
        format!(
            "- Command: `{}` ({} s per measurement after {} s of warm-up; wrk and pgbench with {} threads)",
            m("command"),
            m("seconds"),
            m("warmup"),
            m("threads")
        ),
        format!(
            "- Machine: {} CPUs, {}, {}; {}, {}",
            m("nproc"),
            m("cpu"),
            m("memory"),
            m("os"),
            m("kernel")
        ),
        format!(
            "- PostgreSQL {}: throwaway cluster on 127.0.0.1, fsync on, synchronous_commit on, \
             logged tables, otherwise default settings",
            m("postgres")
        ),
        format!(
            "- pglimit {}, {}, release build, default settings (4 connections, one call \
             in flight, the rest spares for stalls; cleanup rate 0.01)",
            m("commit"),
            m("rustc")
        ),
    ];
    if metrics_off {
        lines.push(format!(
            "- pglimit, metrics off: the same binary with `PGLIMIT_METRICS=false` (no metrics recorder: every \
             metrics call a no-op), otherwise the same settings, its migrations in a database of its own \
             (`nometrics`), the deny keys prefilled as for pglimit; measured right after pglimit. \
             /metrics answered {} with metrics on, {} with metrics off",
            metrics_status("pglimit_metrics_status"),
            metrics_status("nometrics_metrics_status")
        ));
    }
    let actions = records.iter().any(|r| r.system == "pglimit-actions");
    // A count of the meta with thousands separators, as written when it is not a number.
    let count = |key: &str| {
        let text = m(key).trim();
        match number(text) {
            n if n.is_finite() && !text.is_empty() => int(n),
            _ => text.to_string(),
        }
    };
    if actions {
        lines.push(format!(
            "- pglimit, blocks and overrides: the same binary and settings with `bench/policies-actions.toml` \
             (pglimit's `bench/policies.toml` plus three overrides of the `bench` policy: `*@partner.example` \
             other limits, `10.0.0.0/8` unlimited, `203.0.113.66` denied; none matches the bench's \
             identifiers) and {} active admin blocks on keys the bench never checks, its migrations in a \
             database of its own (`actions`), the deny keys prefilled as for pglimit; measured right after \
             pglimit{}. Active blocks at the end: {} for pglimit, {} for it; a check from 203.0.113.66 \
             answered `{}` from pglimit, `{}` from it",
            count("actions_blocks_expected"),
            if metrics_off { " and its metrics-off run" } else { "" },
            count("pglimit_blocks"),
            count("actions_blocks"),
            m("pglimit_override_probe"),
            m("actions_override_probe")
        ));
    }
    if let Some(rev) = baseline {
        let after = match (metrics_off, actions) {
            (_, true) => "pglimit and its metrics-off and blocks-and-overrides runs",
            (true, false) => "pglimit and its metrics-off run",
            (false, false) => "pglimit",
        };
        lines.push(format!(
            "- Baseline: pglimit at {rev} (`BENCH_BASELINE={}`), built from a git worktree of that revision, \
             release build, default settings, its migrations in a database of its own (`baseline`); \
             measured right after {after}",
            m("baseline_rev")
        ));
    }
    lines.extend([
        format!(
            "- rate-limiter-flexible {} (RateLimiterPostgres, pg {}, pool of 16), Node {}, one process",
            m("rlflex"),
            m("pg_npm"),
            m("node")
        ),
        format!(
            "- runlimit-postgres {} (PostgresLimiter, its migrations in a database of its own, default \
             PostgresConfig, SQLx {} pool of 16) behind axum, release build (`bench/peer-runlimit/`)",
            m("runlimit"),
            m("runlimit_sqlx")
        ),
        format!(
            "- Seed service: the seed design as a service, axum {} and an SQLx {} pool of 32 (no test before \
             acquire), one reference upsert per check on SHA-256 of the key, admitted while the count is at most \
             the limit, in a database of its own (`seed`), release build (`bench/peer-seed/`)",
            m("seed_axum"),
            m("seed_sqlx")
        ),
        format!(
            "- Load: wrk {} with `bench/check.lua`{}, load generator, server and Postgres on the same machine",
            m("wrk"),
            if records.iter().any(|r| r.scenario == "allow-grpc") {
                "; gRPC from `bench/grpc_load.rs` (tonic, one HTTP/2 connection per client, one call in flight \
                 on each)"
            } else {
                ""
            }
        ),
        String::new(),
        table(records, baseline, metrics_off),
        String::new(),
    ]);
    if let Some(deny) = deny_vs_ceiling(records, baseline) {
        lines.extend([
            "Deny path against the HTTP ceiling: requests/s over the ceiling's at the same client count \
             (see *Deny path against the HTTP ceiling* below)."
                .to_string(),
            String::new(),
            deny,
            String::new(),
        ]);
    }
    if let Some(table) = actions_vs_plain(records) {
        lines.extend([
            format!(
                "Blocks and overrides configured, none applying, against none: pglimit-actions' requests/s \
                 over pglimit's (issue 12's budget: at most {}% slower; see *× without blocks and overrides* \
                 below).",
                js_number(ACTIONS_BUDGET_PERCENT)
            ),
            String::new(),
            table,
            String::new(),
        ]);
    }
    if let Some(table) = pooler::against_direct(records) {
        lines.extend([pooler::INTRO.to_string(), String::new(), table, String::new()]);
    }
    if let Some(table) = proxies::against_check(records) {
        lines.extend([proxies::INTRO.to_string(), String::new(), table, String::new()]);
    }
    if let Some(table) = policies::table(records) {
        lines.extend([policies::INTRO.to_string(), String::new(), table, String::new()]);
    }
    if let Some(table) = phases::table(records) {
        lines.extend([phases::INTRO.to_string(), String::new(), table, String::new()]);
    }
    if let Some(table) = slow::table(records) {
        lines.extend([slow::INTRO.to_string(), String::new(), table, String::new()]);
    }
    if let Some(table) = curve::table(records, &curve::points(meta)) {
        lines.extend([curve::intro(meta), String::new(), table, String::new()]);
    }
    lines.push(format!(
        "- Peak RSS (VmHWM) of pglimit over all its measurements: {}; \
         of the rate-limiter-flexible server: {}; of the runlimit-postgres server: {}; of the seed service: {}.",
        mib(meta.get("pglimit_rss_kib")),
        mib(meta.get("rlflex_rss_kib")),
        mib(meta.get("runlimit_rss_kib")),
        mib(meta.get("seed_rss_kib"))
    ));
    if metrics_off {
        lines.push(format!(
            "- Peak RSS (VmHWM) of pglimit with metrics off over all its measurements: {}.",
            mib(meta.get("nometrics_rss_kib"))
        ));
    }
    if actions {
        lines.push(format!(
            "- Peak RSS (VmHWM) of pglimit with blocks and overrides over all its measurements: {}.",
            mib(meta.get("actions_rss_kib"))
        ));
    }
    if let Some(rev) = baseline {
        lines.push(format!(
            "- Peak RSS (VmHWM) of pglimit at {rev} (baseline) over all its measurements: {}.",
            mib(meta.get("baseline_rss_kib"))
        ));
    }
    // Those of the other pglimit instances, in parentheses: "(2 with metrics off, 0 with …)".
    let others: Vec<String> = [
        (metrics_off, "nometrics_warnings", "with metrics off"),
        (actions, "actions_warnings", "with blocks and overrides"),
    ]
    .into_iter()
    .filter(|(measured, _, _)| *measured)
    .map(|(_, key, with)| match meta.get(key).filter(|w| !w.is_empty()) {
        Some(w) => format!("{w} {with}"),
        None => format!("{with}: not recorded"),
    })
    .collect();
    let warnings_others = if others.is_empty() { String::new() } else { format!(" ({})", others.join(", ")) };
    lines.push(format!(
        "- pglimit logged {warnings} warning or error lines{warnings_others}; /readyz at the end: `{}`.",
        m("pglimit_readyz")
    ));
    let mut report = lines.join("\n");
    report.push_str("\n\n");
    report.push_str(HOW_TO_READ);
    if metrics_off {
        writeln!(
            report,
            "- *× metrics off*: pglimit's requests/s over those of the same binary with \
             `PGLIMIT_METRICS=false` in the same scenario and client count, measured right after pglimit in \
             this run: below 1, the metrics cost that much (the tower-http layers are on in both). Its \
             statements are those of its own database (`nometrics`), its probe too must have been decided by \
             Postgres, and /metrics must have answered 200 with metrics on and 404 with them off."
        )
        .expect("a String");
    }
    if actions {
        writeln!(
            report,
            "- *× without blocks and overrides* (the table under the deny path's): the requests/s of pglimit \
             with blocks and overrides configured (`pglimit-actions`: {} active blocks on other keys, three \
             overrides that every policy-form check tries and none matches) over pglimit's, in the same \
             scenario and client count, measured in this run right after pglimit{}; *change*: that minus \
             1, in percent. A fall of more than {}% (issue 12's budget) is in bold and marked; it never \
             fails the run. Its statements are those of its own database (`actions`), its probe too must \
             have been decided by Postgres, and the run checks that pglimit had no block and no override, \
             and pglimit-actions all of them.",
            count("actions_blocks_expected"),
            if metrics_off { " and its metrics-off run" } else { "" },
            js_number(ACTIONS_BUDGET_PERCENT)
        )
        .expect("a String");
    }
    if records.iter().any(|r| pooler::SYSTEMS.contains(&r.system.as_str())) {
        writeln!(report, "{}", pooler::HOW_TO_READ).expect("a String");
    }
    if records.iter().any(|r| proxies::SCENARIOS.contains(&r.scenario.as_str())) {
        writeln!(report, "{}", proxies::HOW_TO_READ).expect("a String");
    }
    if records.iter().any(|r| policies::SCENARIOS.contains(&r.scenario.as_str())) {
        writeln!(report, "{}", policies::how_to_read(meta)).expect("a String");
    }
    if records.iter().any(|r| r.phases.is_some()) {
        writeln!(report, "{}", phases::HOW_TO_READ).expect("a String");
    }
    if records.iter().any(|r| r.slow.is_some()) {
        writeln!(report, "{}", slow::HOW_TO_READ).expect("a String");
    }
    if !curve::points(meta).is_empty() {
        writeln!(report, "{}", curve::HOW_TO_READ).expect("a String");
    }
    if let Some(rev) = baseline {
        let after = match (metrics_off, actions) {
            (_, true) => "pglimit and its metrics-off and blocks-and-overrides runs",
            (true, false) => "pglimit and its metrics-off run",
            (false, false) => "pglimit",
        };
        writeln!(
            report,
            "- *× baseline*: pglimit's requests/s over those of pglimit at {rev} (`BENCH_BASELINE`) in the \
             same scenario and client count, the baseline measured in this run right after {after}: below \
             1, the current code is slower. The baseline's statements are those of its own database \
             (`baseline`), and its probe too must have been decided by Postgres."
        )
        .expect("a String");
    }
    if records.iter().any(|r| r.system == "pglimit" && r.scenario == "deny") {
        let whom = if baseline.is_some() {
            "for pglimit, for pglimit with metrics off and for the baseline"
        } else {
            "for pglimit and for pglimit with metrics off"
        };
        writeln!(
            report,
            "- *Deny path against the HTTP ceiling*: {whom}, the deny \
             path's requests/s over the HTTP ceiling's (its only scenario: parse the JSON, answer a fixed \
             body) at the same client count, to three decimals; *pglimit vs …*: pglimit's fraction over the \
             other's, minus 1, in percent (the ceiling is the same, so it is also the change in requests/s). \
             A fall of more than {}% is in bold and marked.",
            js_number(DENY_BUDGET_PERCENT)
        )
        .expect("a String");
    }
    writeln!(report, "\n{}\n\n{}", targets::INTRO, targets::table(records, meta)).expect("a String");
    report
}

const HOW_TO_READ: &str = "\
How to read it:
- *requests/s* is decisions per second (pgbench: transactions per second, each one upsert). \
p50 and p99 come from wrk's latency histogram, or from pgbench's per-transaction log.
- *statements / decision*: top-level statements the system's database executed (`bench`; \
`runlimit` for the runlimit-postgres peer; `nometrics`, `actions` and `baseline` for those runs \
of pglimit; pg_stat_statements, reset before each measurement) divided by the requests the client counted; checks still in flight \
when the client stopped, pglimit's sampled cleanups and the runlimit peer's cleanup every 10 s make \
it slightly above the true figure. \
*Postgres ms / statement*: their mean execution time inside the server (pg_stat_statements \
total_exec_time; excludes parsing, the network and the commit's WAL flush).
- *× raw Postgres*: requests/s over pgbench's for the same key shape and client count; no raw \
figure exists for the deny path or the policy form. *× HTTP ceiling*: over the axum server that \
parses the same JSON and answers a fixed body. *× rate-limiter-flexible*: pglimit over the peer in the same scenario \
(for the deny path, also over the peer with `inMemoryBlockOnConsumed`, which answers repeat \
offenders from memory). *× runlimit-postgres*: pglimit over the runlimit-postgres peer in the \
same scenario.
- *CPU µs / request* (HTTP measurements): CPU time per request of the server process, of the \
PostgreSQL cluster's processes, and of everything else (the load generator, kernel threads, \
interrupts), from /proc over the measured run; then the machine's idle share. This is the \
profile behind the figures: with all systems on one machine, requests/s is bounded by the sum.
- *allow, policy form*: \
`{\"policy\":\"bench\",\"identifiers\":{\"email\":\"u<N>@example.com\",\"ip\":\"198.51.100.<M>\"}}` \
with N random of 10,000 and M = 1 + (N - 1) % 254; the `bench` policy (`bench/policies.toml`) has two \
fixed-window buckets, `email` and `ip`, of 10⁹ per hour, so every check is admitted and, having two \
buckets, takes a policy's road (docs/design.md: the plain upsert decides it on its snapshot).
- Deny path: limit 1 on 100 keys, each already used once, so every measured check is denied. \
*During a stream of resets* (pglimit and the baseline, last of their runs): the same on 10,000 keys, \
each already denied once so that the deny cache remembers them all (as during an attack), while one \
client resets other keys back to back (its rate in the check column): each reset is forgotten \
against that cache before the next check. Its statements include the resets' own.
- *check*: `ok` when every answer had the expected status (200 allow, 429 deny), no socket errors, \
and a probe after the run answered as expected (for pglimit, decided by Postgres, and matched by no \
override).
";
