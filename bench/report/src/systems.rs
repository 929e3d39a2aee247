//! The systems and scenarios that bench/run measures, with their labels in
//! the tables, in the tables' order.

/// pglimit's scenarios that pglimit-actions is measured in too.
pub const ACTIONS_SCENARIOS: [&str; 3] = ["allow-random", "allow-policy", "deny"];

/// The deny path while one client resets other keys (bench/scenarios.sh's
/// run_deny_resets), whose rate the check column gives.
pub const RESETS_SCENARIO: &str = "deny-resets";

pub const SCENARIOS: [(&str, &str); 16] = [
    ("allow-random", "allow, random keys (10,000)"),
    ("allow-hot", "allow, one hot key"),
    ("allow-policy", "allow, policy form (2 buckets)"),
    // The policy form's policy and identifiers behind a proxy (pglimit only).
    ("allow-auth", "allow, forward-auth `GET /auth/bench` (2 buckets)"),
    ("allow-grpc", "allow, gRPC `ShouldRateLimit` (2 buckets)"),
    // Policies and algorithms (pglimit, its twins, and raw Postgres' login transaction).
    ("allow-login", "allow, `login` policy (3 buckets), random identities"),
    ("allow-contact", "allow, `contact_confirmation` policy, random recipients"),
    ("mixed", "mixed: login, contact, one-off keys over 4 algorithms, hot keys"),
    ("allow-sliding_window", "allow, random keys (10,000), sliding window"),
    ("allow-sliding_log", "allow, random keys (10,000), sliding log"),
    ("allow-token_bucket", "allow, random keys (10,000), token bucket"),
    ("allow-concurrency", "allow, random keys (10,000), concurrency (a lease per check)"),
    // Points of the concurrency curve off the table's client counts (curve.rs).
    ("curve", "allow, random keys (10,000), curve point"),
    ("deny", "deny, 100 keys over limit"),
    ("deny-inmemory-block", "deny, `inMemoryBlockOnConsumed`"),
    // pglimit and the baseline only (bench/scenarios.sh).
    (RESETS_SCENARIO, "deny, 10,000 remembered keys, during a stream of resets"),
];

pub const SYSTEMS: [(&str, &str); 13] = [
    ("raw-pg", "raw Postgres (pgbench upsert)"),
    // pgbench calling pglimit.check, in allow-random (one bucket) and allow-login (sql.rs).
    (crate::sql::SYSTEM, "pglimit.check from SQL (pgbench)"),
    ("ceiling", "HTTP ceiling (axum, no store)"),
    ("pglimit", "**pglimit**"),
    // The same binary with PGLIMIT_METRICS=false, measured right after pglimit.
    ("pglimit-nometrics", "pglimit, metrics off"),
    // The same binary with PGLIMIT_TOP=off, right after pglimit-nometrics, on
    // the deny flood only: the top list's cost on the deny path.
    ("pglimit-notop", "pglimit, top list off"),
    // The same binary with overrides and blocks that never apply, measured
    // right after pglimit-nometrics, in ACTIONS_SCENARIOS only.
    ("pglimit-actions", "pglimit, blocks and overrides"),
    // Behind PgBouncer, in allow-random, allow-login and deny (pooler.rs).
    ("pglimit-session", "pglimit behind PgBouncer (session)"),
    ("pglimit-transaction", "pglimit behind PgBouncer (transaction)"),
    // Only with BENCH_BASELINE; its label names the revision (table.rs).
    ("baseline", "pglimit (baseline)"),
    ("rlflex", "rate-limiter-flexible (Node, pg)"),
    ("runlimit", "runlimit-postgres (Rust, sqlx)"),
    ("seed", "seed service (axum + SQLx, one upsert)"),
];

/// pglimit, at any revision or setting: its probes must be decided by Postgres.
pub fn is_pglimit(system: &str) -> bool {
    matches!(system, "pglimit" | "pglimit-nometrics" | "pglimit-notop" | "pglimit-actions" | "baseline")
        || crate::pooler::SYSTEMS.contains(&system)
}

/// A scenario's label in the tables (its id when it has none).
pub fn scenario_label(id: &str) -> &str {
    label(&SCENARIOS, id)
}

/// A system's label in the tables (its id when it has none).
pub fn system_label(id: &str) -> &str {
    label(&SYSTEMS, id)
}

fn label<'a>(labels: &[(&str, &'static str)], id: &'a str) -> &'a str {
    labels.iter().find(|(k, _)| *k == id).map_or(id, |(_, v)| v)
}

/// Where a scenario or system comes in the tables (-1 when unknown).
pub fn order(labels: &[(&str, &str)], id: &str) -> i64 {
    labels.iter().position(|(k, _)| *k == id).map_or(-1, |i| i as i64)
}
