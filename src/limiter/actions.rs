//! Acting on limits: a reset after a success, and an operator's blocks.
//! Each action is one transaction in Postgres that every instance hears of
//! (see `storage::ActionStore`); while Postgres is away they are refused.
//! An operator's act carries its audit row, built here where its buckets
//! are known ([`audited`]): keys by their prefix, never an identifier.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::checks::{bucket_spec, Checks, Decision};
use super::request::{self, CheckError, CheckRequest, Invalid, MAX_REASON_LEN};
use crate::policy::{parse_window, BucketDef, Policy};
use crate::storage::{
    self, key_prefix, Acting, AuditAction, AuditEntry, AuditQuery, AuditRow, Block, BlockTarget, Key, Store,
    StoreError,
};

/// A block's target and terms, as an operator gives them. Identifiers may
/// be some of the policy's: every bucket counting over only those is
/// blocked, unless `bucket` names one.
#[derive(Debug, Clone)]
pub struct BlockRequest {
    pub policy: String,
    pub identifiers: BTreeMap<String, String>,
    pub bucket: Option<String>,
    /// How long (`"15m"`); required to block, ignored to unblock.
    pub duration: Option<String>,
    pub reason: Option<String>,
}

/// Resets, blocks and unblocks. Through [`Checks`] it shares the store and
/// the policies, and a reset answers with a peek as `/check` would.
pub struct Actions<S> {
    checks: Checks<S>,
}

impl<S: Store + storage::ActionStore> Actions<S> {
    pub fn new(checks: Checks<S>) -> Self {
        Self { checks }
    }

