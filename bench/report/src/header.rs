//! The top of the report: the run, the machine, and each system as it was
//! set up and built.

use crate::render::Run;

/// The title and one line per setting of the run and per system measured.
pub fn lines(run: &Run) -> Vec<String> {
    let smoke = if run.m("smoke") == "1" { " (smoke run, dev build: not to quote)" } else { "" };
    let mut lines = vec![format!("# pglimit throughput, {}{smoke}", run.m("date")), String::new()];
    lines.extend(machine(run));
    if run.metrics_off {
        lines.push(metrics_off(run));
    }
    if run.actions {
        lines.push(actions(run));
    }
    if let Some(rev) = run.baseline {
        lines.push(format!(
            "- Baseline: pglimit at {rev} (`BENCH_BASELINE={}`), built from a git worktree of that revision, \
             release build, default settings, its migrations in a database of its own (`baseline`); \
             measured right after {}",
            run.m("baseline_rev"),
            run.baseline_after()
        ));
    }
    lines.extend(peers(run));
    lines
}

/// The command, the machine, PostgreSQL and pglimit.
fn machine(run: &Run) -> [String; 4] {
    let m = |key| run.m(key);
    [
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
            "- pglimit {}, {}, {} build, default settings (4 connections, one call \
             in flight, the rest spares for stalls; cleanup rate 0.01)",
            m("commit"),
            m("rustc"),
            m("build")
        ),
    ]
}

fn metrics_off(run: &Run) -> String {
    // What /metrics answered before each instance stopped, as bench/run recorded it.
    let status =
        |key: &str| run.meta.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()).unwrap_or("not recorded");
    format!(
        "- pglimit, metrics off: the same binary with `PGLIMIT_METRICS=false` (no metrics recorder: every \
         metrics call a no-op), otherwise the same settings, its migrations in a database of its own \
         (`nometrics`), the deny keys prefilled as for pglimit; measured right after pglimit. \
         /metrics answered {} with metrics on, {} with metrics off",
        status("pglimit_metrics_status"),
        status("nometrics_metrics_status")
    )
}

fn actions(run: &Run) -> String {
    format!(
        "- pglimit, blocks and overrides: the same binary and settings with `bench/policies-actions.toml` \
         (pglimit's `bench/policies.toml` plus three overrides of the `bench` policy: `*@partner.example` \
         other limits, `10.0.0.0/8` unlimited, `203.0.113.66` denied; none matches the bench's \
         identifiers) and {} active admin blocks on keys the bench never checks, its migrations in a \
         database of its own (`actions`), the deny keys prefilled as for pglimit; measured right after \
         pglimit{}. Active blocks at the end: {} for pglimit, {} for it; a check from 203.0.113.66 \
         answered `{}` from pglimit, `{}` from it",
        run.count("actions_blocks_expected"),
        if run.metrics_off { " and its metrics-off run" } else { "" },
        run.count("pglimit_blocks"),
        run.count("actions_blocks"),
        run.m("pglimit_override_probe"),
        run.m("actions_override_probe")
    )
}

/// The peers, the seed service and the load generator.
fn peers(run: &Run) -> [String; 4] {
    let m = |key| run.m(key);
    let grpc = if run.records.iter().any(|r| r.scenario == "allow-grpc") {
        "; gRPC from `bench/grpc_load.rs` (tonic, one HTTP/2 connection per client, one call in flight on each)"
    } else {
        ""
    };
    [
        format!(
            "- rate-limiter-flexible {} (RateLimiterPostgres, pg {}, pool of 16), Node {}, one process",
            m("rlflex"),
            m("pg_npm"),
            m("node")
        ),
        format!(
            "- runlimit-postgres {} (PostgresLimiter, its migrations in a database of its own, default \
             PostgresConfig, SQLx {} pool of 16) behind axum, {} build (`bench/peer-runlimit/`)",
            m("runlimit"),
            m("runlimit_sqlx"),
            m("build")
        ),
        format!(
            "- Seed service: the seed design as a service, axum {} and an SQLx {} pool of 32 (no test before \
             acquire), one reference upsert per check on SHA-256 of the key, admitted while the count is at most \
             the limit, in a database of its own (`seed`), {} build (`bench/peer-seed/`)",
            m("seed_axum"),
            m("seed_sqlx"),
            m("build")
        ),
        format!(
            "- Load: wrk {} with `bench/check.lua`{grpc}, load generator, server and Postgres on the same machine",
            m("wrk")
        ),
    ]
}
