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

use chrono::Utc;

pub use decision::{seconds_until, BucketDecision, Decision};
pub use key::{bucket_key, KeyScope, KeySecret, MIN_SECRET_LEN};
pub use request::{CheckRequest, Invalid, MAX_KEY_LEN};

use crate::policy::{FallbackShare, OnStoreError, Policies, Policy};
use crate::storage::{
    Answer, BucketAnswer, BucketSpec, CheckBatch, MemoryFallback, Store, StoreError, StoreKind,
};

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
    policies: Policies,
    secret: KeySecret,
}

impl<S: Store> Limiter<S> {
    pub fn new(store: S, policies: Policies, secret: KeySecret) -> Self {
        Self { store, policies, secret }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides `request`: `Ok` for both admitted and denied checks.
    pub async fn check(&self, request: &CheckRequest) -> Result<Decision, CheckError> {
        let (batch, on_store_error) = self.plan(request)?;
        let answer = match self.store.check(&batch).await {
            Ok(answer) => answer,
            Err(StoreError::Unavailable) if on_store_error == OnStoreError::Allow => admit_uncounted(&batch),
            Err(StoreError::Unavailable) => return Err(CheckError::StoreUnavailable),
            Err(e) => {
                tracing::error!(error = %e, "fallback store failed");
                return Err(CheckError::StoreUnavailable);
            }
        };
        Ok(Decision::new(&batch.buckets, answer))
    }

    /// The buckets `request` must check, with their keys, and what to do
    /// if Postgres cannot answer.
    pub fn plan(&self, request: &CheckRequest) -> Result<(CheckBatch, OnStoreError), Invalid> {
        match request {
            CheckRequest::Policy { policy, identifiers, cost } => {
                let policy =
                    self.policies.get(policy).ok_or_else(|| Invalid::UnknownPolicy(policy.clone()))?;
                let buckets = self.policy_buckets(policy, identifiers, *cost)?;
                let fallback = memory_fallback(policy.on_store_error, policy.fallback_share);
                Ok((CheckBatch { buckets, cost: *cost, fallback }, policy.on_store_error))
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
                };
                // Ad hoc keys fall back as a policy does by default.
                let (on_store_error, share) = (OnStoreError::default(), FallbackShare::default());
                let fallback = memory_fallback(on_store_error, share);
                Ok((CheckBatch { buckets: vec![spec], cost: *cost, fallback }, on_store_error))
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
        .map(|b| BucketAnswer { allowed: true, remaining: b.limit, reset_at: now, retry_at: None })
        .collect();
    Answer { buckets, now, store: StoreKind::None, degraded: true }
}