    /// Puts the named buckets of `request`'s check (all of them by default)
    /// back to full and lifts their lockouts; answers a peek taken after.
    /// A reset `by` an operator is audited.
    pub async fn reset(
        &self,
        request: &CheckRequest,
        buckets: Option<&[String]>,
        by: Option<&Acting>,
    ) -> Result<Decision, CheckError> {
        // Refused as /check would refuse it, cost included; the cost plays no
        // part in the keys, so these are the peek's too.
        let plan = self.checks.plan(request)?;
        let policy = plan.counters.name().to_owned();
        let chosen: Vec<(Arc<str>, Key)> = match buckets {
            None => plan.check.buckets.iter().map(|b| (Arc::clone(&b.name), b.key)).collect(),
            Some(names) => names
                .iter()
                .map(|name| {
                    let found = plan.check.buckets.iter().find(|b| &*b.name == name.as_str());
                    found.map(|b| (Arc::clone(&b.name), b.key)).ok_or_else(|| Invalid::UnknownBucket {
                        field: "buckets",
                        name: name.clone(),
                        policy: policy.clone(),
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let audit = by.map(|by| audited(by, AuditAction::Reset, &policy, &chosen));
        let keys: Vec<Key> = chosen.iter().map(|(_, key)| *key).collect();
        self.store().reset(&keys, audit.as_ref()).await.map_err(unavailable)?;
        self.checks.check(&request.peek()).await
    }

    /// Blocks the target's bucket keys; returns them and when the block ends.
    pub async fn block(
        &self,
        request: &BlockRequest,
        by: &Acting,
    ) -> Result<(Vec<BlockTarget>, DateTime<Utc>), CheckError> {
        let duration =
            parse_window(request.duration.as_deref().ok_or(Invalid::BlockFor("is required".into()))?)
                .map_err(Invalid::BlockFor)?;
        if request.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_LEN) {
            return Err(Invalid::ReasonLength.into());
        }
        let targets = self.targets(request)?;
        let audit = audited_targets(by, AuditAction::Block, &targets)
            .with("for", crate::policy::format_window(duration))
            .with("reason", request.reason.clone());
        let reason = request.reason.as_deref();
        let until = self.store().block(&targets, duration, reason, &audit).await.map_err(unavailable)?;
        Ok((targets, until))
    }

    /// Lifts every block on the target's bucket keys; returns them and how
    /// many blocks there were.
    pub async fn unblock(
        &self,
        request: &BlockRequest,
        by: &Acting,
    ) -> Result<(Vec<BlockTarget>, u64), CheckError> {
        let targets = self.targets(request)?;
        let keys: Vec<Key> = targets.iter().map(|t| t.key).collect();
        let audit = audited_targets(by, AuditAction::Unblock, &targets);
        let lifted = self.store().unblock(&keys, &audit).await.map_err(unavailable)?;
        Ok((targets, lifted))
    }

    pub async fn blocks(&self, limit: u32) -> Result<Vec<Block>, CheckError> {
        self.store().blocks(limit).await.map_err(unavailable)
    }

    fn store(&self) -> &S {
        self.checks.store()
    }

    fn targets(&self, request: &BlockRequest) -> Result<Vec<BlockTarget>, Invalid> {
        let policies = self.checks.policies();
        let policy =
            policies.get(&request.policy).ok_or_else(|| Invalid::UnknownPolicy(request.policy.clone()))?;
        let values = request::some_identifiers(policy, &request.identifiers)?;
        let chosen: Vec<&BucketDef> = match &request.bucket {
            None => policy.buckets.iter().collect(),
            Some(name) => vec![named_bucket(policy, name)?],
        };
        let targets: Vec<BlockTarget> = chosen
            .into_iter()
            .filter_map(|b| bucket_spec(&self.checks.shared.secret, policy, b, &values, b.limit))
            .map(|spec| BlockTarget { key: spec.key, policy: policy.name.clone(), bucket: spec.name })
            .collect();
        if targets.is_empty() {
            return Err(no_bucket_covered(policy, request.bucket.as_deref(), &values));
        }
        Ok(targets)
    }
}

impl<S: Store + storage::AuditStore> Actions<S> {
    /// A page of the audit log, the newest first.
    pub async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, CheckError> {
        self.checks.store().audit(query).await.map_err(unavailable)
    }
}

/// The audit row of an act on `buckets` of `policy`: its target is
/// `policy/bucket`, or `policy/b1,b2` for several (in the policy's order),
/// and its detail the keys by their prefixes, bucket by bucket.
fn audited(by: &Acting, action: AuditAction, policy: &str, buckets: &[(Arc<str>, Key)]) -> AuditEntry {
    let names: Vec<&str> = buckets.iter().map(|(name, _)| &**name).collect();
    let keys: Vec<serde_json::Value> = buckets
        .iter()
        .map(|(name, key)| serde_json::json!({ "bucket": &**name, "key": key_prefix(key) }))
        .collect();
    AuditEntry::new(by, action, format!("{policy}/{}", names.join(","))).with("keys", keys)
}

fn audited_targets(by: &Acting, action: AuditAction, targets: &[BlockTarget]) -> AuditEntry {
    let policy = targets.first().map(|t| &*t.policy).unwrap_or_default();
    let buckets: Vec<(Arc<str>, Key)> = targets.iter().map(|t| (Arc::clone(&t.bucket), t.key)).collect();
    audited(by, action, policy, &buckets)
}

fn named_bucket<'p>(policy: &'p Policy, name: &str) -> Result<&'p BucketDef, Invalid> {
    policy.buckets.iter().find(|b| &*b.name == name).ok_or_else(|| Invalid::UnknownBucket {
        field: "bucket",
        name: name.to_owned(),
        policy: policy.name.to_string(),
    })
}

/// The identifiers are too few for any bucket asked for: name one missing.
fn no_bucket_covered(policy: &Policy, bucket: Option<&str>, values: &BTreeMap<&str, String>) -> Invalid {
    let wanted = policy.buckets.iter().filter(|b| bucket.is_none_or(|name| &*b.name == name));
    let missing = wanted.flat_map(|b| b.on.iter()).find(|f| !values.contains_key(f.as_str()));
    let name = missing.cloned().unwrap_or_default();
    Invalid::MissingIdentifier { name, policy: Arc::clone(&policy.name) }
}

fn unavailable(e: StoreError) -> CheckError {
    if !matches!(e, StoreError::Unavailable) {
        tracing::warn!(error = %e, "an action on limits failed");
    }
    CheckError::StoreUnavailable
}
