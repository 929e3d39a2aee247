//! The bodies of the API: `/check`'s and `/reset`'s two forms (a policy
//! with its identifiers, or an ad hoc key), and the JSON helpers every
//! handler shares, whose errors name the field at fault.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;

use super::MAX_BODY_BYTES;
use crate::algorithm::Algorithm;
use crate::error::Error;
use crate::limiter::CheckRequest;

/// The body, or the problem with it.
pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Error> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Error::BodyTooLarge { limit: MAX_BODY_BYTES },
        _ => Error::MalformedJson(rejection.body_text()),
    })
}

/// The body as sent: both forms in one shape, so that a field of the wrong
/// form is reported by name rather than as "no variant matched".
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    policy: Option<String>,
    #[serde(default, deserialize_with = "unique_keys")]
    identifiers: Option<BTreeMap<String, String>>,
    key: Option<String>,
    limit: Option<u64>,
    window: Option<String>,
    /// A calendar window's time zone (IANA), with `key` only.
    timezone: Option<String>,
    algorithm: Option<Algorithm>,
    /// With `"algorithm": "concurrency"`, in place of `window`.
    lease: Option<String>,
    cost: Option<u64>,
    /// `/reset` only: which of the check's buckets to reset.
    buckets: Option<Vec<String>>,
    /// `/check` only: how long the check may be held for room (`"2s"`).
    max_wait: Option<String>,
}

/// Parses a body into one of the two forms; every error names the field at
/// fault. The values are validated by the limiter.
pub fn parse(body: &[u8]) -> Result<CheckRequest, Error> {
    parse_check(body).map(|(request, _)| request)
}

/// [`parse`], with the `max_wait` as written, if any.
pub fn parse_check(body: &[u8]) -> Result<(CheckRequest, Option<String>), Error> {
    let mut raw: CheckBody = deserialize(body)?;
    if raw.buckets.is_some() {
        return Err(Error::field("buckets", "buckets goes with POST /reset, not /check"));
    }
    let max_wait = raw.max_wait.take();
    Ok((request(raw)?, max_wait))
}

/// A `/reset` body: a check's, and optionally which of its buckets.
pub fn parse_reset(body: &[u8]) -> Result<(CheckRequest, Option<Vec<String>>), Error> {
    let mut raw: CheckBody = deserialize(body)?;
    reject_present("max_wait", raw.max_wait.is_some(), "/reset")?;
    let buckets = raw.buckets.take();
    Ok((request(raw)?, buckets))
}

fn request(raw: CheckBody) -> Result<CheckRequest, Error> {
    let cost = raw.cost.unwrap_or(1);
    match (&raw.policy, &raw.key) {
        (Some(_), Some(_)) => {
            Err(Error::field("key", format!("give either {POLICY_FORM} or {KEY_FORM}, not both")))
        }
        (None, None) => Err(Error::field("policy", format!("give either {POLICY_FORM} or {KEY_FORM}"))),
        (Some(_), None) => policy_form(raw, cost),
        (None, Some(_)) => key_form(raw, cost),
    }
}

const POLICY_FORM: &str = "\"policy\" (with \"identifiers\")";
const KEY_FORM: &str = "\"key\" (with \"limit\" and \"window\")";

fn policy_form(raw: CheckBody, cost: u64) -> Result<CheckRequest, Error> {
    for (field, present) in [("limit", raw.limit.is_some()), ("window", raw.window.is_some())] {
        reject_present(field, present, "policy")?;
    }
    reject_present("algorithm", raw.algorithm.is_some(), "policy")?;
    reject_present("timezone", raw.timezone.is_some(), "policy")?;
    reject_present("lease", raw.lease.is_some(), "policy")?;
    let identifiers = raw
        .identifiers
        .ok_or_else(|| Error::field("identifiers", "identifiers is required with \"policy\""))?;
    Ok(CheckRequest::Policy { policy: raw.policy.unwrap_or_default(), identifiers, cost })
}

fn key_form(raw: CheckBody, cost: u64) -> Result<CheckRequest, Error> {
    reject_present("identifiers", raw.identifiers.is_some(), "key")?;
    let limit = raw.limit.ok_or_else(|| Error::field("limit", "limit is required with \"key\""))?;
    let algorithm = raw.algorithm.unwrap_or_default();
    let window = if algorithm == Algorithm::Concurrency {
        concurrency_lease(raw.window.is_some(), raw.lease)?
    } else {
        if raw.lease.is_some() {
            return Err(Error::field("lease", "lease goes with \"algorithm\": \"concurrency\" only"));
        }
        raw.window.ok_or_else(|| Error::field("window", "window is required with \"key\" (e.g. \"60s\")"))?
    };
    let (key, timezone) = (raw.key.unwrap_or_default(), raw.timezone);
    Ok(CheckRequest::AdHoc { key, limit, window, timezone, algorithm, cost })
}

/// A concurrency bucket's lease time, which it has in place of a window:
/// required, since how long a crashed caller may hold a slot is the
/// caller's to say. It travels as the bucket's window from here on.
fn concurrency_lease(window: bool, lease: Option<String>) -> Result<String, Error> {
    if window {
        return Err(Error::field("window", "a concurrency bucket has a lease (e.g. \"30s\"), not a window"));
    }
    let lease = lease.ok_or_else(|| {
        Error::field("lease", "lease is required with \"algorithm\": \"concurrency\" (e.g. \"30s\")")
    })?;
    crate::policy::parse_window(&lease).map_err(|e| Error::field("lease", format!("lease: {e}")))?;
    Ok(lease)
}

fn reject_present(field: &str, present: bool, form: &str) -> Result<(), Error> {
    if present {
        return Err(Error::field(field, format!("{field} does not go with \"{form}\"")));
    }
    Ok(())
}

/// Parses `body` whole, or names what is wrong with it. A body that parses
/// is read once, without tracking the path, which cost a measurable share
/// of a check; only a failing one is read again to name the field at fault.
pub fn deserialize<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    match serde_json::from_slice(body) {
        Ok(raw) => Ok(raw),
        Err(_) => deserialize_naming_the_field(body),
    }
}

fn deserialize_naming_the_field<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let raw: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if !inner.is_data() {
            return Error::MalformedJson(inner.to_string());
        }
        let field = if path == "." { "body".to_string() } else { path };
        Error::field(field.clone(), format!("{field}: {inner}"))
    })?;
    de.end().map_err(|e| Error::MalformedJson(e.to_string()))?;
    Ok(raw)
}

/// Identifiers as a map that refuses a name given twice: JSON allows
/// duplicate keys, and silently keeping the last would let a caller send
/// one value to a validating proxy and another to pglimit.
pub fn unique_keys<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of identifier names to strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((name, value)) = map.next_entry::<String, String>()? {
                if out.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!("identifier {name:?} is given twice")));
                }
                out.insert(name, value);
            }
            Ok(Some(out))
        }
    }
    de.deserialize_any(Unique)
}
