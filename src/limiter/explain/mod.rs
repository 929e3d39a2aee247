//! Why a check would be allowed or denied now, for one identity: the
//! support engineer's "why can't alice log in?". A check is planned as
//! `/check` plans it (keys, the override that matches), its buckets read
//! as they stand ([`InspectStore`]), and the model decides from that state
//! what `/check` would answer; nothing is counted, created or remembered.
//! The answer says which rule decided (a block, a lockout, a deny or allow
//! list entry, a bucket with no room), each bucket's state in its
//! algorithm's terms, and this instance's waiters on each key.

mod bucket;

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

pub use bucket::{BucketExplanation, KeyDenied, KEY_PREFIX_HEX};

use super::checks::{Applied, Checks, Matched, MatchedBy, Plan};
use super::request::{CheckError, CheckRequest};
use super::waiting::Waiting;
use crate::policy::OnStoreError;
use crate::storage::{InspectStore, Inspection, Key, KeyDenials, MemoryFallback, Store, StoreKind};

/// Explains checks. A handle over the checks' shared state and this
/// instance's waiting queues.
pub struct Explain<S> {
    checks: Checks<S>,
    waiting: Arc<Waiting<S>>,
}

impl<S: Store + InspectStore> Explain<S> {
    pub fn new(checks: Checks<S>, waiting: Arc<Waiting<S>>) -> Self {
        Self { checks, waiting }
    }

    /// What `/check` would answer to `request` now, and why.
    pub async fn explain(&self, request: &CheckRequest) -> Result<Explanation, CheckError> {
        let plan = self.checks.plan(request)?;
        // Refused as /check refuses it: slots where no lease is kept, a zone
        // the server does not know.
        self.checks.answerable(&plan.check)?;
        let inspection = self.checks.store().inspect(&plan.check).await.map_err(|error| {
            tracing::warn!(%error, "explain could not read the buckets");
            CheckError::StoreUnavailable
        })?;
        let queues = self.waiting.queues();
        let policy = matches!(request, CheckRequest::Policy { .. }).then(|| request.policy_label());
        Ok(explanation(&plan, policy, inspection, |key| queues.waiting_on(key)))
    }
}

/// What `/check` would answer, with the reasons.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// `None` for an ad hoc key.
    pub policy: Option<String>,
    pub cost: u64,
    /// What `/check` would answer now (a shadow policy: always true).
    pub allowed: bool,
    pub reason: Reason,
    pub why: String,
    /// The override entry that applies, if any.
    pub rule: Option<Rule>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_allow: Option<bool>,
    /// `postgres`, or `memory`: read from this instance during an outage.
    pub store: StoreKind,
    pub degraded: bool,
    #[serde(serialize_with = "rfc3339_ms")]
    pub checked_at: DateTime<Utc>,
    /// This instance repeats a remembered denial of this exact check until
    /// then without asking Postgres (see `storage::DenyCache`).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "some_rfc3339_ms")]
    pub remembered_denial_until: Option<DateTime<Utc>>,
    pub buckets: Vec<BucketExplanation>,
}

/// What decided, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Every bucket has room.
    Allowed,
    /// A bucket has no room for the cost.
    Denied,
    /// A bucket's key is blocked: an operator's block or a lockout.
    Blocked,
    /// An override admits it uncounted.
    AllowListed,
    /// An override refuses it uncounted.
    DenyListed,
    /// Postgres is away and the policy may not fall back to memory: its
    /// `on_store_error` decides.
    StoreUnavailable,
}

/// The override that applies, and where it is set.
#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    /// `file_override` (with `index`) or `api_override` (with `id`).
    pub by: &'static str,
    #[serde(flatten)]
    pub matched: Matched,
}

/// Assembles the explanation of `plan` from what the store holds.
fn explanation(
    plan: &Plan,
    policy: Option<&str>,
    mut inspection: Inspection,
    waiters: impl Fn(&Key) -> usize,
) -> Explanation {
    let (cost, now, share) = (plan.check.cost, inspection.now, inspection.share);
    let specs = plan.check.buckets.iter().zip(std::mem::take(&mut inspection.buckets));
    let buckets: Vec<BucketExplanation> = specs
        .map(|(spec, stored)| {
            let mut b = bucket::explain(spec, stored, cost, now, share);
            b.waiters = waiters(&spec.key);
            b
        })
        .collect();
    let outage = inspection.degraded && plan.check.fallback == MemoryFallback::Refuse;
    let (reason, allowed) = decide(plan, &buckets, outage);
    let rule = plan.matched.clone().map(|matched| Rule { by: by(&matched.by), matched });
    let mut why = sentence(reason, plan, &buckets, rule.as_ref());
    if inspection.store == StoreKind::Memory {
        why = format!("{} {why}", from_memory(&inspection));
    }
    if let Some(until) = inspection.remembered_until {
        why.push_str(&format!(
            " This instance repeats its last denial of this check until {} without asking the store.",
            at(&until)
        ));
    }
    Explanation {
        policy: policy.map(str::to_owned),
        cost,
        allowed: allowed || plan.shadow,
        reason,
        why,
        rule,
        shadow: plan.shadow,
        would_allow: plan.shadow.then_some(allowed),
        store: inspection.store,
        degraded: inspection.degraded,
        checked_at: now,
        remembered_denial_until: inspection.remembered_until,
        buckets,
    }
}

