//! The report of `bench/run`: turns its measurements into Markdown tables.
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
//! Under the main table (table.rs), pglimit.check from SQL against raw
//! Postgres per transaction (sql.rs), the deny path against the HTTP ceiling
//! and blocks and overrides against none (budgets.rs), behind PgBouncer
//! (pooler.rs), behind a proxy (proxies.rs), policies and algorithms
//! (policies.rs), where a check's time goes (phases.rs) and, with
//! `BENCH_SLOW=1`, the slowest checks' own phases (slow.rs), then the
//! concurrency curve, whose chart data it writes to the meta's `curve_tsv`
//! (curve.rs); last, how to read it (legend.rs) and the performance targets
//! (targets.rs).

mod budgets;
mod checks;
mod curve;
mod header;
mod legend;
mod numbers;
mod parse;
mod phases;
mod policies;
mod pooler;
mod proxies;
mod record;
mod render;
mod slow;
mod sql;
mod systems;
mod table;
mod targets;

use std::path::Path;
use std::process::ExitCode;

use numbers::number;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [results_dir, meta_file, out_file] = args.as_slice() else {
        eprintln!("usage: bench-report RESULTS_DIR META_FILE OUT.md");
        return ExitCode::from(2);
    };
    let meta = match std::fs::read_to_string(meta_file) {
        Ok(text) => parse::key_values(&text),
        Err(e) => {
            eprintln!("bench-report: cannot read {meta_file}: {e}");
            return ExitCode::from(2);
        }
    };
    let clk_tck = meta.get("clk_tck").filter(|v| !v.is_empty()).map_or(100.0, |v| number(v));
    let mut records = match record::collect(Path::new(results_dir), clk_tck) {
        Ok(records) => records,
        Err(e) => {
            eprintln!("bench-report: cannot read {results_dir}: {e}");
            return ExitCode::from(2);
        }
    };
    checks::metrics_endpoints(&mut records, &meta);
    checks::actions_setup(&mut records, &meta);
    let report = render::render(&records, &meta);
    if let Err(e) = std::fs::write(out_file, &report) {
        eprintln!("bench-report: cannot write {out_file}: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = curve::write_data(&records, &meta) {
        eprintln!("bench-report: cannot write the curve's data: {e}");
        return ExitCode::FAILURE;
    }
    print!("{report}");
    let failed = records.iter().filter(|r| !r.problems.is_empty()).count();
    let missing = checks::missing(&records, &meta);
    if !missing.is_empty() {
        eprintln!("bench-report: missing measurements: {}", missing.join(", "));
    }
    if failed > 0 {
        eprintln!("bench-report: {failed} measurement(s) with problems (see the check column)");
    }
    if failed > 0 || !missing.is_empty() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
