//! The policy file: TOML read into raw types, then validated into
//! [`Policy`] values, every mistake placed at its line and column.
//!
//! An error names the place and what is wrong, never the file's text there:
//! overrides hold emails and addresses, and errors go to the log.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::declared::{kinds_and_shown, RawIdentifier};
use super::forward_auth::{self, RawForwardAuth};
use super::overrides::{validate_overrides, RawOverride};
use super::{
    format_window, is_valid_name, parse_block_for, parse_window, parse_window_in, BucketDef, FallbackShare,
    IdentifierKind, Mode, OnStoreError, Policy, DEFAULT_MAX_LEASE_LIFE,
};
use crate::algorithm::Algorithm;

/// Parses and validates a whole file; the error is a sentence with a place.
pub(super) fn parse(text: &str) -> Result<Vec<Policy>, String> {
    let file: File = toml::from_str(text).map_err(|e| describe_toml(&e, text))?;
    if file.policies.is_empty() {
        return Err("no policies defined: add at least one [policies.<name>] table".into());
    }
    file.policies
        .into_iter()
        .map(|(name, raw)| {
            raw.validate(&name).map_err(|m| m.within(&format!("policies.{}", name.get_ref())).describe(text))
        })
        .collect()
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
    identifiers: BTreeMap<String, RawIdentifier>,
    buckets: Spanned<Vec<RawBucket>>,
    #[serde(default)]
    on_store_error: OnStoreError,
    #[serde(default)]
    fallback_share: FallbackShare,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    overrides: Vec<Spanned<RawOverride>>,
    #[serde(default)]
    forward_auth: Option<RawForwardAuth>,
    #[serde(default)]
    max_lease_life: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    name: Spanned<String>,
    on: Spanned<Vec<Spanned<String>>>,
    limit: Spanned<u64>,
    /// Every algorithm's but concurrency's, which has `lease` instead.
    #[serde(default)]
    window: Option<Spanned<String>>,
    #[serde(default)]
    lease: Option<Spanned<String>>,
    #[serde(default)]
    timezone: Option<Spanned<String>>,
    #[serde(default)]
    algorithm: Algorithm,
    #[serde(default)]
    block_for: Option<Spanned<String>>,
}

/// A mistake found after deserialising: the path to the offending value, where
/// that value starts in the file, and what is wrong with it. The toml crate
/// places its own errors; these it cannot see, so they carry their span until
/// [`Policies::parse`], which has the text to turn it into a line.
pub(super) struct Mistake {
    path: String,
    span: Range<usize>,
    message: String,
}

impl Mistake {
    pub(super) fn at<T>(value: &Spanned<T>, path: &str, message: impl Into<String>) -> Self {
        Self { path: path.into(), span: value.span(), message: message.into() }
    }

    /// Prefixes the path with the enclosing value's; an empty path means the
    /// mistake is that enclosing value itself (a policy's name).
    pub(super) fn within(self, parent: &str) -> Self {
        let path = if self.path.is_empty() { parent.into() } else { format!("{parent}: {}", self.path) };
        Self { path, ..self }
    }

    fn describe(&self, text: &str) -> String {
        let (line, column) = line_column(text, self.span.start);
        format!("{} (line {line}, column {column}): {}", self.path, self.message)
    }
}

/// The toml crate's error as one line, "line L, column C: message": its
/// `Display` would quote the file's line, and serde's message the value it
/// found where another type was expected.
fn describe_toml(error: &toml::de::Error, text: &str) -> String {
    let message = without_found_value(error.message()).replace('\n', "; ");
    match error.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// `invalid type: string "a@b.example", expected u64` becomes `invalid
/// type: string, expected u64`: the kind of value found, not the value.
fn without_found_value(message: &str) -> String {
    for lead in ["invalid type: ", "invalid value: "] {
        // The last ", expected ": the value itself may hold one.
        if let Some((found, expected)) = message.strip_prefix(lead).and_then(|m| m.rsplit_once(", expected "))
        {
            let kind = found.split(['`', '"']).next().unwrap_or_default().trim_end();
            return format!("{lead}{kind}, expected {expected}");
        }
    }
    message.to_owned()
}

/// 1-based line and column of byte `offset`, counting columns in characters
/// as the toml crate's own errors do, so both kinds of error agree.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
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
        let max_lease_life = self.max_lease_life()?;
        let (identifiers, shown) = kinds_and_shown(self.identifiers);
        let buckets = validate_buckets(self.buckets.into_inner(), &identifiers, max_lease_life)?;
        if let (Some(raw), None) = (&self.max_lease_life, super::leasing(&buckets)) {
            let message = "max_lease_life goes with a concurrency bucket, and this policy has none";
            return Err(Mistake::at(raw, "max_lease_life", message));
        }
        let overrides = validate_overrides(self.overrides, &identifiers, &buckets)?;
        let forward_auth = (self.forward_auth.as_ref())
            .map(|raw| forward_auth::validate(raw, &identifiers).map_err(|m| m.within("forward_auth")))
            .transpose()?;
        if let (Some(raw), Some(bucket)) = (&self.forward_auth, super::leasing(&buckets)) {
            let message = format!(
                "a proxy cannot release a lease, and bucket {:?} is a concurrency bucket: check this policy \
                 through POST /check and /release, or drop the table",
                &*bucket.name
            );
            return Err(Mistake::at(raw, "forward_auth", message));
        }
        Ok(Policy {
            name: name.get_ref().as_str().into(),
            identifiers,
            shown,
            buckets,
            on_store_error: self.on_store_error,
            fallback_share: self.fallback_share,
            mode: self.mode,
            overrides,
            forward_auth,
            max_lease_life,
        })
    }

    fn max_lease_life(&self) -> Result<Duration, Mistake> {
        let Some(text) = &self.max_lease_life else {
            return Ok(DEFAULT_MAX_LEASE_LIFE);
        };
        parse_window(text.get_ref()).map_err(|e| Mistake::at(text, "max_lease_life", e))
    }
}

