//! How to read the report: what each column and section means, for those
//! this run has; then the performance targets.

use std::fmt::Write as _;

use crate::budgets::{ACTIONS_BUDGET_PERCENT, DENY_BUDGET_PERCENT};
use crate::record::Record;
use crate::render::Run;
use crate::{curve, phases, policies, pooler, proxies, slow, sql, targets};

/// The notes under the tables, for the sections this run has, ending with
/// the targets' table.
pub fn how_to_read(run: &Run) -> String {
    let (records, meta) = (run.records, run.meta);
    let any = |f: fn(&Record) -> bool| records.iter().any(f);
    let notes = [
        any(|r| r.system == sql::SYSTEM).then(|| sql::HOW_TO_READ.to_string()),
        run.metrics_off.then(|| METRICS_OFF.to_string()),
        run.actions.then(|| actions(run)),
        any(|r| pooler::SYSTEMS.contains(&r.system.as_str())).then(|| pooler::HOW_TO_READ.to_string()),
        any(|r| proxies::SCENARIOS.contains(&r.scenario.as_str())).then(|| proxies::HOW_TO_READ.to_string()),
        any(|r| policies::SCENARIOS.contains(&r.scenario.as_str())).then(|| policies::how_to_read(meta)),
        any(|r| r.phases.is_some()).then(|| phases::HOW_TO_READ.to_string()),
        any(|r| r.slow.is_some()).then(|| slow::HOW_TO_READ.to_string()),
        (!curve::points(meta).is_empty()).then(|| curve::HOW_TO_READ.to_string()),
        run.baseline.map(|rev| baseline(run, rev)),
        any(|r| r.system == "pglimit" && r.scenario == "deny").then(|| deny(run)),
    ];
    let mut report = HOW_TO_READ.to_string();
    for note in notes.into_iter().flatten() {
        writeln!(report, "{note}").expect("a String");
    }
    writeln!(report, "\n{}\n\n{}", targets::INTRO, targets::table(records, meta)).expect("a String");
    report
}

const METRICS_OFF: &str = "- *× metrics off*: pglimit's requests/s over those of the same binary with \
`PGLIMIT_METRICS=false` in the same scenario and client count, measured right after pglimit in \
this run: below 1, the metrics cost that much (the tower-http layers are on in both). Its \
statements are those of its own database (`nometrics`), its probe too must have been decided by \
Postgres, and /metrics must have answered 200 with metrics on and 404 with them off.";

/// Why a marked fall in a budget table is a cue, not a verdict.
const SEQUENTIAL: &str = "The systems compared run one after the other, so the machine's drift \
     between them counts as a change too: `bench/ab` alternates them in rounds, and is the measure \
     to take before acting on a mark";

fn actions(run: &Run) -> String {
    format!(
        "- *× without blocks and overrides* (the table under the deny path's): the requests/s of pglimit \
         with blocks and overrides configured (`pglimit-actions`: {} active blocks on other keys, three \
         overrides that every policy-form check tries and none matches) over pglimit's, in the same \
         scenario and client count, measured in this run right after pglimit{}; *change*: that minus \
         1, in percent. A fall of more than {ACTIONS_BUDGET_PERCENT}% (their budget) is in bold and marked; \
         it never fails the run. Its statements are those of its own database (`actions`), its probe too \
         must have been decided by Postgres, and the run checks that pglimit had no block and no override, \
         and pglimit-actions all of them. {SEQUENTIAL} (`AB_BLOCKS`).",
        run.count("actions_blocks_expected"),
        if run.metrics_off { " and its metrics-off run" } else { "" },
    )
}

fn baseline(run: &Run, rev: &str) -> String {
    format!(
        "- *× baseline*: pglimit's requests/s over those of pglimit at {rev} (`BENCH_BASELINE`) in the \
         same scenario and client count, the baseline measured in this run right after {}: below \
         1, the current code is slower. The baseline's statements are those of its own database \
         (`baseline`), and its probe too must have been decided by Postgres. {SEQUENTIAL}.",
        run.baseline_after()
    )
}

fn deny(run: &Run) -> String {
    let whom = if run.baseline.is_some() {
        "for pglimit, for pglimit with metrics off and for the baseline"
    } else {
        "for pglimit and for pglimit with metrics off"
    };
    format!(
        "- *Deny path against the HTTP ceiling*: {whom}, the deny \
         path's requests/s over the HTTP ceiling's (its only scenario: parse the JSON, answer a fixed \
         body) at the same client count, to three decimals; *pglimit vs …*: pglimit's fraction over the \
         other's, minus 1, in percent (the ceiling is the same, so it is also the change in requests/s). \
         A fall of more than {DENY_BUDGET_PERCENT}% is in bold and marked. {SEQUENTIAL}."
    )
}

pub const HOW_TO_READ: &str = "\
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
