//! A policy's `[[overrides]]` entries as written in the file, and their
//! validation into [`Override`] values, every mistake placed at its line.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::{Override, OverrideAction, Pattern};
use crate::policy::file::Mistake;
use crate::policy::{BucketDef, IdentifierKind};

type SpannedTable<V> = Spanned<BTreeMap<Spanned<String>, Spanned<V>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::policy) struct RawOverride {
    when: SpannedTable<String>,
    #[serde(default)]
    limits: Option<SpannedTable<u64>>,
    #[serde(default)]
    unlimited: Option<Spanned<bool>>,
    #[serde(default)]
    deny: Option<Spanned<bool>>,
}

/// Validates every entry, in file order, against the policy's identifiers
/// and (already validated) buckets.
pub(in crate::policy) fn validate_overrides(
    raw: Vec<Spanned<RawOverride>>,
    identifiers: &BTreeMap<String, IdentifierKind>,
    buckets: &[BucketDef],
) -> Result<Vec<Override>, Mistake> {
    raw.into_iter()
        .enumerate()
        .map(|(index, entry)| {
            validate_one(index, entry, identifiers, buckets)
                .map_err(|m| m.within(&format!("overrides[{index}]")))
        })
        .collect()
}

fn validate_one(
    index: usize,
    entry: Spanned<RawOverride>,
    identifiers: &BTreeMap<String, IdentifierKind>,
    buckets: &[BucketDef],
) -> Result<Override, Mistake> {
    let when = validate_when(&entry.get_ref().when, identifiers)?;
    let action = validate_action(&entry, buckets)?;
    Ok(Override { index, when, action })
}

fn validate_when(
    when: &SpannedTable<String>,
    identifiers: &BTreeMap<String, IdentifierKind>,
) -> Result<Vec<(String, Pattern)>, Mistake> {
    if when.get_ref().is_empty() {
        return Err(Mistake::at(when, "when", "list at least one identifier and the pattern it must match"));
    }
    let mut patterns = Vec::with_capacity(when.get_ref().len());
    for (name, pattern) in when.get_ref() {
        let Some(&kind) = identifiers.get(name.get_ref()) else {
            let message = format!("{:?} is not one of this policy's identifiers", name.get_ref());
            return Err(Mistake::at(name, "when", message));
        };
        let parsed = Pattern::parse(kind, pattern.get_ref())
            .map_err(|e| Mistake::at(pattern, &format!("when.{}", name.get_ref()), e))?;
        patterns.push((name.get_ref().clone(), parsed));
    }
    Ok(patterns)
}

/// Exactly one of `limits`, `unlimited = true` and `deny = true`; a `false`
/// is refused because it reads as an action switched off yet would be none.
fn validate_action(entry: &Spanned<RawOverride>, buckets: &[BucketDef]) -> Result<OverrideAction, Mistake> {
    let raw = entry.get_ref();
    for (flag, field) in [(&raw.unlimited, "unlimited"), (&raw.deny, "deny")] {
        if let Some(flag) = flag.as_ref().filter(|f| !*f.get_ref()) {
            return Err(Mistake::at(flag, field, format!("write `{field} = true`, or leave it out")));
        }
    }
    let present = [
        ("limits", raw.limits.is_some()),
        ("unlimited", raw.unlimited.is_some()),
        ("deny", raw.deny.is_some()),
    ];
    let given: Vec<&str> =
        present.into_iter().filter_map(|(name, is_given)| is_given.then_some(name)).collect();
    if given.len() != 1 {
        let message = match given.as_slice() {
            [] => "give it one action: limits = { ... }, unlimited = true or deny = true".to_string(),
            several => format!("has {}: give only one of limits, unlimited and deny", several.join(" and ")),
        };
        return Err(Mistake::at(entry, "", message));
    }
    Ok(match (&raw.limits, raw.unlimited.is_some()) {
        (Some(limits), _) => OverrideAction::Limits(validate_limits(limits, buckets)?),
        (None, true) => OverrideAction::Unlimited,
        (None, false) => OverrideAction::Deny,
    })
}

/// Each named bucket must be the policy's, and its limit valid for that
/// bucket's algorithm, as the bucket's own limit is.
fn validate_limits(
    limits: &SpannedTable<u64>,
    buckets: &[BucketDef],
) -> Result<BTreeMap<Arc<str>, u64>, Mistake> {
    if limits.get_ref().is_empty() {
        return Err(Mistake::at(limits, "limits", "list at least one bucket and its limit"));
    }
    let mut valid = BTreeMap::new();
    for (name, limit) in limits.get_ref() {
        let Some(bucket) = buckets.iter().find(|b| *b.name == **name.get_ref()) else {
            let message = format!("{:?} is not one of this policy's buckets", name.get_ref());
            return Err(Mistake::at(name, "limits", message));
        };
        let path = format!("limits.{}", name.get_ref());
        bucket
            .algorithm
            .check_limit(*limit.get_ref())
            .map_err(|e| Mistake::at(limit, &path, e.to_string()))?;
        valid.insert(bucket.name.clone(), *limit.get_ref());
    }
    Ok(valid)
}
