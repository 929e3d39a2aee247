//! `pglimit_checks_total`, `pglimit_bucket_denials_total` and
//! `pglimit_check_duration_seconds`: what each check decided.
//!
//! Each policy's series are registered when its policies are loaded, and
//! only those of the outcomes that can happen to it (the limiter says which):
//! a fresh `/metrics` shows every series that can move, at 0, so that
//! `rate()` and `increase()` see a check's first count, and no series that
//! never will, such as a `shadow_denied` of a policy that enforces.

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, histogram, Counter, Histogram, SharedString};

use super::{BUCKET_DENIALS, CHECKS, CHECK_DURATION};

/// The `policy` label of ad hoc keys, which have no policy name.
pub const ADHOC: &str = "_adhoc";

/// What a check decided, as `pglimit_checks_total` counts it.
pub const DECISIONS: [&str; 4] = ["allowed", "denied", "shadow_denied", "error"];
/// Which store decided it.
pub const STORES: [&str; 4] = ["postgres", "memory", "none", "deny_cache"];

/// A check's labels: one of [`DECISIONS`], one of [`STORES`].
pub type Outcome = (&'static str, &'static str);

/// One policy's counters (or ad hoc keys'), registered once when the
/// policies are loaded, so that recording a check is an atomic add: looking
/// a labelled counter up in the registry on every check allocated and
/// hashed its labels, a measurable share of a denial answered from memory.
#[derive(Debug)]
pub struct PolicyCounters {
    name: Arc<str>,
    /// By decision, then store; `None` where the outcome cannot happen to
    /// this policy, so that its series is not shown.
    checks: Vec<Option<Counter>>,
    /// The check-duration histogram of each store that can decide its checks.
    durations: [Option<Histogram>; STORES.len()],
    denials: Vec<(Arc<str>, Counter)>,
}

impl PolicyCounters {
    /// Registers the counters of policy `name` (`None`: ad hoc keys, whose
    /// one bucket is `default`) for the outcomes that can happen to it, and
    /// of its buckets.
    pub fn new<'a>(
        name: Option<&Arc<str>>,
        buckets: impl IntoIterator<Item = &'a Arc<str>>,
        possible: &[Outcome],
    ) -> Self {
        let name = name.cloned().unwrap_or_else(|| Arc::from(ADHOC));
        let label = || SharedString::from(Arc::clone(&name));
        let checks = DECISIONS
            .iter()
            .flat_map(|d| STORES.iter().map(move |s| (*d, *s)))
            .map(|outcome| {
                let (decision, store) = outcome;
                possible
                    .contains(&outcome)
                    .then(|| counter!(CHECKS, "policy" => label(), "decision" => decision, "store" => store))
            })
            .collect();
        let durations = STORES.map(|store| {
            possible.iter().any(|(_, s)| *s == store).then(|| histogram!(CHECK_DURATION, "store" => store))
        });
        let denials = buckets
            .into_iter()
            .map(|b| {
                let bucket = SharedString::from(Arc::clone(b));
                (Arc::clone(b), counter!(BUCKET_DENIALS, "policy" => label(), "bucket" => bucket))
            })
            .collect();
        Self { name, checks, durations, denials }
    }

    /// The policy's name (`_adhoc` for ad hoc keys), to keep without copying.
    pub fn policy(&self) -> &Arc<str> {
        &self.name
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A decided (or failed) check: `decision` one of [`DECISIONS`], `store`
    /// one of [`STORES`]. An outcome thought impossible for this policy is
    /// still counted, by a lookup in the registry: a gap in that reasoning
    /// must cost a series, not a count.
    pub fn check(&self, decision: &str, store: &str, took: Duration) {
        let d = DECISIONS.iter().position(|x| *x == decision).unwrap_or(3);
        let s = STORES.iter().position(|x| *x == store).unwrap_or(2);
        match self.checks.get(d * STORES.len() + s) {
            Some(Some(counter)) => counter.increment(1),
            _ => counter!(CHECKS, "policy" => SharedString::from(Arc::clone(&self.name)),
                "decision" => DECISIONS[d], "store" => STORES[s])
            .increment(1),
        }
        match &self.durations[s] {
            Some(durations) => durations.record(took.as_secs_f64()),
            None => histogram!(CHECK_DURATION, "store" => STORES[s]).record(took.as_secs_f64()),
        }
    }

    /// A bucket that had no room for a check.
    pub fn bucket_denied(&self, bucket: &str) {
        if let Some((_, counter)) = self.denials.iter().find(|(name, _)| &**name == bucket) {
            counter.increment(1);
        }
    }
}
