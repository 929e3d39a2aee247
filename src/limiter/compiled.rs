//! The policies in force compiled for pglimit's SQL functions
//! (`sql/policies.sql` reads them): what `pglimit.check` needs to decide
//! as `/check` does, keyed so that no identifier of the policy file is
//! written to the database.
//!
//! One JSON object per policy:
//! - `identifiers`: name → kind (`email`, `ip`, `text`, `text_folded`);
//! - `buckets`, in file order: `name`, `on` (identifiers, in key order),
//!   `limit`, `max_limit` (its algorithm's), `window_ms`, `algorithm` and
//!   its `code`, `zone` (a calendar window's), `block_for_ms` (0: none);
//! - `overrides`, in file order: `when` (identifier → pattern as API
//!   overrides store it: `hmac:<hex>` for an exact value), `action`,
//!   `limits` (bucket → limit);
//! - `shown`: the identifiers whose values the top list keeps (`show = true`);
//! - `shadow`, and `max_lease_life_ms`.

use serde_json::{json, Map, Value};

use super::key::KeySecret;
use super::overrides::in_force::stored_form;
use crate::policy::{BucketDef, Override, OverrideAction, Policies, Policy};
use crate::storage::CompiledPolicies;

/// Every policy of `policies`, and the secret's pads if `with_secret`.
/// `shadow_all` (`PGLIMIT_SHADOW`) puts every policy in shadow mode, as
/// it does here.
pub fn compile(
    policies: &Policies,
    secret: &KeySecret,
    shadow_all: bool,
    with_secret: bool,
) -> CompiledPolicies {
    let mut compiled: Vec<(String, Value)> =
        policies.iter().map(|p| (p.name.to_string(), definition(p, secret, shadow_all))).collect();
    compiled.sort_by(|a, b| a.0.cmp(&b.0));
    let pads = with_secret.then(|| secret.pads());
    CompiledPolicies { source: policies.hash().to_owned(), policies: compiled, pads }
}

fn definition(policy: &Policy, secret: &KeySecret, shadow_all: bool) -> Value {
    let identifiers: Map<String, Value> =
        policy.identifiers.iter().map(|(name, kind)| (name.clone(), kind.name().into())).collect();
    json!({
        "identifiers": identifiers,
        "buckets": policy.buckets.iter().map(bucket).collect::<Vec<_>>(),
        "overrides": policy.overrides.iter().map(|o| overriding(policy, o, secret)).collect::<Vec<_>>(),
        "shown": policy.shown,
        "shadow": shadow_all || policy.mode == crate::policy::Mode::Shadow,
        "max_lease_life_ms": millis(policy.max_lease_life),
    })
}

fn bucket(b: &BucketDef) -> Value {
    json!({
        "name": &*b.name,
        "on": b.on,
        "limit": b.limit,
        "max_limit": b.algorithm.max_limit(),
        "window_ms": millis(b.window),
        "algorithm": b.algorithm.name(),
        "code": b.algorithm.code(),
        "zone": b.calendar.map(|c| c.zone.name()),
        "block_for_ms": b.block_for.map_or(0, millis),
    })
}

fn overriding(policy: &Policy, o: &Override, secret: &KeySecret) -> Value {
    let when: Map<String, Value> = (o.when.iter())
        .map(|(name, pattern)| (name.clone(), stored_form(secret, &policy.name, name, pattern).into()))
        .collect();
    let (action, limits) = match &o.action {
        OverrideAction::Limits(limits) => {
            ("limits", limits.iter().map(|(b, l)| (b.to_string(), Value::from(*l))).collect())
        }
        OverrideAction::Unlimited => ("unlimited", Map::new()),
        OverrideAction::Deny => ("deny", Map::new()),
    };
    json!({ "when": when, "action": action, "limits": limits })
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
