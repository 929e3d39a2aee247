//! Overrides: a policy's `[[overrides]]` entries, which give matching
//! identifier values another limit (`limits`), admit them uncounted
//! (`unlimited`, an allow list) or always refuse them (`deny`, a deny list).
//! Entries are tried in file order and the first whose `when` matches wins.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::cidr::Cidr;
use super::{BucketDef, IdentifierKind, Policy};

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
    /// `overrides[i]`, the entry's place in its policy, for answers and logs.
    pub fn name(&self) -> String {
        format!("overrides[{}]", self.index)
    }

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
