//! A policy's `[policies.NAME.forward_auth]` table: where a proxy's
//! forward-auth request (`/auth/NAME`) carries each identifier, and how a
//! denial is answered. Validated at load like the rest of the file.
//!
//! ```toml
//! [policies.login.forward_auth]
//! ip = { header = "x-forwarded-for", trusted_hops = 1 }
//! email = { header = "x-user-email" }
//! cost_header = "x-ratelimit-cost"     # optional; absent header: cost 1
//! deny_status = 403                     # optional; 429 (default) or 403
//! max_wait = "2s"                       # optional; hold a denied request up to this
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::file::Mistake;
use super::IdentifierKind;

/// Most proxies a deployment puts in front of pglimit's caller: more than
/// this is a mistake, not a topology.
pub const MAX_TRUSTED_HOPS: u8 = 16;

/// The options of the table; every other key names an identifier.
const COST_HEADER: &str = "cost_header";
const DENY_STATUS: &str = "deny_status";
const MAX_WAIT: &str = "max_wait";

/// Where each identifier of a policy comes from in a forward-auth request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuth {
    /// Identifier name → its header, one for each of the policy's identifiers.
    pub sources: BTreeMap<String, HeaderSource>,
    /// The header holding the cost (a whole number); without it, cost 1.
    pub cost_header: Option<String>,
    /// 429, or 403 for nginx, whose `auth_request` passes on only 401 and 403.
    pub deny_status: u16,
    /// Hold a request that would be denied up to this long, as a check's
    /// `max_wait` (cut to the service's bound, see `limiter::WaitLimits`).
    pub max_wait: Option<std::time::Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSource {
    /// Lower-case, as HTTP/2 sends it and as header maps compare it.
    pub header: String,
    /// For a list of addresses such as `X-Forwarded-For`: how many proxies
    /// you trust appended to it, so the value is the entry this many places
    /// from the right (the one the outermost trusted proxy added). `None`:
    /// the header's whole value is the identifier.
    pub trusted_hops: Option<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    header: String,
    trusted_hops: Option<i64>,
}

pub(super) type RawForwardAuth = Spanned<BTreeMap<Spanned<String>, Spanned<toml::Value>>>;

/// Validates the table against the policy's identifiers: one entry for
/// each, no other, every header name well formed.
pub(super) fn validate(
    raw: &RawForwardAuth,
    identifiers: &BTreeMap<String, IdentifierKind>,
) -> Result<ForwardAuth, Mistake> {
    let mut auth =
        ForwardAuth { sources: BTreeMap::new(), cost_header: None, deny_status: 429, max_wait: None };
    for (key, value) in raw.get_ref() {
        match key.get_ref().as_str() {
            COST_HEADER => auth.cost_header = Some(header_name(value, COST_HEADER)?),
            DENY_STATUS => auth.deny_status = deny_status(value)?,
            MAX_WAIT => auth.max_wait = Some(max_wait(value)?),
            name => {
                let Some(&kind) = identifiers.get(name) else {
                    let message = format!(
                        "{name:?} is not one of this policy's identifiers (nor {COST_HEADER}, {DENY_STATUS} or {MAX_WAIT})"
                    );
                    return Err(Mistake::at(key, "", message));
                };
                auth.sources.insert(name.to_owned(), source(value, name, kind)?);
            }
        }
    }
    if let Some(name) = identifiers.keys().find(|n| !auth.sources.contains_key(*n)) {
        let message = if [COST_HEADER, DENY_STATUS, MAX_WAIT].contains(&name.as_str()) {
            format!("the identifier {name:?} shares its name with an option of this table: rename it")
        } else {
            format!("no entry for the identifier {name:?}: add {name} = {{ header = \"...\" }}")
        };
        return Err(Mistake::at(raw, "", message));
    }
    Ok(auth)
}

fn source(value: &Spanned<toml::Value>, name: &str, kind: IdentifierKind) -> Result<HeaderSource, Mistake> {
    let raw: RawSource = value.get_ref().clone().try_into().map_err(|e: toml::de::Error| {
        let reason = e.message().to_owned();
        Mistake::at(value, name, format!("expected {{ header = \"...\", trusted_hops = n }}: {reason}"))
    })?;
    let header = valid_header(&raw.header).map_err(|m| Mistake::at(value, name, m))?;
    let trusted_hops = match raw.trusted_hops {
        None => None,
        Some(_) if kind != IdentifierKind::Ip => {
            return Err(Mistake::at(value, name, "trusted_hops picks an address: only for an ip identifier"));
        }
        Some(hops) => {
            Some(u8::try_from(hops).ok().filter(|h| (1..=MAX_TRUSTED_HOPS).contains(h)).ok_or_else(|| {
                Mistake::at(value, name, format!("trusted_hops must be between 1 and {MAX_TRUSTED_HOPS}"))
            })?)
        }
    };
    Ok(HeaderSource { header, trusted_hops })
}

fn header_name(value: &Spanned<toml::Value>, path: &str) -> Result<String, Mistake> {
    let text = value.get_ref().as_str().ok_or_else(|| Mistake::at(value, path, "expected a header name"))?;
    valid_header(text).map_err(|m| Mistake::at(value, path, m))
}

fn deny_status(value: &Spanned<toml::Value>) -> Result<u16, Mistake> {
    match value.get_ref().as_integer() {
        Some(429) => Ok(429),
        Some(403) => Ok(403),
        _ => {
            Err(Mistake::at(value, DENY_STATUS, "must be 429 (the default) or 403 (for nginx auth_request)"))
        }
    }
}

/// Checked against the ceiling here; the service's own bound (from its
/// timeouts) is applied on each request.
fn max_wait(value: &Spanned<toml::Value>) -> Result<std::time::Duration, Mistake> {
    let text = value
        .get_ref()
        .as_str()
        .ok_or_else(|| Mistake::at(value, MAX_WAIT, "expected a duration such as \"2s\""))?;
    super::parse_max_wait(text, super::MAX_WAIT_CEILING).map_err(|m| Mistake::at(value, MAX_WAIT, m))
}

/// A header name is an RFC 9110 token; kept lower-case.
fn valid_header(name: &str) -> Result<String, String> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 128 || !name.bytes().all(tchar) {
        return Err(format!(
            "{name:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~, at most 128)"
        ));
    }
    Ok(name.to_ascii_lowercase())
}
