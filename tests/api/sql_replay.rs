//! The SQL interface decides as `/check` does: seeded random traces of
//! policy checks, every algorithm and an override among them, replayed at
//! chosen times through the service's own path (the limiter's plan of the
//! request, decided by the store as of that time) on one database and
//! through `pglimit_sql_check` (what `pglimit.check` calls) on another,
//! with the same secret and policies; every figure of every answer compared.

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use pglimit::limiter::{Applied, CheckRequest, Checks, Decision, KeySecret, Shared};
use pglimit::policy::Policies;
use pglimit::storage::{Citus, PgStore, Reach};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::common::{fresh_database, functions_pool, pg_store, SECRET};

/// Every algorithm, a calendar window, a lockout, a limits override, a
/// shadow policy and leases.
pub const POLICIES: &str = r#"
[policies.fixed]
identifiers = { user = "text" }
[[policies.fixed.buckets]]
name = "minute"
on = ["user"]
limit = 5
window = "1m"

[policies.mixed]
identifiers = { user = "text_folded", ip = "ip" }
[[policies.mixed.buckets]]
name = "sliding"
on = ["user"]
limit = 4
window = "30s"
algorithm = "sliding_window"
[[policies.mixed.buckets]]
name = "log"
on = ["user", "ip"]
limit = 3
window = "20s"
algorithm = "sliding_log"
[[policies.mixed.buckets]]
name = "tokens"
on = ["ip"]
limit = 6
window = "1m"
algorithm = "token_bucket"
[[policies.mixed.buckets]]
name = "locked"
on = ["user"]
limit = 8
window = "2m"
block_for = "45s"
[[policies.mixed.overrides]]
when = { ip = "10.0.0.0/8" }
limits = { tokens = 2 }

[policies.calendar]
identifiers = { account = "text" }
[[policies.calendar.buckets]]
name = "day"
on = ["account"]
limit = 7
window = "1 calendar day"
timezone = "Europe/Berlin"

[policies.watched]
mode = "shadow"
identifiers = { email = "email" }
[[policies.watched.buckets]]
name = "hour"
on = ["email"]
limit = 2
window = "1h"

[policies.slots]
identifiers = { user = "text" }
[[policies.slots.buckets]]
name = "running"
on = ["user"]
limit = 2
lease = "30s"
algorithm = "concurrency"
[[policies.slots.buckets]]
name = "starts"
on = ["user"]
limit = 5
window = "1m"
"#;

const USERS: [&str; 4] = [" Alice", "alice", "BOB", "bob "];
const IPS: [&str; 5] = ["10.1.2.3", "192.0.2.1", "::ffff:192.0.2.1", "2001:db8::1", "2001:db8::2"];
const EMAILS: [&str; 3] = ["Carol+x@Example.com", "carol@example.com", "dave@example.com"];

/// The two paths, each on a database of its own with the same secret.
struct Paths {
    checks: Checks<PgStore>,
    sql: sqlx::PgPool,
}

impl Paths {
    async fn new() -> Self {
        let policies = Policies::parse(POLICIES).expect("valid policies");
        let secret = KeySecret::new(SECRET).expect("a long enough secret");
        let (service_db, sql_db) = (fresh_database().await, fresh_database().await);
        let compiled = pglimit::limiter::compile(&policies, &secret, false, true);
        pglimit::storage::push_policies(&sql_db, Reach::default(), false, Citus::Off, &compiled)
            .await
            .expect("push the policies");
        let shared = Shared::new(pg_store(&service_db).await, policies, secret, false);
        Self { checks: Checks::new(Arc::new(shared)), sql: functions_pool(&sql_db).await }
    }

    /// The service's answer at `now`, as `Checks::check` puts it together.
    async fn service(&self, request: &CheckRequest, now: DateTime<Utc>) -> Decision {
        let plan = self.checks.plan(request).expect("a valid request");
        let matched = plan.matched.clone();
        assert!(matched.as_ref().is_none_or(|m| m.action == Applied::Limits), "no list in a trace");
        let answer = self.checks.store().check_as_of(&plan.check, now).await.expect("decided");
        let decision = Decision::new(&plan.check.buckets, answer);
        let decision = match matched {
            Some(matched) => decision.overridden(matched),
            None => decision,
        };
        decision.shadowed(plan.shadow)
    }

