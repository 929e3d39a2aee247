//! Turns a check request into buckets, asks the store, and shapes the answer.
//!
//! This is where requests are validated ([`request`]), where keys are
//! derived (never stored raw, [`key`]), where a policy's buckets become one
//! batch so that a check of any number of buckets is one store call, and
//! where a policy's choice for an unreachable store is applied.

mod actions;
mod api_overrides;
mod decision;
mod key;
mod lease;
mod outcomes;
mod override_requests;
mod plan;
mod request;
mod waiters;
mod waiting;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use chrono::Utc;

pub use actions::BlockRequest;
pub use decision::{seconds_until, BucketDecision, Decision};
pub use key::{bucket_key, KeyScope, KeySecret, MIN_SECRET_LEN};
pub use lease::{refused_leasing, Granted};
use outcomes::Shape;
pub use override_requests::{watch_overrides, OverrideError, OverrideRequest};
pub use plan::{Applied, Matched, MatchedBy, Plan};
pub use request::{CheckRequest, Invalid, MAX_KEY_LEN};
pub use waiters::{WaitLimits, Waiters};
pub use waiting::wake_on_releases;

use crate::algorithm::Algorithm;
use crate::policy::{OnStoreError, Policies};
use crate::storage::{Answer, BucketAnswer, Check, Store, StoreError, StoreKind};
use crate::telemetry::PolicyCounters;

/// Why a check (or an action) has no answer. A denial is a decision, not
/// one of these.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// Postgres cannot answer and the check's policy fails closed (or the
    /// action needs Postgres).
    #[error("the counter store is unavailable")]
    StoreUnavailable,
}

pub struct Limiter<S> {
    store: S,
    /// Swapped whole on reload: a check reads it once, so checks in flight
    /// finish on the policies they started with.
    in_force: ArcSwap<InForce>,
    /// The counters of ad hoc keys.
    adhoc: Arc<PolicyCounters>,
    secret: KeySecret,
    /// `PGLIMIT_SHADOW`: every policy, and ad hoc keys, in shadow mode.
    shadow_all: bool,
    /// Overrides set through the API, swapped whole on every change.
    api_overrides: ArcSwap<api_overrides::ApiOverrides>,
    /// Held while loading them (see [`Limiter::refresh_overrides`]).
    refreshing: tokio::sync::Mutex<()>,
    /// Checks held by `max_wait` ([`waiting`]).
    waiters: Waiters,
}

/// The policies in force, and their metrics, registered with them.
struct InForce {
    policies: Arc<Policies>,
    counters: HashMap<String, Arc<PolicyCounters>>,
}

impl InForce {
    /// Registers each policy's metrics for the outcomes it can have.
    fn new(policies: Policies, shadow_all: bool) -> Self {
        let counters = policies
            .iter()
            .map(|p| {
                let (buckets, outcomes) =
                    (p.buckets.iter().map(|b| &b.name), Shape::of(p, shadow_all).outcomes());
                (p.name.to_string(), Arc::new(PolicyCounters::new(Some(&p.name), buckets, &outcomes)))
            })
            .collect();
        Self { policies: Arc::new(policies), counters }
    }
}

impl<S: Store> Limiter<S> {
    /// `shadow_all` (`PGLIMIT_SHADOW`) puts every policy, and ad hoc keys,
    /// in shadow mode.
    pub fn new(store: S, policies: Policies, secret: KeySecret, shadow_all: bool) -> Self {
        plan::warn_unknown_zones(&policies, |zone| store.knows_zone(zone));
        let outcomes = Shape::ad_hoc(shadow_all).outcomes();
        let adhoc = Arc::new(PolicyCounters::new(None, [&Arc::from("default")], &outcomes));
        let in_force = ArcSwap::from_pointee(InForce::new(policies, shadow_all));
        let (api_overrides, refreshing) = (ArcSwap::default(), tokio::sync::Mutex::new(()));
        let waiters = Waiters::new(WaitLimits::default());
        Self { store, in_force, adhoc, secret, shadow_all, api_overrides, refreshing, waiters }
    }

