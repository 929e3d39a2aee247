//! The `/check` path: a request planned into buckets (`plan.rs`: keys,
//! limits, a matching override), asked of the store in one call, and
//! shaped into a [`Decision`] (`decision.rs`) counted under its outcome.

mod decision;
mod plan;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;

pub use decision::{seconds_until, BucketDecision, Decision, Granted};
pub(super) use plan::bucket_spec;
pub use plan::{Applied, Matched, MatchedBy, Plan};

use super::denials::Denial;
use super::leases;
use super::request::{CheckError, CheckRequest, Invalid};
use super::shared::Shared;
use crate::algorithm::Algorithm;
use crate::policy::{OnStoreError, Policies};
use crate::storage::{Answer, BucketAnswer, Check, Store, StoreError, StoreKind};

/// Decides checks. A handle: clones share one [`Shared`].
pub struct Checks<S> {
    pub(super) shared: Arc<Shared<S>>,
}

impl<S> Clone for Checks<S> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<S: Store> Checks<S> {
    pub fn new(shared: Arc<Shared<S>>) -> Self {
        Self { shared }
    }

    /// The store checks are asked of.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The policies in force.
    pub fn policies(&self) -> Arc<Policies> {
        self.shared.policies()
    }

    /// The state every service shares: which policies shadow, and this
    /// instance's recent minutes.
    pub fn shared(&self) -> &Shared<S> {
        &self.shared
    }

    /// The buckets `request` must check, with their keys, and what to do
    /// if Postgres cannot answer.
    pub fn plan(&self, request: &CheckRequest) -> Result<Plan, Invalid> {
        let shared = &*self.shared;
        let in_force = shared.in_force.load();
        let counters = |name: &str| in_force.counters(name, &shared.adhoc);
        let api = shared.api_overrides.load();
        plan::plan(&in_force.policies, &api, &shared.secret, shared.shadow_all, request, counters)
    }

    /// Decides `request`: `Ok` for both admitted and denied checks. A
    /// denial is counted for the top list.
    pub async fn check(&self, request: &CheckRequest) -> Result<Decision, CheckError> {
        let (plan, decision) = self.decide(request).await?;
        self.tally(&plan, &decision);
        Ok(decision)
    }

    /// As [`Checks::check`], uncounted for the top list: for a held check's
    /// attempts, of which only the answer is counted ([`Checks::tally_answer`]).
    pub(in crate::limiter) async fn attempt(&self, request: &CheckRequest) -> Result<Decision, CheckError> {
        self.decide(request).await.map(|(_, decision)| decision)
    }

    /// Counts `decision`, the answer to `request`, for the top list.
    pub(in crate::limiter) fn tally_answer(&self, request: &CheckRequest, decision: &Decision) {
        if !decision.allowed && self.shared.tally.is_on() {
            if let Ok(plan) = self.plan(request) {
                self.tally(&plan, decision);
            }
        }
    }

    /// Counts each bucket that denied a refused check (a deny list refuses
    /// in every bucket); a shadow policy's denial was answered as allowed.
    fn tally(&self, plan: &Plan, decision: &Decision) {
        let tally = &self.shared.tally;
        if decision.allowed || !tally.is_on() {
            return;
        }
        let (at, policy) = (Utc::now(), plan.counters.policy());
        for (i, bucket) in decision.buckets.iter().enumerate().filter(|(_, b)| !b.allowed) {
            let shown = plan.shown.get(i).and_then(Option::as_ref);
            tally.add(at, Denial { key: bucket.key, policy, bucket: &bucket.name, shown });
        }
    }

    /// The plan of `request` and its decision, counted in the metrics.
    async fn decide(&self, request: &CheckRequest) -> Result<(Plan, Decision), CheckError> {
        let mut plan = self.plan(request)?;
        self.answerable(&plan.check)?;
        let max_life = || leases::max_life(&self.policies(), request);
        let lease = takes_lease(&plan.check).then(|| leases::mint(max_life()));
        plan.check.lease = lease.as_ref().map(|(_, stored)| *stored);
        let started = Instant::now();
        let answer = self.ask(&plan).await;
        let took = started.elapsed();
        let (answer, refused) = answer.inspect_err(|_| plan.counters.check("error", "none", took))?;
        let granted = lease.and_then(|(id, _)| granted(&plan.check, &answer, id));
        let decision = decision(&plan, answer, granted, refused);
        count(&plan, &decision, took);
        self.shared.minutes.check(decision.outcome() == "denied");
        Ok((plan, decision))
    }

    /// Refuses, alone and before it joins a batch, a check the store could
    /// not decide: slots where no lease can be kept, or a calendar zone the
    /// Postgres server does not know.
    pub(in crate::limiter) fn answerable(&self, check: &Check) -> Result<(), Invalid> {
        let store = &self.shared.store;
        if let Some(slots) = check.buckets.iter().find(|b| b.algorithm == Algorithm::Concurrency) {
            if !store.keeps_leases() {
                return Err(Invalid::NoLeases { bucket: slots.name.clone() });
            }
        }
        plan::zones_known(check, |zone| store.knows_zone(zone))
    }

