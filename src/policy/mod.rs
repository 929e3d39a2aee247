//! Named policies: what a check protects, as data.
//!
//! A policy declares its identifiers (each with a kind that fixes its
//! normalisation) and one or more buckets, each counting over some of those
//! identifiers. A check of a policy checks all its buckets together. A
//! policy may also list overrides: identifier patterns that get other limits,
//! are admitted uncounted, or are always denied (see [`Override`]). Policies
//! come from a TOML file (`PGLIMIT_POLICIES`) or, without one, from
//! `policies.default.toml`, built into the binary.

#[cfg(test)]
mod bucket_tests;
mod calendar;
mod cidr;
mod declared;
mod duration;
mod file;
mod forward_auth;
#[cfg(test)]
mod forward_auth_tests;
mod identifier;
mod overrides;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use calendar::{parse_window_in, WindowMistake};
pub use cidr::{Cidr, MAX_V6_PREFIX};
pub use duration::{
    format_window, parse_block_for, parse_max_wait, parse_span, parse_window, MAX_WAIT_CEILING, MAX_WINDOW,
    MIN_WINDOW,
};
pub use forward_auth::{ForwardAuth, HeaderSource, MAX_TRUSTED_HOPS};
pub use identifier::{IdentifierKind, MAX_VALUE_LEN};
pub use overrides::{Override, OverrideAction, Pattern};

use crate::algorithm::{Algorithm, Calendar};

const DEFAULT_POLICIES: &str = include_str!("../../policies.default.toml");

#[derive(Debug, Clone)]
pub struct Policy {
    pub name: Arc<str>,
    pub identifiers: BTreeMap<String, IdentifierKind>,
    /// Identifiers marked `show = true`: their normalised values are kept
    /// with their denials for the top list; the others' never are.
    pub shown: BTreeSet<String>,
    pub buckets: Vec<BucketDef>,
    pub on_store_error: OnStoreError,
    pub fallback_share: FallbackShare,
    pub mode: Mode,
    /// In file order: the first whose `when` matches applies
    /// ([`Policy::override_for`]).
    pub overrides: Vec<Override>,
    /// How `/auth/NAME` reads the identifiers from a proxy's request;
    /// `None`: the policy is not offered there.
    pub forward_auth: Option<ForwardAuth>,
    /// The longest a lease of this policy's concurrency buckets may be
    /// held, renewals included, from when it was taken.
    pub max_lease_life: Duration,
}

/// `max_lease_life` where a policy does not say, and for every ad hoc
/// lease: a day, so that neither a crashed caller nor one renewing for
/// ever holds a slot, or its row, longer.
pub const DEFAULT_MAX_LEASE_LIFE: Duration = Duration::from_secs(24 * 3600);

impl Policy {
    /// The first bucket that takes leases: only a caller that can release
    /// them may check this policy (not a proxy, not Envoy).
    pub fn leasing_bucket(&self) -> Option<&BucketDef> {
        leasing(&self.buckets)
    }
}

fn leasing(buckets: &[BucketDef]) -> Option<&BucketDef> {
    buckets.iter().find(|b| b.algorithm == Algorithm::Concurrency)
}

#[derive(Debug, Clone)]
pub struct BucketDef {
    pub name: Arc<str>,
    /// Identifier fields this bucket counts over, in key order.
    pub on: Vec<String>,
    pub limit: u64,
    pub window: Duration,
    pub algorithm: Algorithm,
    /// A calendar window (`window` is then its nominal length).
    pub calendar: Option<Calendar>,
    /// Lockout: once this bucket denies a check, its key stays denied for
    /// this long from that denial, even if the window resets sooner.
    pub block_for: Option<Duration>,
}

/// What a check of this policy gets when Postgres cannot answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Answer from this instance's memory (fail open, still limited).
    #[default]
    Memory,
    /// Admit the request without counting it.
    Allow,
    /// Refuse with 503 (fail closed).
    Deny,
}

/// How much of each limit one instance enforces from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackShare {
    /// `ceil(limit / N)`, N the instances that were sharing the database:
    /// together they admit about the limit.
    #[default]
    Split,
    /// The whole limit on every instance: together up to N × the limit.
    Full,
}

/// Whether a policy's denials are enforced or only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    /// Decided and counted as if enforced, but always answered as allowed
    /// (with what would have happened): a new limit watched before it bites.
    Shadow,
}

/// All configured policies, by name, and a short hash of the text they
/// were read from (shown by `/readyz`, to tell which file is in force).
#[derive(Debug, Clone)]
pub struct Policies {
    by_name: HashMap<String, Arc<Policy>>,
    hash: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

impl PolicyError {
    /// Policy `policy` refused whole, for `reason`.
    pub fn refused(policy: &str, reason: impl std::fmt::Display) -> Self {
        PolicyError(format!("policy {policy:?}: {reason}"))
    }
}

impl Policies {
    /// The built-in policies of `policies.default.toml`.
    pub fn builtin() -> Self {
        Self::parse(DEFAULT_POLICIES).expect("the built-in policy file is valid")
    }

    /// Reads a policy file; errors name the file and the place in it.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError(format!("cannot read policy file {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| PolicyError(format!("policy file {}: {}", path.display(), e.0)))
    }

    /// Parses a policy file's text; errors name the line and column.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let policies = file::parse(text).map_err(PolicyError)?;
        let by_name = policies.into_iter().map(|p| (p.name.to_string(), Arc::new(p))).collect();
        Ok(Self { by_name, hash: short_hash(text) })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.by_name.values()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The first 12 hex digits of the SHA-256 of the file's text.
    pub fn hash(&self) -> &str {
        &self.hash
    }
}

/// What [`Policies::hash`] shows for a file's text.
pub fn short_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(text.as_bytes())[..6])
}

/// Names end up in response bodies and RateLimit headers; keeping them to
/// this alphabet means they never need escaping.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
