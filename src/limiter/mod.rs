//! Turns a check request into buckets, asks the store, and shapes the answer.
//!
//! This is where identifiers are validated and normalised, where keys are
//! derived (never stored raw), and where a policy's buckets become one batch
//! so that a check of any number of buckets is one store call.

mod decision;
mod key;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use decision::{seconds_until, BucketDecision, Decision};
pub use key::{bucket_key, KeyScope, KeySecret, MIN_SECRET_LEN};

use crate::algorithm::Algorithm;
use crate::error::Error;
use crate::policy::{Policies, Policy};
use crate::storage::{BucketSpec, CheckBatch, OnStoreError, Store, StoreError};

/// Longest ad hoc key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// A validated check request, in one of its two forms.
#[derive(Debug, Clone)]
pub enum CheckRequest {
    Policy { policy: String, identifiers: BTreeMap<String, String>, cost: u64 },
    AdHoc { key: String, limit: u64, window: Duration, algorithm: Algorithm, cost: u64 },
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
    pub async fn check(&self, request: &CheckRequest) -> Result<Decision, Error> {
        let batch = self.plan(request)?;
        match self.store.check(&batch).await {
            Ok(checked) => Ok(Decision::new(&batch.buckets, checked)),
            Err(StoreError::Unavailable) => Err(Error::StoreUnavailable),
            Err(e) => {
                tracing::error!(error = %e, "fallback store failed");
                Err(Error::StoreUnavailable)
            }
        }
    }

    /// The buckets `request` must check, with their keys.
    pub fn plan(&self, request: &CheckRequest) -> Result<CheckBatch, Error> {
        match request {
            CheckRequest::Policy { policy, identifiers, cost } => {
                let policy = self.policies.get(policy).ok_or_else(|| Error::UnknownPolicy(policy.clone()))?;
                self.plan_policy(policy, identifiers, *cost)
            }
            CheckRequest::AdHoc { key, limit, window, algorithm, cost } => {
                let spec = BucketSpec {
                    name: Arc::from("default"),
                    key: bucket_key(&self.secret, &KeyScope::AdHoc { key, algorithm: *algorithm }),
                    limit: *limit,
                    window: *window,
                    algorithm: *algorithm,
                };
                Ok(CheckBatch { buckets: vec![spec], cost: *cost, on_store_error: OnStoreError::Memory })
            }
        }
    }

    fn plan_policy(
        &self,
        policy: &Policy,
        raw: &BTreeMap<String, String>,
        cost: u64,
    ) -> Result<CheckBatch, Error> {
        if let Some(extra) = raw.keys().find(|k| !policy.identifiers.contains_key(*k)) {
            let expected: Vec<&str> = policy.identifiers.keys().map(String::as_str).collect();
            let detail = format!(
                "{extra:?} is not an identifier of policy {:?} (expected: {})",
                policy.name,
                expected.join(", ")
            );
            return Err(Error::field(format!("identifiers.{extra}"), detail));
        }
        let mut values = BTreeMap::new();
        for (field, kind) in &policy.identifiers {
            let at = format!("identifiers.{field}");
            let raw = raw
                .get(field)
                .ok_or_else(|| Error::field(&at, format!("{at} is required by policy {:?}", policy.name)))?;
            let value = kind.normalise(raw).map_err(|why| Error::field(&at, format!("{at} {why}")))?;
            values.insert(field.as_str(), value);
        }
        if let Some(b) = policy.buckets.iter().find(|b| cost > b.limit) {
            return Err(Error::field(
                "cost",
                format!(
                    "cost {cost} exceeds the limit {} of bucket {:?}, so it could never be allowed",
                    b.limit, b.name
                ),
            ));
        }
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
        Ok(CheckBatch { buckets: buckets.collect(), cost, on_store_error: policy.on_store_error })
    }
}
