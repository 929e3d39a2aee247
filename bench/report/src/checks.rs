//! What fails the run besides a measurement's own problems: a measurement
//! missing, and an instance whose settings did not take.

use std::collections::HashMap;

use crate::record::{find, Record};
use crate::systems::{ACTIONS_SCENARIOS, SYSTEMS};
use crate::{curve, policies, pooler, proxies, sql};

/// What the run should have measured and did not: a system without a single
/// measurement (the baseline only when the meta names one), or a scenario
/// and client count of pglimit's without its metrics-off (or baseline) twin,
/// or (in ACTIONS_SCENARIOS) without its pglimit-actions twin, or a client
/// count of pglimit's policy form without its proxy scenarios.
pub fn missing(records: &[Record], meta: &HashMap<String, String>) -> Vec<String> {
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
    missing.extend(sql::missing(records));
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
            if find(records, twin, &r.scenario, r.concurrency).is_none() && has(twin) {
                missing.push(format!("{twin} {} c={}", r.scenario, r.concurrency));
            }
        }
    }
    missing
}

/// bench/run asks each pglimit instance for /metrics before stopping it: 200
/// with metrics on (pglimit), 404 with PGLIMIT_METRICS=false; anything else
/// means the setting did not take, and every measurement of that instance is
/// marked. A meta without the status (an older run) is not checked.
pub fn metrics_endpoints(records: &mut [Record], meta: &HashMap<String, String>) {
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
pub fn actions_setup(records: &mut [Record], meta: &HashMap<String, String>) {
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
