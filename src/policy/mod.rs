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
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

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
            let policy = raw
                .validate(&name)
                .map_err(|m| m.within(&format!("policies.{}", name.get_ref())).describe(text))?;
            policies.insert(name.into_inner(), Arc::new(policy));
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
    policies: BTreeMap<Spanned<String>, RawPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    identifiers: BTreeMap<String, IdentifierKind>,
    buckets: Spanned<Vec<RawBucket>>,
    #[serde(default)]
    on_store_error: OnStoreError,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    name: Spanned<String>,
    on: Spanned<Vec<Spanned<String>>>,
    limit: Spanned<u64>,
    window: Spanned<String>,
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

/// A mistake found after deserialising: the path to the offending value, where
/// that value starts in the file, and what is wrong with it. The toml crate
/// places its own errors; these it cannot see, so they carry their span until
/// [`Policies::parse`], which has the text to turn it into a line.
struct Mistake {
    path: String,
    span: Range<usize>,
    message: String,
}

impl Mistake {
    fn at<T>(value: &Spanned<T>, path: &str, message: impl Into<String>) -> Self {
        Self { path: path.into(), span: value.span(), message: message.into() }
    }

    /// Prefixes the path with the enclosing value's; an empty path means the
    /// mistake is that enclosing value itself (a policy's name).
    fn within(self, parent: &str) -> Self {
        let path = if self.path.is_empty() { parent.into() } else { format!("{parent}: {}", self.path) };
        Self { path, ..self }
    }

    fn describe(&self, text: &str) -> PolicyError {
        let (line, column) = line_column(text, self.span.start);
        PolicyError(format!("{} (line {line}, column {column}): {}", self.path, self.message))
    }
}

/// 1-based line and column of byte `offset`, counting columns in characters
/// as the toml crate's own errors do, so both kinds of error agree.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    // UTF-8 continuation bytes are not characters of their own.
    let column = 1 + before[line_start..].iter().filter(|&&b| b & 0xC0 != 0x80).count();
    (line, column)
}

impl RawPolicy {
    fn validate(self, name: &Spanned<String>) -> Result<Policy, Mistake> {
        if !is_valid_name(name.get_ref()) {
            return Err(Mistake::at(name, "", "a policy name is 1 to 64 letters, digits, '_' or '-'"));
        }
        if self.buckets.get_ref().is_empty() {
            return Err(Mistake::at(&self.buckets, "buckets", "needs at least one [[buckets]] entry"));
        }
        let buckets = validate_buckets(self.buckets.into_inner(), &self.identifiers)?;
        Ok(Policy {
            name: name.get_ref().as_str().into(),
            identifiers: self.identifiers,
            buckets,
            on_store_error: self.on_store_error,
        })
    }
}

fn validate_buckets(
    raw: Vec<RawBucket>,
    identifiers: &BTreeMap<String, IdentifierKind>,
) -> Result<Vec<BucketDef>, Mistake> {
    let mut seen = HashSet::new();
    let mut buckets = Vec::with_capacity(raw.len());
    for (i, raw) in raw.into_iter().enumerate() {
        let name_span = raw.name.span();
        let bucket = raw.validate(identifiers).map_err(|m| m.within(&format!("buckets[{i}]")))?;
        if !seen.insert(bucket.name.clone()) {
            let message = format!("the bucket name {:?} is used twice", bucket.name);
            return Err(Mistake { path: format!("buckets[{i}]: name"), span: name_span, message });
        }
        buckets.push(bucket);
    }
    Ok(buckets)
}

