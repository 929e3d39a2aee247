//! From a validated request to the buckets it checks: keys, limits (a
//! matching override's, if any), lockouts, and what to do if Postgres
//! cannot answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::limiter::key::{bucket_key, KeyScope, KeySecret};
use crate::limiter::overrides::in_force::ApiOverrides;
use crate::limiter::request::{self, AdHoc, CheckRequest, Invalid};
use crate::policy::{BucketDef, FallbackShare, Mode, OnStoreError, OverrideAction, Policies, Policy};
use crate::storage::{BucketSpec, Check, Lockout, MemoryFallback};
use crate::telemetry::PolicyCounters;

/// What a request will check, and how its outcome is reported.
pub struct Plan {
    pub check: Check,
    /// What to do if Postgres cannot answer.
    pub on_store_error: OnStoreError,
    /// Decided and counted, but never refused.
    pub shadow: bool,
    /// The policy's counters (or ad hoc keys').
    pub counters: Arc<PolicyCounters>,
    /// The override entry that matched, if any.
    pub matched: Option<Matched>,
    /// For each bucket of `check`, the identifiers its policy shows in the
    /// top list, as a JSON object; empty when the policy shows none.
    pub shown: Vec<Option<Arc<str>>>,
}

/// An override that applies to a check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Matched {
    #[serde(flatten)]
    pub by: MatchedBy,
    pub action: Applied,
}

/// Which override: the answer's `override` has `index` or `id`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum MatchedBy {
    /// Its position among the policy file's `[[overrides]]`, from 0.
    File { index: usize },
    /// An override set through the API, by its id.
    Api { id: Arc<str> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// Other limits, counted as usual.
    Limits,
    /// Admitted, not counted.
    Unlimited,
    /// Refused, nothing asked of the store.
    Deny,
}

/// What `request` checks, under the policies and the API overrides in
/// force, counted on `counters` of its policy (or of ad hoc keys).
pub(super) fn plan(
    policies: &Policies,
    api: &ApiOverrides,
    secret: &KeySecret,
    shadow_all: bool,
    request: &CheckRequest,
    counters: impl Fn(&str) -> Arc<PolicyCounters>,
) -> Result<Plan, Invalid> {
    match request {
        CheckRequest::Policy { policy, identifiers, cost } => {
            let policy = policies.get(policy).ok_or_else(|| Invalid::UnknownPolicy(policy.clone()))?;
            let values = request::identifiers(policy, identifiers, *cost)?;
            let matched = matched(api, secret, policy, &values);
            let over = matched.as_ref().map(|(_, action)| *action);
            let check = policy_check(secret, policy, &values, *cost, over);
            Ok(Plan {
                shown: shown(policy, &values, &check),
                check,
                on_store_error: policy.on_store_error,
                shadow: shadow_all || policy.mode == Mode::Shadow,
                counters: counters(&policy.name),
                matched: matched.map(|(by, action)| Matched { by, action: applied(action) }),
            })
        }
        CheckRequest::AdHoc { key, limit, window, timezone, algorithm, cost } => {
            let valid = request::ad_hoc(key, *limit, window, timezone.as_deref(), *algorithm, *cost)?;
            let check = ad_hoc_check(secret, &valid, *cost);
            let (on_store_error, counters) = (OnStoreError::default(), counters(crate::telemetry::ADHOC));
            Ok(Plan { check, on_store_error, shadow: shadow_all, counters, matched: None, shown: Vec::new() })
        }
    }
}

/// For each bucket of `check`, the values of its identifiers that `policy`
/// marks `show = true`, as a JSON object (`None`: it counts over none).
/// Nothing for a policy that shows none, which is the common case.
fn shown(policy: &Policy, values: &BTreeMap<&str, String>, check: &Check) -> Vec<Option<Arc<str>>> {
    if policy.shown.is_empty() {
        return Vec::new();
    }
    let of_bucket = |spec: &BucketSpec| {
        let def = policy.buckets.iter().find(|b| b.name == spec.name)?;
        let shown: serde_json::Map<String, serde_json::Value> = (def.on.iter())
            .filter(|field| policy.shown.contains(*field))
            .filter_map(|field| Some((field.clone(), values.get(field.as_str())?.as_str().into())))
            .collect();
        (!shown.is_empty()).then(|| Arc::from(serde_json::Value::Object(shown).to_string()))
    };
    check.buckets.iter().map(of_bucket).collect()
}

