//! The outcomes a policy's checks can be counted under (see
//! [`super::Decision::outcome`] and [`super::Decision::store_label`]), so
//! that `/metrics` registers their series and no others.

use crate::policy::{Mode, OnStoreError, OverrideAction, Policy};
use crate::telemetry::Outcome;

/// What about a policy decides which outcomes its checks can have.
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::limiter) struct Shape {
    pub shadow: bool,
    pub on_store_error: OnStoreError,
    /// An `unlimited = true` override: admitted uncounted.
    pub allow_list: bool,
    /// A `deny = true` override: refused, no store asked.
    pub deny_list: bool,
}

impl Shape {
    pub fn of(policy: &Policy, shadow_all: bool) -> Self {
        let has = |action: &OverrideAction| policy.overrides.iter().any(|o| o.action == *action);
        Self {
            shadow: shadow_all || policy.mode == Mode::Shadow,
            on_store_error: policy.on_store_error,
            allow_list: has(&OverrideAction::Unlimited),
            deny_list: has(&OverrideAction::Deny),
        }
    }

    /// Ad hoc keys: no overrides, and the default choice for an outage.
    pub fn ad_hoc(shadow_all: bool) -> Self {
        Self { shadow: shadow_all, ..Self::default() }
    }

    /// Every `(decision, store)` a check of this shape can be counted under.
    pub fn outcomes(self) -> Vec<Outcome> {
        // A shadow policy's denials are counted as would-be ones.
        let denied = if self.shadow { "shadow_denied" } else { "denied" };
        // Decided by Postgres, or a denial repeated from the deny cache.
        let mut all = vec![("allowed", "postgres"), (denied, "postgres"), (denied, "deny_cache")];
        if self.on_store_error == OnStoreError::Memory {
            all.extend([("allowed", "memory"), (denied, "memory")]);
        }
        // Admitted uncounted: Postgres away with "allow", or an allow list.
        if self.on_store_error == OnStoreError::Allow || self.allow_list {
            all.push(("allowed", "none"));
        }
        if self.deny_list {
            all.push((denied, "none"));
        }
        // Postgres away with "deny": refused (or, in shadow, admitted as it
        // would have been refused).
        if self.on_store_error == OnStoreError::Deny {
            all.push(("error", "none"));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_that_enforces_and_falls_back_to_memory_has_five_outcomes() {
        let outcomes = Shape::ad_hoc(false).outcomes();
        assert_eq!(outcomes.len(), 5);
        assert!(outcomes.iter().all(|(decision, store)| *decision != "shadow_denied" && *store != "none"));
    }

    #[test]
    fn a_shadow_deny_list_is_a_would_be_denial_and_a_fail_closed_outage_an_error() {
        let shape =
            Shape { shadow: true, on_store_error: OnStoreError::Deny, allow_list: false, deny_list: true };
        let outcomes = shape.outcomes();
        assert!(outcomes.contains(&("shadow_denied", "none")) && outcomes.contains(&("error", "none")));
        assert!(!outcomes.iter().any(|(decision, _)| *decision == "denied"));
        assert!(!outcomes.iter().any(|(_, store)| *store == "memory"));
    }
}
