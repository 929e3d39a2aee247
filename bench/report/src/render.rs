//! The report as one Markdown document: what was measured, the main table,
//! the tables of each section, the machine's figures, and how to read it.

use std::collections::HashMap;

use crate::budgets::{self, ACTIONS_BUDGET_PERCENT};
use crate::numbers::{mib, number, thousands};
use crate::record::Record;
use crate::{curve, header, legend, phases, policies, pooler, proxies, slow, sql, table};

/// A run's measurements and meta, with what was measured besides pglimit.
pub struct Run<'a> {
    pub records: &'a [Record],
    pub meta: &'a HashMap<String, String>,
    /// BENCH_BASELINE's short revision: from the meta, or unnamed when only
    /// its measurements are there.
    pub baseline: Option<&'a str>,
    /// pglimit-nometrics was measured.
    pub metrics_off: bool,
    /// pglimit-notop was measured.
    pub top_off: bool,
    /// pglimit-actions was measured.
    pub actions: bool,
}

impl<'a> Run<'a> {
    pub fn new(records: &'a [Record], meta: &'a HashMap<String, String>) -> Run<'a> {
        let has = |system: &str| records.iter().any(|r| r.system == system);
        let baseline = meta.get("baseline").map(String::as_str).filter(|b| !b.is_empty());
        Run {
            records,
            meta,
            baseline: baseline.or_else(|| has("baseline").then_some("an unknown revision")),
            metrics_off: has("pglimit-nometrics"),
            top_off: has("pglimit-notop"),
            actions: has("pglimit-actions"),
        }
    }

    /// A value of the meta, "unknown" when it has none.
    pub fn m(&self, key: &str) -> &str {
        self.meta.get(key).map_or("unknown", String::as_str)
    }

    /// A count of the meta with thousands separators, as written when it is not a number.
    pub fn count(&self, key: &str) -> String {
        let text = self.m(key).trim();
        match number(text) {
            n if n.is_finite() => thousands(n),
            _ => text.to_string(),
        }
    }

    /// The runs of pglimit that the baseline was measured after.
    pub fn baseline_after(&self) -> &'static str {
        match (self.metrics_off, self.actions) {
            (_, true) => "pglimit and its metrics-off and blocks-and-overrides runs",
            (true, false) => "pglimit and its metrics-off run",
            (false, false) => "pglimit",
        }
    }
}

pub fn render(records: &[Record], meta: &HashMap<String, String>) -> String {
    let run = Run::new(records, meta);
    let mut lines = header::lines(&run);
    lines.extend([String::new(), table::table(&run), String::new()]);
    for (intro, table) in sections(&run) {
        lines.extend([intro, String::new(), table, String::new()]);
    }
    lines.extend(footer(&run));
    let mut report = lines.join("\n");
    report.push_str("\n\n");
    report.push_str(&legend::how_to_read(&run));
    report
}

/// The tables under the main one, each with its intro; only those measured.
fn sections(run: &Run) -> Vec<(String, String)> {
    let records = run.records;
    let deny = "Deny path against the HTTP ceiling: requests/s over the ceiling's at the same client count \
                (see *Deny path against the HTTP ceiling* below).";
    let actions = format!(
        "Blocks and overrides configured, none applying, against none: pglimit-actions' requests/s \
         over pglimit's (their budget: at most {ACTIONS_BUDGET_PERCENT}% slower; see *× without blocks and \
         overrides* below)."
    );
    [
        sql::table(records).map(|t| (sql::INTRO.to_string(), t)),
        budgets::deny_vs_ceiling(records, run.baseline).map(|t| (deny.to_string(), t)),
        budgets::actions_vs_plain(records).map(|t| (actions, t)),
        pooler::against_direct(records).map(|t| (pooler::INTRO.to_string(), t)),
        proxies::against_check(records).map(|t| (proxies::INTRO.to_string(), t)),
        policies::table(records).map(|t| (policies::INTRO.to_string(), t)),
        phases::table(records).map(|t| (phases::INTRO.to_string(), t)),
        slow::table(records).map(|t| (slow::INTRO.to_string(), t)),
        curve::table(records, &curve::points(run.meta)).map(|t| (curve::intro(run.meta), t)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Peak RSS of each server, and the warnings pglimit logged.
fn footer(run: &Run) -> Vec<String> {
    let rss = |key: &str| mib(run.meta.get(key));
    let mut lines = vec![format!(
        "- Peak RSS (VmHWM) of pglimit over all its measurements: {}; \
         of the rate-limiter-flexible server: {}; of the runlimit-postgres server: {}; of the seed service: {}.",
        rss("pglimit_rss_kib"),
        rss("rlflex_rss_kib"),
        rss("runlimit_rss_kib"),
        rss("seed_rss_kib")
    )];
    let mut twin = |measured: bool, which: String, key: &str| {
        if measured {
            lines.push(format!(
                "- Peak RSS (VmHWM) of pglimit {which} over all its measurements: {}.",
                rss(key)
            ));
        }
    };
    twin(run.metrics_off, "with metrics off".to_string(), "nometrics_rss_kib");
    twin(run.actions, "with blocks and overrides".to_string(), "actions_rss_kib");
    if let Some(rev) = run.baseline {
        twin(true, format!("at {rev} (baseline)"), "baseline_rss_kib");
    }
    lines.push(warnings(run));
    lines
}

/// pglimit's warning and error lines, with those of its other instances in
/// parentheses: "(2 with metrics off, 0 with …)".
fn warnings(run: &Run) -> String {
    let warnings = run.meta.get("pglimit_warnings").filter(|w| !w.is_empty()).map_or("0", |w| w.as_str());
    let others: Vec<String> = [
        (run.metrics_off, "nometrics_warnings", "with metrics off"),
        (run.top_off, "notop_warnings", "with the top list off"),
        (run.actions, "actions_warnings", "with blocks and overrides"),
    ]
    .into_iter()
    .filter(|(measured, _, _)| *measured)
    .map(|(_, key, with)| match run.meta.get(key).filter(|w| !w.is_empty()) {
        Some(w) => format!("{w} {with}"),
        None => format!("{with}: not recorded"),
    })
    .collect();
    let others = if others.is_empty() { String::new() } else { format!(" ({})", others.join(", ")) };
    format!(
        "- pglimit logged {warnings} warning or error lines{others}; /readyz at the end: `{}`.",
        run.m("pglimit_readyz")
    )
}