    /// The store's answer, and whether enforcing would have refused the
    /// check outright (a fail-closed policy with Postgres away): a shadow
    /// policy is admitted uncounted then, as it never turns traffic away.
    /// A deny-listed check does not ask the store at all; an allow-listed
    /// one only peeks for blocks.
    async fn ask(&self, plan: &Plan) -> Result<(Answer, bool), CheckError> {
        match plan.matched.as_ref().map(|m| m.action) {
            Some(Applied::Deny) => {
                return Ok((uncounted(&plan.check, false, self.shared.store.is_degraded()), false))
            }
            Some(Applied::Unlimited) => return Ok((self.unless_blocked(&plan.check).await, false)),
            Some(Applied::Limits) | None => {}
        }
        match self.shared.store.check(&plan.check).await {
            Ok(answer) => Ok((answer, false)),
            Err(StoreError::Unavailable) if plan.on_store_error == OnStoreError::Allow => {
                Ok((uncounted(&plan.check, true, true), false))
            }
            Err(StoreError::Unavailable) if plan.shadow => Ok((uncounted(&plan.check, true, true), true)),
            Err(StoreError::Unavailable) => Err(CheckError::StoreUnavailable),
            Err(e) => {
                tracing::error!(error = %e, "fallback store failed");
                Err(CheckError::StoreUnavailable)
            }
        }
    }

    /// An allow-listed check: admitted uncounted, unless one of its keys is
    /// blocked. A block names this key while an allow-list names a range
    /// (and a `trusted_hops` set too low can put every client in it), so
    /// the block wins. The peek counts nothing; if the store cannot answer
    /// it, the allow-list stands, as it did before blocks were asked.
    async fn unless_blocked(&self, check: &Check) -> Answer {
        let peek = Check { cost: 0, ..check.clone() };
        match self.shared.store.check(&peek).await {
            Ok(mut answer) if answer.buckets.iter().any(|b| b.blocked) => {
                for bucket in answer.buckets.iter_mut().filter(|b| !b.blocked) {
                    bucket.allowed = true;
                    bucket.retry_at = None;
                }
                answer
            }
            _ => uncounted(check, true, self.shared.store.is_degraded()),
        }
    }
}

/// The store's `answer` to `plan` as the caller sees it: with the lease
/// it took, the override that matched, and in shadow mode admitted.
fn decision(plan: &Plan, answer: Answer, lease: Option<Granted>, refused: bool) -> Decision {
    let mut decision = Decision::new(&plan.check.buckets, answer);
    decision.lease = lease;
    if let Some(matched) = &plan.matched {
        decision = decision.overridden(matched.clone());
    }
    let mut decision = decision.shadowed(plan.shadow);
    if refused {
        decision.would_allow = Some(false);
    }
    decision
}

/// Counts `decision` under its outcome, and each bucket that denied it;
/// a deny list's refusal is no bucket's denial.
fn count(plan: &Plan, decision: &Decision, took: Duration) {
    plan.counters.check(decision.outcome(), decision.store_label(), took);
    let by_buckets = plan.matched.as_ref().is_none_or(|m| m.action != Applied::Deny);
    for bucket in decision.buckets.iter().filter(|b| !b.allowed && by_buckets) {
        plan.counters.bucket_denied(&bucket.name);
    }
}

/// Whether an admitted `check` would hold slots: it has a concurrency bucket
/// and a cost (a peek takes nothing).
fn takes_lease(check: &Check) -> bool {
    check.cost > 0 && check.buckets.iter().any(|b| b.algorithm == Algorithm::Concurrency)
}

/// The lease `id`, if Postgres admitted the check and so wrote it; ending
/// with the shortest lease time among its buckets. A check admitted from
/// memory during an outage gets none: its slots end by themselves.
fn granted(check: &Check, answer: &Answer, id: String) -> Option<Granted> {
    if !answer.allowed() || answer.store != StoreKind::Postgres {
        return None;
    }
    let concurrency = check.buckets.iter().filter(|b| b.algorithm == Algorithm::Concurrency);
    let shortest = concurrency.map(|b| b.window).min()?;
    let expires_at = answer.now + chrono::TimeDelta::from_std(shortest).ok()?;
    Some(Granted { id, expires_at })
}

/// An answer no store decided: nothing counted. Admitted (`allowed`:
/// `on_store_error = "allow"`, a shadow policy in an outage, an allow list)
/// or refused (a deny list).
fn uncounted(check: &Check, allowed: bool, degraded: bool) -> Answer {
    let now = Utc::now();
    let buckets = check
        .buckets
        .iter()
        .map(|b| BucketAnswer {
            allowed,
            remaining: if allowed { b.limit } else { 0 },
            reset_at: now,
            retry_at: None,
            blocked: false,
        })
        .collect();
    Answer { buckets, now, store: StoreKind::None, degraded, cached: false, timing: None }
}
