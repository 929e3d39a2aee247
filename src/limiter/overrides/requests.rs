//! An API override as `POST /admin/overrides` asks for it, and its
//! validation into the form Postgres stores: against the policy it names,
//! as the policy file's overrides are, every mistake named by its field.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::in_force::stored_form;
use crate::limiter::key::KeySecret;
use crate::limiter::request::MAX_REASON_LEN;
use crate::policy::{Pattern, Policies, Policy};
use crate::storage::StoredOverride;

/// An override as `POST /admin/overrides` gives it: `when`, exactly one of
/// the three actions, and optionally `until` (RFC 3339) and `note`.
#[derive(Debug, Clone, Default)]
pub struct OverrideRequest {
    pub policy: String,
    pub when: BTreeMap<String, String>,
    pub limits: Option<BTreeMap<String, u64>>,
    pub unlimited: Option<bool>,
    pub deny: Option<bool>,
    pub until: Option<String>,
    pub note: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    #[error("no policy named {0:?} is configured")]
    UnknownPolicy(String),
    #[error("{detail}")]
    Invalid { field: String, detail: String },
    #[error("the counter store is unavailable")]
    Unavailable,
}

fn invalid(field: impl Into<String>, detail: impl Into<String>) -> OverrideError {
    OverrideError::Invalid { field: field.into(), detail: detail.into() }
}

/// `request` as it is stored, if it is valid against the policies in
/// force: an exact value keyed with `secret`, never kept as it was given.
pub(super) fn validate(
    request: &OverrideRequest,
    policies: &Policies,
    secret: &KeySecret,
) -> Result<StoredOverride, OverrideError> {
    let policy =
        policies.get(&request.policy).ok_or_else(|| OverrideError::UnknownPolicy(request.policy.clone()))?;
    Ok(StoredOverride {
        id: format!("ovr_{}", hex::encode(rand::random::<[u8; 12]>())),
        policy: request.policy.clone(),
        when: validate_when(policy, &request.when, secret)?,
        action: action(request)?.to_owned(),
        limits: validate_limits(policy, request.limits.as_ref())?,
        until: validate_until(request.until.as_deref())?,
        note: validate_note(request.note.as_deref())?,
        created_at: Utc::now(),
    })
}

fn validate_when(
    policy: &Policy,
    when: &BTreeMap<String, String>,
    secret: &KeySecret,
) -> Result<BTreeMap<String, String>, OverrideError> {
    if when.is_empty() {
        return Err(invalid("when", "list at least one identifier and the pattern it must match"));
    }
    let mut stored = BTreeMap::new();
    for (name, text) in when {
        let Some(&kind) = policy.identifiers.get(name) else {
            return Err(invalid("when", format!("{name:?} is not one of this policy's identifiers")));
        };
        let pattern = Pattern::parse(kind, text).map_err(|e| invalid(format!("when.{name}"), e))?;
        stored.insert(name.clone(), stored_form(secret, &policy.name, name, &pattern));
    }
    Ok(stored)
}

/// Exactly one of `limits`, `unlimited: true` and `deny: true`, as in the file.
fn action(request: &OverrideRequest) -> Result<&'static str, OverrideError> {
    for (flag, field) in [(request.unlimited, "unlimited"), (request.deny, "deny")] {
        if flag == Some(false) {
            return Err(invalid(field, format!("write \"{field}\": true, or leave it out")));
        }
    }
    let given: Vec<&'static str> = [
        ("limits", request.limits.is_some()),
        ("unlimited", request.unlimited.is_some()),
        ("deny", request.deny.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, given)| given.then_some(name))
    .collect();
    match given.as_slice() {
        [one] => Ok(one),
        [] => Err(invalid(
            "limits",
            "give one action: \"limits\": {...}, \"unlimited\": true or \"deny\": true",
        )),
        several => Err(invalid(
            several[1],
            format!("give only one of limits, unlimited and deny, not {}", several.join(" and ")),
        )),
    }
}

/// Each bucket must be the policy's, and its limit valid for its algorithm.
fn validate_limits(
    policy: &Policy,
    limits: Option<&BTreeMap<String, u64>>,
) -> Result<BTreeMap<String, u64>, OverrideError> {
    let Some(limits) = limits else { return Ok(BTreeMap::new()) };
    if limits.is_empty() {
        return Err(invalid("limits", "list at least one bucket and its limit"));
    }
    for (name, &limit) in limits {
        let field = format!("limits.{name}");
        let Some(bucket) = policy.buckets.iter().find(|b| *b.name == **name) else {
            let detail = format!("{name:?} is not one of policy {:?}'s buckets", &*policy.name);
            return Err(invalid(field, detail));
        };
        bucket.algorithm.check_limit(limit).map_err(|e| invalid(&field, format!("{field}: {e}")))?;
    }
    Ok(limits.clone())
}

fn validate_until(until: Option<&str>) -> Result<Option<DateTime<Utc>>, OverrideError> {
    let Some(text) = until else { return Ok(None) };
    let at = DateTime::parse_from_rfc3339(text)
        .map_err(|e| {
            invalid("until", format!("until is not an RFC 3339 time such as 2027-06-01T00:00:00Z: {e}"))
        })?
        .with_timezone(&Utc);
    if at <= Utc::now() {
        return Err(invalid("until", "until is in the past: the override would never apply"));
    }
    Ok(Some(at))
}

fn validate_note(note: Option<&str>) -> Result<Option<String>, OverrideError> {
    match note {
        Some(note) if note.len() > MAX_REASON_LEN => {
            Err(invalid("note", format!("note is longer than {MAX_REASON_LEN} bytes")))
        }
        note => Ok(note.map(str::to_owned)),
    }
}
