//! Named policies: what a check protects, as data.
//!
//! A policy declares its identifiers (each with a kind that fixes its
//! normalisation) and one or more buckets, each counting over some of those
//! identifiers. A check of a policy checks all its buckets together. Policies
//! come from a TOML file (`PGLIMIT_POLICIES`) or, without one, from
//! `policies.default.toml`, built into the binary.

mod duration;
mod file;
mod identifier;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use duration::{format_window, parse_window, MAX_WINDOW, MIN_WINDOW};
pub use identifier::{IdentifierKind, MAX_VALUE_LEN};

use crate::algorithm::Algorithm;

const DEFAULT_POLICIES: &str = include_str!("../../policies.default.toml");

#[derive(Debug, Clone)]
pub struct Policy {
    pub name: Arc<str>,
    pub identifiers: BTreeMap<String, IdentifierKind>,
    pub buckets: Vec<BucketDef>,
    pub on_store_error: OnStoreError,
    pub fallback_share: FallbackShare,
}

#[derive(Debug, Clone)]
pub struct BucketDef {
    pub name: Arc<str>,
    /// Identifier fields this bucket counts over, in key order.
    pub on: Vec<String>,
    pub limit: u64,
    pub window: Duration,
    pub algorithm: Algorithm,
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

/// All configured policies, by name.
#[derive(Debug, Clone)]
pub struct Policies(HashMap<String, Arc<Policy>>);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

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
        Ok(Self(policies.into_iter().map(|p| (p.name.to_string(), Arc::new(p))).collect()))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.0.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// Names end up in response bodies and RateLimit headers; keeping them to
/// this alphabet means they never need escaping.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
