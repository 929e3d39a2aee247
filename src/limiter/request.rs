//! A check request in either form, and the one place both are validated.
//!
//! The server turns JSON into a [`CheckRequest`] (which fields go with which
//! form is a matter of the wire format); everything about the values is
//! checked here, against the same rules a policy file obeys, and a mistake
//! comes back as an [`Invalid`] that the server maps to the field at fault.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, Calendar, LimitError, MAX_LIMIT};
use crate::policy::{format_window, parse_window_in, Policy, DEFAULT_MAX_LEASE_LIFE};

/// Longest ad hoc key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// Longest reason kept with a block (or note with an API override), in bytes.
pub const MAX_REASON_LEN: usize = 500;

/// A check as the caller asked for it, not yet validated.
#[derive(Debug, Clone)]
pub enum CheckRequest {
    Policy {
        policy: String,
        identifiers: BTreeMap<String, String>,
        cost: u64,
    },
    AdHoc {
        key: String,
        limit: u64,
        window: String,
        timezone: Option<String>,
        algorithm: Algorithm,
        cost: u64,
    },
}

impl CheckRequest {
    /// The same check with cost 0: the state, consuming nothing.
    pub fn peek(&self) -> Self {
        let mut peek = self.clone();
        match &mut peek {
            Self::Policy { cost, .. } | Self::AdHoc { cost, .. } => *cost = 0,
        }
        peek
    }

    /// What logs and metrics call the check: the policy's name, or `_adhoc`.
    pub fn policy_label(&self) -> &str {
        match self {
            Self::Policy { policy, .. } => policy,
            Self::AdHoc { .. } => crate::telemetry::ADHOC,
        }
    }
}

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

/// What is wrong with a request, in the domain's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("no policy named {0:?} is configured")]
    UnknownPolicy(String),
    #[error("{name:?} is not an identifier of policy {policy:?} (expected: {})", expected.join(", "))]
    UnexpectedIdentifier { name: String, policy: Arc<str>, expected: Vec<String> },
    #[error("identifier {name:?} is required by policy {policy:?}")]
    MissingIdentifier { name: String, policy: Arc<str> },
    #[error("identifier {name:?} {reason}")]
    BadIdentifier { name: String, reason: String },
    #[error("key must be 1 to {MAX_KEY_LEN} bytes")]
    KeyLength,
    #[error("limit {0}")]
    Limit(LimitError),
    #[error("{0}")]
    Window(String),
    #[error("{0}")]
    Timezone(String),
    #[error("cost must be between 0 and {MAX_LIMIT}")]
    CostRange,
    #[error("cost {cost} exceeds the limit {limit} of bucket {bucket:?}, so it could never be allowed")]
    CostOverLimit { cost: u64, limit: u64, bucket: Arc<str> },
    #[error("{name:?} is not a bucket of policy {policy:?}")]
    UnknownBucket { field: &'static str, name: String, policy: String },
    #[error("for {0} (a duration such as \"15m\")")]
    BlockFor(String),
    #[error("reason must be at most {MAX_REASON_LEN} bytes")]
    ReasonLength,
    #[error("{0}")]
    Lease(String),
    #[error(
        "algorithm \"concurrency\" (bucket {bucket:?}) takes leases, which are kept on a single PostgreSQL, \
         not in Citus mode (PGLIMIT_CITUS)"
    )]
    NoLeases { bucket: Arc<str> },
    #[error(
        "max_wait is over this service's bound of {bound_ms} ms (PGLIMIT_REQUEST_TIMEOUT_MS less the \
         longest wait on Postgres and 1 s, at most 60 s)"
    )]
    MaxWait { bound_ms: u64 },
}

/// An ad hoc request, validated.
pub(super) struct AdHoc<'a> {
    pub key: &'a str,
    pub limit: u64,
    pub window: Duration,
    pub calendar: Option<Calendar>,
    pub algorithm: Algorithm,
}

/// Checks an ad hoc request's values.
pub(super) fn ad_hoc<'a>(
    key: &'a str,
    limit: u64,
    window: &str,
    timezone: Option<&str>,
    algorithm: Algorithm,
    cost: u64,
) -> Result<AdHoc<'a>, Invalid> {
    check_cost_range(cost)?;
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Invalid::KeyLength);
    }
    algorithm.check_limit(limit).map_err(Invalid::Limit)?;
    let (window, calendar) = parse_window_in(window, timezone, algorithm).map_err(|e| match e.field {
        "timezone" => Invalid::Timezone(e.message),
        _ => Invalid::Window(e.message),
    })?;
    if algorithm == Algorithm::Concurrency && window > DEFAULT_MAX_LEASE_LIFE {
        let most = format_window(DEFAULT_MAX_LEASE_LIFE);
        return Err(Invalid::Lease(format!(
            "lease must be at most {most}, the max_lease_life of ad hoc leases"
        )));
    }
    check_cost_fits(cost, limit, "default")?;
    Ok(AdHoc { key, limit, window, calendar, algorithm })
}

/// Checks a policy request's identifiers and cost; returns the normalised
/// value of every identifier the policy declares.
pub(super) fn identifiers<'p>(
    policy: &'p Policy,
    raw: &BTreeMap<String, String>,
    cost: u64,
) -> Result<BTreeMap<&'p str, String>, Invalid> {
    check_cost_range(cost)?;
    if let Some(extra) = raw.keys().find(|k| !policy.identifiers.contains_key(*k)) {
        return Err(Invalid::UnexpectedIdentifier {
            name: extra.clone(),
            policy: policy.name.clone(),
            expected: policy.identifiers.keys().cloned().collect(),
        });
    }
    let mut values = BTreeMap::new();
    for (name, kind) in &policy.identifiers {
        let missing = || Invalid::MissingIdentifier { name: name.clone(), policy: policy.name.clone() };
        let value = kind
            .normalise(raw.get(name).ok_or_else(missing)?)
            .map_err(|reason| Invalid::BadIdentifier { name: name.clone(), reason })?;
        values.insert(name.as_str(), value);
    }
    for bucket in &policy.buckets {
        check_cost_fits(cost, bucket.limit, &bucket.name)?;
    }
    Ok(values)
}

/// Normalises the identifiers given, which may be only some of the
/// policy's (a block names what it blocks); an unknown one is refused.
pub(super) fn some_identifiers<'p>(
    policy: &'p Policy,
    raw: &BTreeMap<String, String>,
) -> Result<BTreeMap<&'p str, String>, Invalid> {
    let mut values = BTreeMap::new();
    for (name, value) in raw {
        let Some((declared, kind)) = policy.identifiers.get_key_value(name) else {
            return Err(Invalid::UnexpectedIdentifier {
                name: name.clone(),
                policy: policy.name.clone(),
                expected: policy.identifiers.keys().cloned().collect(),
            });
        };
        let value =
            kind.normalise(value).map_err(|reason| Invalid::BadIdentifier { name: name.clone(), reason })?;
        values.insert(declared.as_str(), value);
    }
    Ok(values)
}

fn check_cost_range(cost: u64) -> Result<(), Invalid> {
    if cost > MAX_LIMIT {
        return Err(Invalid::CostRange);
    }
    Ok(())
}

/// A cost above a bucket's limit could never be admitted: refused rather
/// than denied for ever.
fn check_cost_fits(cost: u64, limit: u64, bucket: &str) -> Result<(), Invalid> {
    if cost > limit {
        return Err(Invalid::CostOverLimit { cost, limit, bucket: bucket.into() });
    }
    Ok(())
}
