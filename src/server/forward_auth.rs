//! `/auth/{policy}` (any method): forward-auth for proxies, nginx's
//! `auth_request` and Traefik's `forwardAuth`. The identifiers come from
//! the request's headers as the policy's `forward_auth` table says; the
//! check is then exactly a `/check` of that policy, and so is the answer,
//! but for the status of a denial (429, or 403 for nginx).

use std::collections::BTreeMap;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::Response;

use super::check::{decide, respond_as};
use super::AppState;
use crate::error::Error;
use crate::limiter::{CheckError, CheckRequest, Invalid};
use crate::policy::{ForwardAuth, HeaderSource};

pub async fn forward_auth(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    state.auth.verify(&headers)?;
    let Ok(Path(name)) = path else {
        return Err(Error::NotFound(uri.path().to_owned()));
    };
    let table = table_of(&state, &name)?;
    let request = request(name, &table, &headers)?;
    // The operator's max_wait, within what this service's timeouts allow.
    let max_wait = table.max_wait.map(|w| w.min(state.waiting.queues().limits().max_wait));
    let decision = decide(&state, &request, max_wait).await.map_err(|e| blame_header(e, &table))?;
    let denied = StatusCode::from_u16(table.deny_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    Ok(respond_as(decision, denied))
}

/// The policy's `forward_auth` table; a policy without one is not offered
/// here, as if it did not exist.
fn table_of(state: &AppState, name: &str) -> Result<ForwardAuth, Error> {
    let policies = state.checks.policies();
    let policy = policies
        .get(name)
        .ok_or_else(|| Error::NoForwardAuth(format!("no policy named {name:?} is configured")))?;
    policy.forward_auth.clone().ok_or_else(|| {
        Error::NoForwardAuth(format!(
            "policy {name:?} has no [policies.{name}.forward_auth] table, so /auth/{name} is not offered"
        ))
    })
}

/// The check the headers describe: each identifier from its header, the
/// cost from the cost header (1 when the policy names none or the request
/// does not carry it).
fn request(policy: String, table: &ForwardAuth, headers: &HeaderMap) -> Result<CheckRequest, Error> {
    let mut identifiers = BTreeMap::new();
    for (name, source) in &table.sources {
        identifiers.insert(name.clone(), value(headers, source)?);
    }
    let cost = match &table.cost_header {
        Some(header) if headers.contains_key(header.as_str()) => cost(headers, header)?,
        _ => 1,
    };
    Ok(CheckRequest::Policy { policy, identifiers, cost })
}

/// At least 1: a cost of 0 is a peek on `/check`, and here it would let
/// anyone who can put the header on a request through uncounted.
fn cost(headers: &HeaderMap, header: &str) -> Result<u64, Error> {
    let cost: u64 = single(headers, header)?
        .parse()
        .map_err(|_| Error::header(header, "is not a whole number of units"))?;
    if cost == 0 {
        return Err(Error::header(header, "must be at least 1: forward-auth checks always count"));
    }
    Ok(cost)
}

fn value(headers: &HeaderMap, source: &HeaderSource) -> Result<String, Error> {
    match source.trusted_hops {
        None => single(headers, &source.header).map(str::to_owned),
        Some(hops) => from_the_right(headers, &source.header, hops),
    }
}

/// A header given once: twice would leave the value to whichever line a
/// component happened to read.
fn single<'h>(headers: &'h HeaderMap, header: &str) -> Result<&'h str, Error> {
    let mut lines = headers.get_all(header).iter();
    let first = lines.next().ok_or_else(|| Error::header(header, "the header is missing"))?;
    if lines.next().is_some() {
        return Err(Error::header(header, "the header is given more than once"));
    }
    text(first, header)
}

/// The entry `hops` places from the right of a comma-separated list (all the
/// header's lines, in order, are one list: RFC 9110, section 5.3). Each
/// trusted proxy appends the address it received the request from, so
/// the entry the outermost one added is the client's; anything further left
/// was written by the client and could be forged (see SECURITY.md).
fn from_the_right(headers: &HeaderMap, header: &str, hops: u8) -> Result<String, Error> {
    let mut entries = Vec::new();
    for line in headers.get_all(header) {
        entries.extend(text(line, header)?.split(',').map(str::trim));
    }
    if entries.is_empty() {
        return Err(Error::header(header, "the header is missing"));
    }
    let index = entries.len().checked_sub(usize::from(hops)).ok_or_else(|| {
        let count = entries.len();
        Error::header(header, format!("has {count} entries, fewer than the {hops} trusted hops configured"))
    })?;
    Ok(entries[index].to_owned())
}

fn text<'h>(value: &'h HeaderValue, header: &str) -> Result<&'h str, Error> {
    value.to_str().map_err(|_| Error::header(header, "is not visible ASCII"))
}

/// A mistake in a value is a mistake in the header it came from: the
/// problem names the header, not the identifier the proxy never saw.
fn blame_header(error: CheckError, table: &ForwardAuth) -> Error {
    let header_of = |name: &str| table.sources.get(name).map(|s| s.header.as_str());
    match error {
        CheckError::Invalid(Invalid::BadIdentifier { name, reason }) => match header_of(&name) {
            Some(header) => Error::header(header, reason),
            None => Invalid::BadIdentifier { name, reason }.into(),
        },
        CheckError::Invalid(invalid @ (Invalid::CostRange | Invalid::CostOverLimit { .. })) => {
            match &table.cost_header {
                Some(header) => Error::header(header, invalid),
                None => invalid.into(),
            }
        }
        CheckError::Invalid(Invalid::UnknownPolicy(name)) => {
            Error::NoForwardAuth(format!("no policy named {name:?} is configured"))
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append("x-forwarded-for", HeaderValue::from_str(line).expect("a header value"));
        }
        headers
    }

    #[test]
    fn the_entry_is_counted_from_the_right_across_every_line_of_the_header() {
        let headers = forwarded(&["198.51.100.1, 203.0.113.7", "192.0.2.10"]);
        let pick = |hops| from_the_right(&headers, "x-forwarded-for", hops).ok();
        assert_eq!(pick(1).as_deref(), Some("192.0.2.10"));
        assert_eq!(pick(2).as_deref(), Some("203.0.113.7"));
        assert_eq!(pick(3).as_deref(), Some("198.51.100.1"));
        assert!(pick(4).is_none(), "fewer entries than trusted hops is refused, not read from the left");
    }

    #[test]
    fn a_missing_list_header_is_refused_naming_it() {
        let error = from_the_right(&HeaderMap::new(), "x-forwarded-for", 1).expect_err("missing");
        assert!(matches!(error, Error::InvalidHeader { header, .. } if header == "x-forwarded-for"));
    }
}
