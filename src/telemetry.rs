//! What pglimit tells its operators: Prometheus metrics.
//!
//! Every metric is named, described and recorded here, so the names live in
//! one place and the layers that record them (limiter, storage) share no
//! types with the exporter. Label values come only from configuration
//! (policy and bucket names) and from fixed words, never from identifiers or
//! keys, so the number of series is bounded by the policy file.
//!
//! Recording goes through the `metrics` facade: until [`install`] is called
//! (and with `PGLIMIT_METRICS=false` it never is) every call is a no-op.
//! Install before loading policies: their [`PolicyCounters`] are registered
//! with the recorder installed at that moment.
//!
//! Series that can move are registered at 0 from the start (a fresh
//! instance shows them), so that `rate()` and `increase()` see their first
//! count; series that cannot happen (a policy's impossible outcomes, reloads
//! without a policy file) are never shown.
//!
//! The checks and denials of each recent minute ([`Minutes`]) are here
//! too, for the console's overview.
//!
//! The slow-check log ([`SlowChecks`]) is here too: what it records is
//! plain durations and labels, and it serves operators as metrics do.

mod checks;
mod minutes;
mod slow;
mod top;
mod waits;

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use checks::{Outcome, PolicyCounters, ADHOC, DECISIONS, STORES};
pub use minutes::{sample_every_minute, Minute, Minutes, MINUTES_SHOWN};
pub use slow::{SlowCheck, SlowChecks, SlowListing};
pub use top::{top_expected, top_lost};
pub use waits::{wait_ended, wait_refused, waiting, waits_expected};

const CHECKS: &str = "pglimit_checks_total";
const BUCKET_DENIALS: &str = "pglimit_bucket_denials_total";
const CHECK_DURATION: &str = "pglimit_check_duration_seconds";
const DB_CALL_DURATION: &str = "pglimit_db_call_duration_seconds";
const BATCH_SIZE: &str = "pglimit_batch_size";
const CHECK_PHASE: &str = "pglimit_check_phase_seconds";
const UPSERT_RETRIES: &str = "pglimit_upsert_retries_total";
const DEGRADED: &str = "pglimit_degraded";
const INSTANCES: &str = "pglimit_instances";
const REFUSED: &str = "pglimit_postgres_refused_total";
const SWITCHES: &str = "pglimit_fallback_switches_total";
const CLEANUP_DELETED: &str = "pglimit_cleanup_deleted_rows_total";
const RELOADS: &str = "pglimit_policy_reloads_total";
const PROBLEMS: &str = "pglimit_problems_total";
const BUILD_INFO: &str = "pglimit_build_info";

/// From half a millisecond to the longest a check waits under the largest
/// timeouts; what a check takes on each setup is in docs/performance.md.
const SECONDS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Powers of two up to the largest batch a lane sends.
const CHECKS_PER_CALL: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// How often histogram samples are folded in when nobody scrapes.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the process-wide recorder once and returns its handle; later
/// calls (several services in one test process) get the same one.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = builder().install_recorder().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "another metrics recorder is installed: /metrics will stay empty");
                builder().build_recorder().handle()
            });
            describe();
            gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            gauge!(DEGRADED).set(0.0);
            // At 0 from the start, so that increase() sees their first count.
            for name in [UPSERT_RETRIES, REFUSED, CLEANUP_DELETED] {
                counter!(name).increment(0);
            }
            for direction in ["to_memory", "to_postgres"] {
                counter!(SWITCHES, "direction" => direction).increment(0);
            }
            let _ = CALLS.set([histogram!(DB_CALL_DURATION), histogram!(BATCH_SIZE)]);
            let _ = PHASES.set(PHASE_NAMES.map(|phase| histogram!(CHECK_PHASE, "phase" => phase)));
            handle
        })
        .clone()
}