impl RawBucket {
    fn validate(self, identifiers: &BTreeMap<String, IdentifierKind>) -> Result<BucketDef, Mistake> {
        if !is_valid_name(self.name.get_ref()) {
            return Err(Mistake::at(
                &self.name,
                "name",
                "a bucket name is 1 to 64 letters, digits, '_' or '-'",
            ));
        }
        if self.on.get_ref().is_empty() {
            return Err(Mistake::at(&self.on, "on", "list at least one identifier"));
        }
        if let Some(unknown) = self.on.get_ref().iter().find(|f| !identifiers.contains_key(f.get_ref())) {
            let message = format!("{:?} is not one of this policy's identifiers", unknown.get_ref());
            return Err(Mistake::at(unknown, "on", message));
        }
        let (limit, algorithm) = (*self.limit.get_ref(), self.algorithm);
        check_limit(algorithm, limit).map_err(|e| Mistake::at(&self.limit, "limit", e))?;
        let window =
            parse_window(self.window.get_ref()).map_err(|e| Mistake::at(&self.window, "window", e))?;
        let on = self.on.into_inner().into_iter().map(Spanned::into_inner).collect();
        Ok(BucketDef { name: self.name.into_inner().into(), on, limit, window, algorithm })
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

    /// Parses a file given as its lines, so a test reads line numbers off the
    /// array (line n is element n - 1), and returns the error it must cause.
    fn error_in(lines: &[&str]) -> String {
        Policies::parse(&lines.join("\n")).expect_err("the file has a mistake").to_string()
    }

    /// A valid policy `p` taking lines 1 to 8, so a mistake after it is not on
    /// the first bucket's lines.
    const HEAD: [&str; 8] = [
        "[policies.p]",
        r#"identifiers = { email = "email", ip = "ip" }"#,
        "",
        "[[policies.p.buckets]]",
        r#"name = "first""#,
        r#"on = ["email"]"#,
        "limit = 1",
        r#"window = "1m""#,
    ];

    /// The error of `HEAD` followed by a second bucket of `p` made of `fields`,
    /// one a line: its header is line 9, so `fields` take lines 10 onwards.
    fn second_bucket(fields: &[&str]) -> String {
        let lines: Vec<&str> =
            HEAD.iter().chain(&["[[policies.p.buckets]]"]).chain(fields).copied().collect();
        error_in(&lines)
    }

    #[test]
    fn an_invalid_policy_name_names_its_line() {
        let err = error_in(&[
            "# one policy, badly named",
            r#"[policies."two words"]"#,
            r#"identifiers = { e = "text" }"#,
            r#"[[policies."two words".buckets]]"#,
            r#"name = "b""#,
            r#"on = ["e"]"#,
            "limit = 1",
            r#"window = "1m""#,
        ]);
        assert_eq!(
            err,
            "policies.two words (line 2, column 11): a policy name is 1 to 64 letters, digits, '_' or '-'"
        );
    }

    #[test]
    fn a_policy_without_buckets_names_its_line() {
        let err = error_in(&["[policies.p]", r#"identifiers = { e = "text" }"#, "", "buckets = []"]);
        assert_eq!(err, "policies.p: buckets (line 4, column 11): needs at least one [[buckets]] entry");
    }

    #[test]
    fn an_invalid_bucket_name_names_its_line() {
        let err = second_bucket(&[
            r#"name = "no spaces please""#,
            r#"on = ["ip"]"#,
            "limit = 1",
            r#"window = "1m""#,
        ]);
        assert_eq!(
            err,
            "policies.p: buckets[1]: name (line 10, column 8): \
             a bucket name is 1 to 64 letters, digits, '_' or '-'"
        );
    }

    #[test]
    fn a_bucket_on_no_identifiers_names_its_line() {
        let err = second_bucket(&[r#"name = "b""#, "limit = 1", "on = []", r#"window = "1m""#]);
        assert_eq!(err, "policies.p: buckets[1]: on (line 12, column 6): list at least one identifier");
    }

    #[test]
    fn a_bucket_on_an_undeclared_identifier_names_its_line() {
        let err =
            second_bucket(&[r#"name = "b""#, r#"on = ["ip", "mail"]"#, "limit = 1", r#"window = "1m""#]);
        assert_eq!(
            err,
            r#"policies.p: buckets[1]: on (line 11, column 13): "mail" is not one of this policy's identifiers"#
        );
    }

    #[test]
    fn a_limit_out_of_range_names_its_line() {
        let err = second_bucket(&[r#"name = "b""#, r#"on = ["ip"]"#, r#"window = "1m""#, "limit = 0"]);
        assert_eq!(
            err,
            "policies.p: buckets[1]: limit (line 13, column 9): must be between 1 and 1000000000"
        );
    }

    #[test]
    fn a_sliding_log_limit_above_its_maximum_names_the_limits_line() {
        let err = second_bucket(&[
            r#"name = "b""#,
            r#"on = ["ip"]"#,
            "limit = 1001",
            r#"window = "1m""#,
            r#"algorithm = "sliding_log""#,
        ]);
        assert!(
            err.starts_with("policies.p: buckets[1]: limit (line 12, column 9): sliding_log stores"),
            "{err}"
        );
    }

    #[test]
    fn a_window_that_is_not_a_duration_names_its_line() {
        let err = second_bucket(&[r#"window = "5 parsecs""#, r#"name = "b""#, r#"on = ["ip"]"#, "limit = 1"]);
        assert!(
            err.starts_with(
                r#"policies.p: buckets[1]: window (line 10, column 10): "5 parsecs" is not a duration"#
            ),
            "{err}"
        );
    }

    #[test]
    fn a_window_out_of_range_names_its_line() {
        let err = second_bucket(&[r#"name = "b""#, r#"on = ["ip"]"#, "limit = 1", r#"window = "367d""#]);
        assert!(
            err.starts_with(r#"policies.p: buckets[1]: window (line 13, column 10): "367d" is out of range"#)
        );
    }

    #[test]
    fn a_bucket_name_used_twice_names_the_line_of_its_second_use() {
        let err = second_bucket(&[r#"on = ["ip"]"#, r#"name = "first""#, "limit = 1", r#"window = "1m""#]);
        assert_eq!(
            err,
            r#"policies.p: buckets[1]: name (line 11, column 8): the bucket name "first" is used twice"#
        );
    }

    #[test]
    fn mistakes_in_inline_tables_and_dotted_keys_name_their_line() {
        let err = error_in(&[
            r#"policies.ok = { identifiers = { e = "text" }, buckets = [{ name = "b", on = ["e"], limit = 1, window = "1s" }] }"#,
            r#"policies.p.identifiers = { e = "text" }"#,
            r#"policies.p.buckets = [{ name = "b", on = ["e"], limit = 1, window = "1s" },"#,
            r#"  { name = "c", on = ["e"], limit = 1, window = "1 s" }]"#,
        ]);
        assert!(
            err.starts_with(r#"policies.p: buckets[1]: window (line 4, column 49): "1 s" is not"#),
            "{err}"
        );
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let err = error_in(&[
            "[policies.p]",
            r#"identifiers = { "café" = "text" }"#,
            "[[policies.p.buckets]]",
            r#"name = "b""#,
            r#"on = ["café", "cafe"]"#,
            "limit = 1",
            r#"window = "1m""#,
        ]);
        assert!(err.starts_with("policies.p: buckets[0]: on (line 5, column 15): \"cafe\""), "{err}");
    }

    #[test]
    fn offsets_past_the_end_or_inside_a_character_do_not_panic() {
        assert_eq!(line_column("a\nb", 99), (2, 2));
        assert_eq!(line_column("é", 1), (1, 2));
        assert_eq!(line_column("", 0), (1, 1));
    }

    #[test]
    fn a_loaded_file_names_its_path_before_the_line() {
        let path = std::env::temp_dir().join(format!("pglimit-policy-lines-{}.toml", std::process::id()));
        let lines = [
            &HEAD[..],
            &["[[policies.p.buckets]]", r#"name = "b""#, "on = []", "limit = 1", r#"window = "1m""#],
        ]
        .concat();
        std::fs::write(&path, lines.join("\n")).expect("write the policy file");
        let err = Policies::load(&path).expect_err("the file has a mistake").to_string();
        std::fs::remove_file(&path).expect("remove the policy file");
        let expected = format!(
            "policy file {}: policies.p: buckets[1]: on (line 11, column 6): list at least one identifier",
            path.display()
        );
        assert_eq!(err, expected);
    }
}