/// The override that applies to these values of `policy`, the API's or
/// the file's, and which one it is.
fn matched<'a>(
    api: &'a ApiOverrides,
    secret: &KeySecret,
    policy: &'a Policy,
    values: &BTreeMap<&str, String>,
) -> Option<(MatchedBy, &'a OverrideAction)> {
    let api = api.matching(secret, &policy.name, values);
    let api = api.map(|o| (MatchedBy::Api { id: Arc::clone(&o.id) }, &o.action));
    let file = policy.override_for(values).map(|o| (MatchedBy::File { index: o.index }, &o.action));
    stronger(api, file)
}

/// Every bucket of `policy` over `values`, each at the limit that `over`
/// (the action of the override that matched, if any) gives it.
fn policy_check(
    secret: &KeySecret,
    policy: &Policy,
    values: &BTreeMap<&str, String>,
    cost: u64,
    over: Option<&OverrideAction>,
) -> Check {
    let limits = |b: &BucketDef| policy.limit_for(b, over);
    let buckets = policy.buckets.iter().filter_map(|b| bucket_spec(secret, policy, b, values, limits(b)));
    let fallback = memory_fallback(policy.on_store_error, policy.fallback_share);
    Check { buckets: buckets.collect(), cost, fallback, lease: None }
}

/// An ad hoc key's one bucket. It falls back as a policy does by default.
fn ad_hoc_check(secret: &KeySecret, valid: &AdHoc<'_>, cost: u64) -> Check {
    let scope = KeyScope::AdHoc { key: valid.key, algorithm: valid.algorithm };
    let spec = BucketSpec {
        name: Arc::from("default"),
        key: bucket_key(secret, &scope),
        limit: valid.limit,
        window: valid.window,
        algorithm: valid.algorithm,
        lockout: None,
        calendar: valid.calendar,
    };
    let fallback = memory_fallback(OnStoreError::default(), FallbackShare::default());
    Check { buckets: vec![spec], cost, fallback, lease: None }
}

/// Which of the API's and the file's overrides applies: a deny from either,
/// else the API's (set for one customer, it is meant to win over the
/// file's, which are for everyone). Blocks are checked apart, and beat both.
fn stronger<'a>(
    api: Option<(MatchedBy, &'a OverrideAction)>,
    file: Option<(MatchedBy, &'a OverrideAction)>,
) -> Option<(MatchedBy, &'a OverrideAction)> {
    match (api, file) {
        (Some(api), Some(file)) if file.1.is_deny() && !api.1.is_deny() => Some(file),
        (Some(api), _) => Some(api),
        (None, file) => file,
    }
}

fn applied(action: &OverrideAction) -> Applied {
    match action {
        OverrideAction::Limits(_) => Applied::Limits,
        OverrideAction::Unlimited => Applied::Unlimited,
        OverrideAction::Deny => Applied::Deny,
    }
}

/// Bucket `b` of `policy` over these normalised values, or `None` if a
/// value it counts over is not among them (a block may name only some).
pub(in crate::limiter) fn bucket_spec(
    secret: &KeySecret,
    policy: &Policy,
    b: &BucketDef,
    values: &BTreeMap<&str, String>,
    limit: u64,
) -> Option<BucketSpec> {
    let parts: Option<Vec<&str>> = b.on.iter().map(|f| values.get(f.as_str()).map(String::as_str)).collect();
    let parts = parts?;
    let scope =
        KeyScope::Policy { policy: &policy.name, bucket: &b.name, algorithm: b.algorithm, values: &parts };
    let lockout =
        b.block_for.map(|duration| Lockout { duration, name: format!("{}/{}", policy.name, b.name).into() });
    Some(BucketSpec {
        name: b.name.clone(),
        key: bucket_key(secret, &scope),
        limit,
        window: b.window,
        algorithm: b.algorithm,
        lockout,
        calendar: b.calendar,
    })
}

/// Refuses a check with a calendar zone the store cannot decide (one a
/// Postgres server's older tzdata lacks) alone, before it joins a batch
/// whose every check that zone would fail.
pub(super) fn zones_known(check: &Check, knows: impl Fn(&str) -> bool) -> Result<(), Invalid> {
    let unknown = |b: &BucketSpec| b.calendar.map(|c| c.zone.name()).filter(|zone| !knows(zone));
    match check.buckets.iter().find_map(|b| Some((&b.name, unknown(b)?))) {
        None => Ok(()),
        Some((bucket, zone)) => Err(Invalid::Timezone(format!(
            "timezone {zone:?} (bucket {bucket:?}): the PostgreSQL server does not know this zone (its \
             pg_timezone_names lacks it: its tzdata is older than pglimit's); update the server's tzdata \
             or use another zone"
        ))),
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