    /// The SQL function's answer at `now`, as JSON.
    async fn sql(&self, policy: &str, identifiers: &Value, cost: u64, now: DateTime<Utc>) -> Value {
        let (answer,): (Value,) =
            sqlx::query_as("SELECT to_jsonb(a) FROM pglimit_sql_check($1, $2, $3, $4) AS a")
                .bind(policy)
                .bind(identifiers)
                .bind(cost as i64)
                .bind(now)
                .fetch_one(&self.sql)
                .await
                .expect("pglimit_sql_check");
        answer
    }
}

/// A random check of one of the policies, and how far the clock moves first.
fn step(rng: &mut StdRng) -> (String, Value, u64, TimeDelta) {
    let user = USERS[rng.gen_range(0..USERS.len())];
    let (policy, identifiers, most) = match rng.gen_range(0..5) {
        0 => ("fixed", json!({ "user": user }), 5),
        1 => ("mixed", json!({ "user": user, "ip": IPS[rng.gen_range(0..IPS.len())] }), 2),
        2 => ("calendar", json!({ "account": user }), 3),
        3 => ("watched", json!({ "email": EMAILS[rng.gen_range(0..EMAILS.len())] }), 2),
        _ => ("slots", json!({ "user": user }), 2),
    };
    // Mostly short gaps, so that buckets fill; now and then one that ends
    // windows, leases and lockouts, or crosses a calendar day.
    let gaps = [0, 0, 0, 40, 40, 300, 900, 2_500, 7_000, 31_000, 190_000, 7_200_000];
    let gap_ms = gaps[rng.gen_range(0..gaps.len())];
    (policy.to_owned(), identifiers, rng.gen_range(0..=most), TimeDelta::milliseconds(gap_ms))
}

/// The service's decision as the fields `pglimit.check` returns.
fn as_row(d: &Decision, cost: u64) -> Value {
    let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    json!({
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_at": time(&d.reset_at),
        "retry_after_s": d.retry_after_s,
        "would_allow": d.would_allow,
        "blocked_by": d.blocked_by.as_deref(),
        "override": d.matched.as_ref().map(|m| serde_json::to_value(m).expect("json")),
        "buckets": serde_json::to_value(&d.buckets).expect("json"),
        // A lease is minted at random: only whether there is one compares.
        "lease": cost > 0 && d.allowed && d.buckets.iter().any(|b| b.algorithm.name() == "concurrency"),
    })
}

/// The SQL row in the same terms.
fn normalised(mut row: Value) -> Value {
    let at: DateTime<Utc> = row["reset_at"].as_str().expect("reset_at").parse().expect("a time");
    row["reset_at"] = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true).into();
    row["lease"] = (!row["lease"].is_null()).into();
    row.as_object_mut().expect("a row").remove("lease_expires_at");
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_traces_decide_alike_through_the_service_and_the_sql_function() {
    let paths = Paths::new().await;
    let mut rng = StdRng::seed_from_u64(49);
    let mut now: DateTime<Utc> = "2031-03-30T00:59:58.5Z".parse().expect("time"); // a DST change in Berlin
    let mut denied = 0;
    for n in 0..400 {
        let (policy, identifiers, cost, gap) = step(&mut rng);
        now += gap;
        let raw = identifiers.as_object().expect("an object").iter();
        let request = CheckRequest::Policy {
            policy: policy.clone(),
            identifiers: raw.map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect(),
            cost,
        };
        let want = as_row(&paths.service(&request, now).await, cost);
        let got = normalised(paths.sql(&policy, &identifiers, cost, now).await);
        assert_eq!(got, want, "check {n}: {policy} {identifiers} cost {cost} at {now}");
        denied += usize::from(want["allowed"] == false || want["would_allow"] == false);
    }
    assert!(denied > 40, "the trace should deny often enough to compare denials ({denied})");
}
