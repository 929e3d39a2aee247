//! Named policies: what a check protects, as data.
//!
//! A policy declares its identifiers (each with a kind that fixes its
//! normalisation) and one or more buckets, each counting over some of those
//! identifiers. A check of a policy checks all its buckets together. Policies
//! come from a TOML file (`PGLIMIT_POLICIES`) or, without one, from
//! `policies.default.toml`, built into the binary.

mod duration;
mod identifier;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

pub use duration::{format_window, parse_window, MAX_WINDOW, MIN_WINDOW};
pub use identifier::{IdentifierKind, MAX_VALUE_LEN};

use crate::algorithm::Algorithm;
use crate::storage::OnStoreError;

/// Largest limit a bucket may have.
pub const MAX_LIMIT: u64 = 1_000_000_000;

const DEFAULT_POLICIES: &str = include_str!("../../policies.default.toml");

#[derive(Debug, Clone)]
pub struct Policy {
    pub name: Arc<str>,
    pub identifiers: BTreeMap<String, IdentifierKind>,
    pub buckets: Vec<BucketDef>,
    pub on_store_error: OnStoreError,
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

    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let file: File = toml::from_str(text).map_err(|e| PolicyError(e.to_string()))?;
        if file.policies.is_empty() {
            return Err(PolicyError("no policies defined: add at least one [policies.<name>] table".into()));
        }
        let mut policies = HashMap::new();
        for (name, raw) in file.policies {
            let policy = raw.validate(&name).map_err(|e| PolicyError(format!("policies.{name}: {e}")))?;
            policies.insert(name, Arc::new(policy));
        }
        Ok(Self(policies))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.0.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    policies: BTreeMap<String, RawPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    identifiers: BTreeMap<String, IdentifierKind>,
    buckets: Vec<RawBucket>,
    #[serde(default)]
    on_store_error: OnStoreError,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    name: String,
    on: Vec<String>,
    limit: u64,
    window: String,
    #[serde(default)]
    algorithm: Algorithm,
}

/// The limits an algorithm accepts; the error is a sentence for the caller.
pub fn check_limit(algorithm: Algorithm, limit: u64) -> Result<(), String> {
    let max = algorithm.max_limit();
    if (1..=max).contains(&limit) {
        return Ok(());
    }
    if algorithm == Algorithm::SlidingLog && limit > max {
        return Err(format!(
            "sliding_log stores one timestamp per admitted request, so its limit is at most {max}; \
             use sliding_window for larger limits"
        ));
    }
    Err(format!("must be between 1 and {max}"))
}

/// Names end up in response bodies and RateLimit headers; keeping them to
/// this alphabet means they never need escaping.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl RawPolicy {
    fn validate(self, name: &str) -> Result<Policy, String> {
        if !is_valid_name(name) {
            return Err("a policy name is 1 to 64 letters, digits, '_' or '-'".into());
        }
        if self.buckets.is_empty() {
            return Err("needs at least one [[buckets]] entry".into());
        }
        let mut seen = HashSet::new();
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (i, raw) in self.buckets.into_iter().enumerate() {
            let bucket = raw.validate(&self.identifiers).map_err(|e| format!("buckets[{i}]: {e}"))?;
            if !seen.insert(bucket.name.clone()) {
                return Err(format!("buckets[{i}]: the bucket name {:?} is used twice", bucket.name));
            }
            buckets.push(bucket);
        }
        Ok(Policy {
            name: name.into(),
            identifiers: self.identifiers,
            buckets,
            on_store_error: self.on_store_error,
        })
    }
}

impl RawBucket {
    fn validate(self, identifiers: &BTreeMap<String, IdentifierKind>) -> Result<BucketDef, String> {
        if !is_valid_name(&self.name) {
            return Err("name: a bucket name is 1 to 64 letters, digits, '_' or '-'".into());
        }
        if self.on.is_empty() {
            return Err("on: list at least one identifier".into());
        }
        if let Some(unknown) = self.on.iter().find(|f| !identifiers.contains_key(*f)) {
            return Err(format!("on: {unknown:?} is not one of this policy's identifiers"));
        }
        check_limit(self.algorithm, self.limit).map_err(|e| format!("limit: {e}"))?;
        let window = parse_window(&self.window).map_err(|e| format!("window: {e}"))?;
        let algorithm = self.algorithm;
        Ok(BucketDef { name: self.name.into(), on: self.on, limit: self.limit, window, algorithm })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_policies_match_the_reference_design() {
        let policies = Policies::builtin();
        let login = policies.get("login").expect("login policy");
        let shape: Vec<_> = login.buckets.iter().map(|b| (&*b.name, b.limit, b.window.as_secs())).collect();
        assert_eq!(shape, [("email_ip", 5, 60), ("ip", 20, 60), ("email", 50, 900)]);
        let contact = policies.get("contact_confirmation").expect("contact policy");
        assert_eq!(contact.buckets[0].limit, 3);
        assert_eq!(contact.buckets[0].window.as_secs(), 86_400);
        assert_eq!(contact.identifiers["recipient"], IdentifierKind::Email);
    }

    #[test]
    fn a_bucket_on_an_undeclared_identifier_is_refused() {
        let text = r#"
            [policies.p]
            identifiers = { email = "email" }
            [[policies.p.buckets]]
            name = "b"
            on = ["mail"]
            limit = 1
            window = "1m"
        "#;
        let err = Policies::parse(text).unwrap_err().to_string();
        assert!(err.contains("policies.p: buckets[0]: on: \"mail\""), "{err}");
    }

    #[test]
    fn type_mistakes_name_the_line() {
        let text = "[policies.p]\nidentifiers = { email = \"email\" }\n[[policies.p.buckets]]\nname = \"b\"\non = [\"email\"]\nlimit = \"five\"\nwindow = \"1m\"\n";
        let err = Policies::parse(text).unwrap_err().to_string();
        assert!(err.contains("line 6"), "{err}");
    }

    #[test]
    fn unknown_kinds_and_fallbacks_are_refused() {
        let policy = |fallback: &str, kind: &str| {
            format!(
                "[policies.p]\n{fallback}identifiers = {{ e = \"{kind}\" }}\n\
                 [[policies.p.buckets]]\nname = \"b\"\non = [\"e\"]\nlimit = 1\nwindow = \"1m\"\n"
            )
        };
        assert!(Policies::parse(&policy("", "text")).is_ok(), "the valid variant parses");
        assert!(Policies::parse(&policy("on_store_error = \"deny\"\n", "text")).is_ok());
        let kind = Policies::parse(&policy("", "phone")).unwrap_err().to_string();
        assert!(kind.contains("phone"), "{kind}");
        let fallback =
            Policies::parse(&policy("on_store_error = \"maybe\"\n", "text")).unwrap_err().to_string();
        assert!(fallback.contains("maybe"), "{fallback}");
    }
}