    /// The same limiter, holding checks within `limits` (the defaults
    /// otherwise).
    pub fn with_waiting(self, limits: WaitLimits) -> Self {
        crate::telemetry::waits_expected(limits.max_waiting > 0);
        Self { waiters: Waiters::new(limits), ..self }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policies in force.
    pub fn policies(&self) -> Arc<Policies> {
        Arc::clone(&self.in_force.load().policies)
    }

    /// Puts `policies` in force for every check that starts from now on.
    pub fn replace_policies(&self, policies: Policies) {
        plan::warn_unknown_zones(&policies, |zone| self.store.knows_zone(zone));
        self.in_force.store(Arc::new(InForce::new(policies, self.shadow_all)));
    }

    /// The buckets `request` must check, with their keys, and what to do
    /// if Postgres cannot answer.
    pub fn plan(&self, request: &CheckRequest) -> Result<Plan, Invalid> {
        let in_force = self.in_force.load();
        let counters =
            |name: &str| in_force.counters.get(name).cloned().unwrap_or_else(|| Arc::clone(&self.adhoc));
        let api = self.api_overrides.load();
        plan::plan(&in_force.policies, &api, &self.secret, self.shadow_all, request, counters)
    }

    /// Decides `request`: `Ok` for both admitted and denied checks.
    pub async fn check(&self, request: &CheckRequest) -> Result<Decision, CheckError> {
        let mut plan = self.plan(request)?;
        if let Some(slots) = plan.check.buckets.iter().find(|b| b.algorithm == Algorithm::Concurrency) {
            if !self.store.keeps_leases() {
                return Err(CheckError::Invalid(Invalid::NoLeases { bucket: slots.name.clone() }));
            }
        }
        plan::zones_known(&plan.check, |zone| self.store.knows_zone(zone))?;
        let max_life = || lease::max_life(&self.policies(), request);
        let lease = takes_lease(&plan.check).then(|| lease::mint(max_life()));
        plan.check.lease = lease.as_ref().map(|(_, stored)| *stored);
        let started = Instant::now();
        let answer = self.ask(&plan).await;
        let took = started.elapsed();
        let (answer, refused) = answer.inspect_err(|_| plan.counters.check("error", "none", took))?;
        let granted = lease.and_then(|(id, _)| granted(&plan.check, &answer, id));
        let mut decision = Decision::new(&plan.check.buckets, answer);
        decision.lease = granted;
        if let Some(matched) = &plan.matched {
            decision = decision.overridden(matched.clone());
        }
        let mut decision = decision.shadowed(plan.shadow);
        if refused {
            decision.would_allow = Some(false);
        }
        plan.counters.check(decision.outcome(), decision.store_label(), took);
        let by_buckets = plan.matched.as_ref().is_none_or(|m| m.action != Applied::Deny);
        for bucket in decision.buckets.iter().filter(|b| !b.allowed && by_buckets) {
            plan.counters.bucket_denied(&bucket.name);
        }
        Ok(decision)
    }

    /// The store's answer, and whether enforcing would have refused the
    /// check outright (a fail-closed policy with Postgres away): a shadow
    /// policy is admitted uncounted then, as it never turns traffic away.
    /// A deny-listed check does not ask the store at all; an allow-listed
    /// one only peeks for blocks.
    async fn ask(&self, plan: &Plan) -> Result<(Answer, bool), CheckError> {
        match plan.matched.as_ref().map(|m| m.action) {
            Some(Applied::Deny) => {
                return Ok((uncounted(&plan.check, false, self.store.is_degraded()), false))
            }
            Some(Applied::Unlimited) => return Ok((self.unless_blocked(&plan.check).await, false)),
            Some(Applied::Limits) | None => {}
        }
        match self.store.check(&plan.check).await {
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
        match self.store.check(&peek).await {
            Ok(mut answer) if answer.buckets.iter().any(|b| b.blocked) => {
                for bucket in answer.buckets.iter_mut().filter(|b| !b.blocked) {
                    bucket.allowed = true;
                    bucket.retry_at = None;
                }
                answer
            }
            _ => uncounted(check, true, self.store.is_degraded()),
        }
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
