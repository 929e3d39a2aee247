//! Overrides: identifier patterns that give matching values another limit
//! (`limits`), admit them uncounted (`unlimited`, an allow list) or always
//! refuse them (`deny`, a deny list).
//!
//! Overrides come from two places. The policy file's `[[overrides]]`
//! entries are read here ([`file`]: their TOML and its mistakes) and are
//! part of a [`Policy`]; [`matching`] holds the patterns and which entry
//! applies to a check. Overrides set through the API at runtime live in
//! `limiter::overrides`, not here: they are stored in Postgres and keyed
//! with the server's key secret, and a policy knows neither the store nor
//! the limiter (layers point one way: limiter → policy, limiter → storage).
//! Both kinds share [`Override`]'s [`OverrideAction`] and [`Pattern`]: the
//! limiter builds the API's from these, so a pattern reads and matches alike
//! wherever it was set.

mod file;
mod matching;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) use file::{validate_overrides, RawOverride};
pub use matching::Pattern;

use super::{BucketDef, Policy};

/// One `[[policies.NAME.overrides]]` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Position among the policy's overrides, 0-based, so an answer or a log
    /// line can name the entry that matched (see [`Override::name`]).
    pub index: usize,
    /// Identifier name and the pattern its normalised value must match;
    /// every one must match for the entry to apply. Sorted by name.
    pub when: Vec<(String, Pattern)>,
    pub action: OverrideAction,
}

/// What a matching override does to a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideAction {
    /// Another limit for the named buckets; the others keep their own.
    Limits(BTreeMap<Arc<str>, u64>),
    /// Admitted and not counted: an allow list.
    Unlimited,
    /// Always refused: a deny list.
    Deny,
}

impl OverrideAction {
    /// A deny beats every other action wherever it was set (file or API,
    /// older or newer): an allow or a limit must never lift a ban.
    pub fn is_deny(&self) -> bool {
        matches!(self, Self::Deny)
    }
}

impl Override {
    /// `overrides[i]`, the entry's place in its policy, for answers and logs.
    pub fn name(&self) -> String {
        format!("overrides[{}]", self.index)
    }
}

impl Policy {
    /// The limit `bucket` enforces under `over` (the action of the override
    /// that matched, the file's or the API's): the override's own for it
    /// if it gives one, otherwise the bucket's. `Unlimited` and `Deny` leave
    /// the number alone; the caller acts on them before counting. An API
    /// override was checked against the bucket's algorithm when it was set;
    /// if a reload has changed the algorithm since, its largest limit caps it.
    pub fn limit_for(&self, bucket: &BucketDef, over: Option<&OverrideAction>) -> u64 {
        match over {
            Some(OverrideAction::Limits(limits)) => limits
                .get(&bucket.name)
                .map_or(bucket.limit, |&limit| limit.min(bucket.algorithm.max_limit())),
            _ => bucket.limit,
        }
    }
}