impl Explanation {
    /// Notes each bucket's denials in the top list, counted since `since`.
    pub fn with_denials(mut self, found: &[KeyDenials], since: DateTime<Utc>) -> Self {
        for bucket in &mut self.buckets {
            let of_key = found.iter().find(|d| d.key == bucket.full_key);
            bucket.denials = of_key.map(|d| KeyDenied { count: d.denials, last: d.last, since });
        }
        self
    }
}

/// The reason, and whether `/check` would admit it (before shadow mode).
fn decide(plan: &Plan, buckets: &[BucketExplanation], outage: bool) -> (Reason, bool) {
    let action = plan.matched.as_ref().map(|m| m.action);
    if action == Some(Applied::Deny) {
        return (Reason::DenyListed, false);
    }
    if outage {
        return (Reason::StoreUnavailable, plan.on_store_error == OnStoreError::Allow);
    }
    if buckets.iter().any(|b| b.block.is_some()) {
        return (Reason::Blocked, false);
    }
    match action {
        Some(Applied::Unlimited) => (Reason::AllowListed, true),
        _ if buckets.iter().all(|b| b.allowed) => (Reason::Allowed, true),
        _ => (Reason::Denied, false),
    }
}

fn by(matched: &MatchedBy) -> &'static str {
    match matched {
        MatchedBy::File { .. } => "file_override",
        MatchedBy::Api { .. } => "api_override",
    }
}

/// The whole answer in a sentence or two, naming the bucket or rule that decided.
fn sentence(reason: Reason, plan: &Plan, buckets: &[BucketExplanation], rule: Option<&Rule>) -> String {
    let rule_name = rule.map(rule_name).unwrap_or_default();
    let first = |pick: fn(&BucketExplanation) -> bool| buckets.iter().find(|b| pick(b));
    let named = |b: Option<&BucketExplanation>| b.map(|b| format!("bucket {:?} is {}", &*b.name, b.why));
    match reason {
        Reason::DenyListed => format!("Denied by {rule_name}, which refuses these identifiers uncounted."),
        Reason::AllowListed => format!("Allowed by {rule_name}, which admits these identifiers uncounted."),
        Reason::StoreUnavailable if plan.on_store_error == OnStoreError::Allow => {
            "Postgres cannot be reached and this policy does not fall back to memory: on_store_error = \"allow\" \
             admits it uncounted."
                .to_owned()
        }
        Reason::StoreUnavailable => "Postgres cannot be reached and this policy does not fall back to memory: \
                                     on_store_error = \"deny\" refuses it (503)."
            .to_owned(),
        Reason::Blocked => format!("Denied: {}.", named(first(|b| b.block.is_some())).unwrap_or_default()),
        Reason::Denied => {
            let denying = buckets.iter().filter(|b| !b.allowed).max_by_key(|b| b.retry_at);
            format!("Denied: bucket {:?} has {}.", denying.map_or("", |b| &b.name), denying.map_or("", |b| &b.why))
        }
        Reason::Allowed if rule.is_some() => {
            format!("Allowed under the limits of {rule_name}: every bucket has room for a cost of {}.", plan.check.cost)
        }
        Reason::Allowed => format!("Allowed: every bucket has room for a cost of {}.", plan.check.cost),
    }
}

fn rule_name(rule: &Rule) -> String {
    match &rule.matched.by {
        MatchedBy::File { index } => format!("the policy file's override #{index}"),
        MatchedBy::Api { id } => format!("API override {id}"),
    }
}

fn from_memory(inspection: &Inspection) -> String {
    let share = match inspection.share {
        1 => "the whole of each limit".to_owned(),
        n => format!("its share of each limit (1/{n}, one of {n} instances)"),
    };
    format!(
        "From this instance's memory: Postgres cannot be reached, so checks here are decided at {share}; \
         blocks are kept in Postgres and cannot be read now."
    )
}

/// Times as in every answer: RFC 3339, milliseconds, UTC.
fn at(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn rfc3339_ms<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at(t))
}

fn some_rfc3339_ms<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339_ms(t, s),
        None => s.serialize_none(),
    }
}
