//! The two tables with a budget: the deny path against the HTTP ceiling,
//! pglimit against its metrics-off run and the baseline (what the metrics
//! and a change cost); and pglimit with blocks and overrides configured
//! against pglimit without. A fall past the budget is marked; it never
//! fails the run.

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::numbers::thousands;
use crate::record::{find, Record};
use crate::systems::{scenario_label, ACTIONS_SCENARIOS};

/// How far pglimit's deny-path fraction of the HTTP ceiling may fall against
/// metrics off or the baseline before the report marks it (the budget of the
/// metrics: "must not fall by more than 5%").
pub const DENY_BUDGET_PERCENT: f64 = 5.0;

/// How much slower pglimit may be with blocks and overrides configured (none
/// matching) than without, before the report marks it (their budget: "costs
/// no more than 5%").
pub const ACTIONS_BUDGET_PERCENT: f64 = 5.0;

/// NOW against THEN as a change in percent, one decimal, signed; in bold and
/// marked when it falls by more than BUDGET percent; blank when either is missing.
fn change(now: f64, then: f64, budget: f64) -> String {
    if !(now.is_finite() && then.is_finite() && then > 0.0) {
        return String::new();
    }
    let percent = 100.0 * (now / then - 1.0);
    let sign = if percent >= 0.0 { "+" } else { "" };
    let text = format!("{sign}{percent:.1}%");
    if percent < -budget {
        format!("**{text}** (over {budget}%)")
    } else {
        text
    }
}

/// The deny path against the HTTP ceiling, one row per client count at which
/// pglimit's deny path was measured: the ceiling's requests/s, then pglimit's
/// requests/s over it with metrics on, with metrics off and (with `baseline`)
/// at the baseline revision, and pglimit's fraction against each of the other
/// two as a change in percent, marked when it falls by more than the budget.
/// None when pglimit's deny path was not measured.
pub fn deny_vs_ceiling(records: &[Record], baseline: Option<&str>) -> Option<String> {
    // requests/s over the ceiling's; NaN when either is missing or not positive.
    let fraction = |r: Option<&Record>, ceiling: Option<&Record>| match (r, ceiling) {
        (Some(r), Some(c)) if r.rps > 0.0 && c.rps > 0.0 => r.rps / c.rps,
        _ => f64::NAN,
    };
    let shown = |x: f64| if x.is_finite() { format!("{x:.3}") } else { String::new() };
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
        let ceiling = find(records, "ceiling", "allow-random", conc);
        let pglimit = fraction(find(records, "pglimit", "deny", conc), ceiling);
        let off = fraction(find(records, "pglimit-nometrics", "deny", conc), ceiling);
        let mut row = format!(
            "| {conc} | {} | {} | {} | {} |",
            ceiling.map_or_else(String::new, |c| thousands(c.rps)),
            shown(pglimit),
            shown(off),
            change(pglimit, off, DENY_BUDGET_PERCENT)
        );
        if baseline.is_some() {
            let base = fraction(find(records, "baseline", "deny", conc), ceiling);
            write!(row, " {} | {} |", shown(base), change(pglimit, base, DENY_BUDGET_PERCENT))
                .expect("a String");
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
pub fn actions_vs_plain(records: &[Record]) -> Option<String> {
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
        let actions = find(records, "pglimit-actions", &r.scenario, r.concurrency);
        let rps = |r: Option<&Record>| r.map_or_else(String::new, |r| thousands(r.rps));
        let (times, change) = match actions {
            Some(a) if a.rps > 0.0 && r.rps > 0.0 => {
                (format!("{:.3}", a.rps / r.rps), change(a.rps, r.rps, ACTIONS_BUDGET_PERCENT))
            }
            _ => (String::new(), String::new()),
        };
        rows.push(format!(
            "| {} | {} | {} | {} | {times} | {change} |",
            scenario_label(&r.scenario),
            r.concurrency,
            rps(Some(r)),
            rps(actions),
        ));
    }
    Some(rows.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fall_past_the_budget_is_marked_and_a_rise_is_signed() {
        assert_eq!(change(1.03, 1.0, 5.0), "+3.0%");
        assert_eq!(change(0.97, 1.0, 5.0), "-3.0%");
        assert_eq!(change(0.90, 1.0, 5.0), "**-10.0%** (over 5%)");
        assert_eq!(change(0.90, f64::NAN, 5.0), "");
    }
}