fn validate_buckets(
    raw: Vec<RawBucket>,
    identifiers: &BTreeMap<String, IdentifierKind>,
    max_lease_life: Duration,
) -> Result<Vec<BucketDef>, Mistake> {
    let mut seen = HashSet::new();
    let mut buckets = Vec::with_capacity(raw.len());
    for (i, raw) in raw.into_iter().enumerate() {
        let name_span = raw.name.span();
        let bucket =
            raw.validate(identifiers, max_lease_life).map_err(|m| m.within(&format!("buckets[{i}]")))?;
        if !seen.insert(bucket.name.clone()) {
            let message = format!("the bucket name {:?} is used twice", bucket.name);
            return Err(Mistake { path: format!("buckets[{i}]: name"), span: name_span, message });
        }
        buckets.push(bucket);
    }
    Ok(buckets)
}

impl RawBucket {
    /// The bucket's window, or a concurrency bucket's lease time, which the
    /// bucket keeps as its window, with the field it was given in. A
    /// concurrency bucket must say its lease (how long a crashed caller may
    /// hold a slot is for its owner to say).
    fn window_or_lease(&self) -> Result<(&Spanned<String>, &'static str), Mistake> {
        let concurrency = self.algorithm == Algorithm::Concurrency;
        let (field, given, other) = match concurrency {
            true => ("lease", &self.lease, self.window.as_ref().map(|w| (w, "window"))),
            false => ("window", &self.window, self.lease.as_ref().map(|l| (l, "lease"))),
        };
        if let Some((value, name)) = other {
            let message = match concurrency {
                true => "a concurrency bucket has a lease (e.g. lease = \"30s\"), not a window",
                false => "lease goes with algorithm = \"concurrency\" only",
            };
            return Err(Mistake::at(value, name, message));
        }
        let Some(text) = given else {
            let message = match concurrency {
                true => {
                    "a concurrency bucket needs lease = \"30s\" (how long a slot is held unless released)"
                }
                false => "window is required (e.g. window = \"60s\")",
            };
            return Err(Mistake::at(&self.name, field, message));
        };
        Ok((text, field))
    }

    fn validate(
        self,
        identifiers: &BTreeMap<String, IdentifierKind>,
        max_lease_life: Duration,
    ) -> Result<BucketDef, Mistake> {
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
        algorithm.check_limit(limit).map_err(|e| Mistake::at(&self.limit, "limit", e.to_string()))?;
        let (text, field) = self.window_or_lease()?;
        let timezone = self.timezone.as_ref();
        let (window, calendar) =
            parse_window_in(text.get_ref(), timezone.map(|t| t.get_ref().as_str()), algorithm).map_err(
                |e| match timezone.filter(|_| e.field == "timezone") {
                    Some(zone) => Mistake::at(zone, e.field, e.message),
                    None => Mistake::at(text, field, e.message),
                },
            )?;
        if algorithm == Algorithm::Concurrency && window > max_lease_life {
            let (lease, most) = (format_window(window), format_window(max_lease_life));
            let message = format!("lease {lease} is longer than this policy's max_lease_life ({most})");
            return Err(Mistake::at(text, field, message));
        }
        let block_for = (self.block_for.as_ref())
            .map(|text| parse_block_for(text.get_ref()).map_err(|e| Mistake::at(text, "block_for", e)))
            .transpose()?;
        let on = self.on.into_inner().into_iter().map(Spanned::into_inner).collect();
        Ok(BucketDef {
            name: self.name.into_inner().into(),
            on,
            limit,
            window,
            algorithm,
            calendar,
            block_for,
        })
    }
}