fn builder() -> PrometheusBuilder {
    let seconds = Matcher::Suffix("_seconds".into());
    PrometheusBuilder::new()
        .set_buckets_for_metric(seconds, SECONDS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), CHECKS_PER_CALL))
        .expect("the bucket lists are not empty")
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(CHECKS, "Checks decided, by policy, decision and the store that decided");
    describe_counter!(
        BUCKET_DENIALS,
        "Denials by the bucket that had no room (a check can be denied by several)"
    );
    describe_histogram!(CHECK_DURATION, Unit::Seconds, "Time to decide a check, by store");
    describe_histogram!(DB_CALL_DURATION, Unit::Seconds, "Time of one batch call to Postgres");
    describe_histogram!(BATCH_SIZE, "Checks decided by one call to Postgres");
    describe_histogram!(
        CHECK_PHASE,
        Unit::Seconds,
        "Where a check decided by Postgres spent its time: queued in the instance (queue), then its call (postgres: the statement, the commit and the round trip)"
    );
    describe_counter!(
        UPSERT_RETRIES,
        "Batches an upsert gave up on because another instance changed a bucket under it, decided again with locks"
    );
    describe_gauge!(DEGRADED, "1 while this instance answers without Postgres");
    describe_gauge!(
        INSTANCES,
        "Instances seen alive by this one's last heartbeat (itself included), all sharing its database"
    );
    describe_counter!(
        REFUSED,
        "Checks Postgres failed alone (a lock or statement timeout, or this instance's queue too long) while reachable, answered as their policy says for an unreachable store"
    );
    describe_counter!(SWITCHES, "Switches between Postgres and memory, by direction");
    describe_counter!(CLEANUP_DELETED, "Expired bucket rows deleted by the sampled cleanup");
    describe_counter!(RELOADS, "Policy file reloads, by result");
    describe_counter!(PROBLEMS, "Requests answered with a problem document, by problem type");
    describe_gauge!(BUILD_INFO, "Always 1; the labels say which build is running");
}

/// The call-duration and batch-size histograms, registered at [`install`]:
/// looking them up in the registry hashed their names on every call.
static CALLS: OnceLock<[Histogram; 2]> = OnceLock::new();

/// One batch call to Postgres, deciding `checks` checks.
pub fn db_call(took: Duration, checks: usize) {
    if let Some([duration, size]) = CALLS.get() {
        duration.record(took.as_secs_f64());
        size.record(checks as f64);
    }
}

/// The phases of [`CHECK_PHASE`].
const PHASE_NAMES: [&str; 2] = ["queue", "postgres"];
static PHASES: OnceLock<[Histogram; 2]> = OnceLock::new();

/// A check decided by Postgres: how long it waited in the instance for a
/// call, and how long the call took.
pub fn check_phases(queued: Duration, call: Duration) {
    if let Some([queue, postgres]) = PHASES.get() {
        queue.record(queued.as_secs_f64());
        postgres.record(call.as_secs_f64());
    }
}

/// A batch an upsert gave up on (40001, `pglimit_retry_with_locks`),
/// decided again with locks. Rare, so looked up rather than registered.
pub fn upsert_retried() {
    counter!(UPSERT_RETRIES).increment(1);
}

/// The instance switched to memory (`true`) or back to Postgres.
pub fn degraded(now: bool) {
    gauge!(DEGRADED).set(if now { 1.0 } else { 0.0 });
    let direction = if now { "to_memory" } else { "to_postgres" };
    counter!(SWITCHES, "direction" => direction).increment(1);
}

pub fn cleanup_deleted(rows: u64) {
    counter!(CLEANUP_DELETED).increment(rows);
}

/// A policy file will be reloaded: both results at 0 from the start, so
/// that the first failed reload is an increase an alert can see. (Without a
/// file there is nothing to reload, and no such series.)
pub fn reloads_expected() {
    for result in ["ok", "error"] {
        counter!(RELOADS, "result" => result).increment(0);
    }
}

pub fn policy_reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// The instances this one's heartbeat saw alive, itself included.
pub fn instances(alive: u64) {
    gauge!(INSTANCES).set(alive as f64);
}

/// Postgres failed a check alone (it is still reachable). Rare, so looked
/// up rather than registered.
pub fn postgres_refused() {
    counter!(REFUSED).increment(1);
}

/// A request answered with a problem document of this type.
pub fn problem(kind: &'static str) {
    counter!(PROBLEMS, "type" => kind).increment(1);
}
