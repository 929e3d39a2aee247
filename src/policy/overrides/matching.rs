//! Which override applies: a `when` pattern read and matched against an
//! identifier's normalised value, and of a policy's entries the one that
//! wins (a deny before any other, else the first in file order).

use std::collections::BTreeMap;
use std::fmt;

use super::Override;
use crate::policy::{Cidr, IdentifierKind, Policy};

/// A pattern on one identifier's normalised value (what
/// [`IdentifierKind::normalise`] returns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// That value exactly, normalised when the file was read, so
    /// `Alice+x@Example.com` in the file matches `alice@example.com`.
    Exact(String),
    /// `*@domain` (email identifiers): any mailbox at exactly this domain,
    /// held lowercase. Subdomains do not match: `*@example.com` matches
    /// neither `a@mail.example.com` nor `a@example.com.evil`.
    EmailDomain(String),
    /// An IP network (ip identifiers): see [`Cidr`] for IPv6 prefixes.
    Network(Cidr),
}

impl Pattern {
    /// Reads a pattern as written in a `when` table for an identifier of
    /// `kind`; the error says what is wrong without quoting `text`, which
    /// may be someone's email or address (it is logged).
    pub fn parse(kind: IdentifierKind, text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.starts_with("*@") && kind != IdentifierKind::Email {
            return Err("a *@domain pattern is for an email identifier only".into());
        }
        match kind {
            IdentifierKind::Email if text.contains('*') => email_domain(text),
            IdentifierKind::Ip if text.contains('/') => Cidr::parse(text).map(Self::Network),
            _ => kind.normalise(text).map(Self::Exact).map_err(|reason| format!("the pattern {reason}")),
        }
    }

    /// Whether the normalised value `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(exact) => value == exact,
            Self::EmailDomain(domain) => value.rsplit_once('@').is_some_and(|(_, d)| d == domain),
            Self::Network(cidr) => cidr.contains(value),
        }
    }
}

/// `*@domain`, its domain checked by the email normaliser so that it is
/// written as the values it is compared with are.
fn email_domain(text: &str) -> Result<Pattern, String> {
    let refuse =
        || "not a valid pattern: the only wildcard is a whole local part, as in *@example.com".to_string();
    let domain = text.strip_prefix("*@").filter(|d| !d.contains('*')).ok_or_else(refuse)?;
    let probe = IdentifierKind::Email.normalise(&format!("x@{domain}")).map_err(|_| refuse())?;
    let (_, domain) = probe.rsplit_once('@').ok_or_else(refuse)?;
    Ok(Pattern::EmailDomain(domain.to_owned()))
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(value) => f.write_str(value),
            Self::EmailDomain(domain) => write!(f, "*@{domain}"),
            Self::Network(cidr) => cidr.fmt(f),
        }
    }
}

impl Override {
    /// Whether every identifier in `when` has a value here that matches.
    pub fn matches(&self, values: &BTreeMap<&str, String>) -> bool {
        self.when.iter().all(|(name, pattern)| values.get(name.as_str()).is_some_and(|v| pattern.matches(v)))
    }
}

impl Policy {
    /// The override matching `values`, the normalised identifier values by
    /// name (as the limiter builds them), if any: the first deny that
    /// matches, or else the first that matches.
    pub fn override_for(&self, values: &BTreeMap<&str, String>) -> Option<&Override> {
        self.overrides.iter().filter(|o| o.matches(values)).min_by_key(|o| !o.action.is_deny())
    }
}
