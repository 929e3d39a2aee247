//! Turns a check request into buckets, asks the store, and shapes the answer.
//!
//! This is where requests are validated ([`request`]), where keys are
//! derived (never stored raw, [`key`]), where a policy's buckets become one
//! batch so that a check of any number of buckets is one store call, and
//! where a policy's choice for an unreachable store is applied.

mod decision;
mod key;
mod request;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use chrono::Utc;

pub use decision::{seconds_until, BucketDecision, Decision};
pub use key::{bucket_key, KeyScope, KeySecret, MIN_SECRET_LEN};
pub use request::{CheckRequest, Invalid, MAX_KEY_LEN};

use crate::policy::{FallbackShare, Mode, OnStoreError, Policies, Policy};
use crate::storage::{
    Answer, BucketAnswer, BucketSpec, CheckBatch, MemoryFallback, Store, StoreError, StoreKind,
};
use crate::telemetry::{self, Label};

/// Why a check has no decision. A denial is a decision, not one of these.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// Postgres cannot answer and the check's policy fails closed.
    #[error("the counter store is unavailable")]
    StoreUnavailable,
}

pub struct Limiter<S> {
    store: S,
    /// Swapped whole on reload: a check reads it once, so checks in flight
    /// finish on the policies they started with.
    policies: ArcSwap<Policies>,
    secret: KeySecret,
    /// `PGLIMIT_SHADOW`: every policy, and ad hoc keys, in shadow mode.
    shadow_all: bool,
}

/// What a request will check, and how its outcome is reported.
pub struct Plan {
    pub batch: CheckBatch,
    /// What to do if Postgres cannot answer.
    pub on_store_error: OnStoreError,
    /// Decided and counted, but never refused.
    pub shadow: bool,
    pub label: Label,
}

impl<S: Store> Limiter<S> {
    pub fn new(store: S, policies: Policies, secret: KeySecret) -> Self {
        Self { store, policies: ArcSwap::from_pointee(policies), secret, shadow_all: false }
    }

    /// Puts every policy, and ad hoc keys, in shadow mode.
    pub fn shadow_everything(self, shadow: bool) -> Self {
        Self { shadow_all: shadow, ..self }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policies in force.
    pub fn policies(&self) -> Arc<Policies> {
        self.policies.load_full()
    }

    /// Puts `policies` in force for every check that starts from now on.
    pub fn replace_policies(&self, policies: Policies) {
        self.policies.store(Arc::new(policies));
    }

    /// Decides `request`: `Ok` for both admitted and denied checks.
    pub async fn check(&self, request: &CheckRequest) -> Result<Decision, CheckError> {
        let plan = self.plan(request)?;
        let started = Instant::now();
        let answer = self.ask(&plan).await;
        let took = started.elapsed();
        let (answer, refused) =
            answer.inspect_err(|_| telemetry::check(&plan.label, "error", "none", took))?;
        let store = if answer.cached { "deny_cache" } else { answer.store.as_str() };
        let mut decision = Decision::new(&plan.batch.buckets, answer).shadowed(plan.shadow);
        if refused {
            decision.would_allow = Some(false);
        }
        telemetry::check(&plan.label, decision.outcome(), store, took);
        for bucket in decision.buckets.iter().filter(|b| !b.allowed) {
            telemetry::bucket_denied(&plan.label, &bucket.name);
        }
        Ok(decision)
    }

    /// The store's answer, and whether enforcing would have refused the
    /// check outright (a fail-closed policy with Postgres away): a shadow
    /// policy is admitted uncounted then, as it never turns traffic away.
    async fn ask(&self, plan: &Plan) -> Result<(Answer, bool), CheckError> {
        match self.store.check(&plan.batch).await {
            Ok(answer) => Ok((answer, false)),
            Err(StoreError::Unavailable) if plan.on_store_error == OnStoreError::Allow => {
                Ok((admit_uncounted(&plan.batch), false))
            }
            Err(StoreError::Unavailable) if plan.shadow => Ok((admit_uncounted(&plan.batch), true)),
            Err(StoreError::Unavailable) => Err(CheckError::StoreUnavailable),
            Err(e) => {
                tracing::error!(error = %e, "fallback store failed");
                Err(CheckError::StoreUnavailable)
            }
        }
    }

    /// The buckets `request` must check, with their keys, and what to do
    /// if Postgres cannot answer.
    pub fn plan(&self, request: &CheckRequest) -> Result<Plan, Invalid> {
        match request {
            CheckRequest::Policy { policy, identifiers, cost } => {
                let policies = self.policies.load();
                let policy = policies.get(policy).ok_or_else(|| Invalid::UnknownPolicy(policy.clone()))?;
                let buckets = self.policy_buckets(policy, identifiers, *cost)?;
                let fallback = memory_fallback(policy.on_store_error, policy.fallback_share);
                Ok(Plan {
                    batch: CheckBatch { buckets, cost: *cost, fallback },
                    on_store_error: policy.on_store_error,
                    shadow: self.shadow_all || policy.mode == Mode::Shadow,
                    label: Label::Policy(policy.name.clone()),
                })
            }
            CheckRequest::AdHoc { key, limit, window, algorithm, cost } => {
                let valid = request::ad_hoc(key, *limit, window, *algorithm, *cost)?;
                let scope = KeyScope::AdHoc { key: valid.key, algorithm: valid.algorithm };
                let spec = BucketSpec {
                    name: Arc::from("default"),
                    key: bucket_key(&self.secret, &scope),
                    limit: valid.limit,
                    window: valid.window,
                    algorithm: valid.algorithm,
                    lockout: None,
                };
                // Ad hoc keys fall back as a policy does by default.
                let (on_store_error, share) = (OnStoreError::default(), FallbackShare::default());
                let fallback = memory_fallback(on_store_error, share);
                Ok(Plan {
                    batch: CheckBatch { buckets: vec![spec], cost: *cost, fallback },
                    on_store_error,
                    shadow: self.shadow_all,
                    label: Label::AdHoc,
                })
            }
        }
    }

    fn policy_buckets(
        &self,
        policy: &Policy,
        raw: &BTreeMap<String, String>,
        cost: u64,
    ) -> Result<Vec<BucketSpec>, Invalid> {
        let values = request::identifiers(policy, raw, cost)?;
        let buckets = policy.buckets.iter().map(|b| {
            let parts: Vec<&str> =
                b.on.iter().map(|f| values.get(f.as_str()).map_or("", String::as_str)).collect();
            let scope = KeyScope::Policy {
                policy: &policy.name,
                bucket: &b.name,
                algorithm: b.algorithm,
                values: &parts,
            };
            BucketSpec {
                name: b.name.clone(),
                key: bucket_key(&self.secret, &scope),
                limit: b.limit,
                window: b.window,
                algorithm: b.algorithm,
                lockout: None,
            }
        });
        Ok(buckets.collect())
    }
}

/// What the store may do in memory for a check whose policy chose these.
fn memory_fallback(on_store_error: OnStoreError, share: FallbackShare) -> MemoryFallback {
    match (on_store_error, share) {
        (OnStoreError::Memory, FallbackShare::Split) => MemoryFallback::Split,
        (OnStoreError::Memory, FallbackShare::Full) => MemoryFallback::Full,
        (OnStoreError::Allow | OnStoreError::Deny, _) => MemoryFallback::Refuse,
    }
}

/// The answer for `on_store_error = "allow"`: admitted, nothing counted.
fn admit_uncounted(batch: &CheckBatch) -> Answer {
    let now = Utc::now();
    let buckets = batch
        .buckets
        .iter()
        .map(|b| BucketAnswer { allowed: true, remaining: b.limit, reset_at: now, retry_at: None, blocked: false })
        .collect();
    Answer { buckets, now, store: StoreKind::None, degraded: true, cached: false }
}
