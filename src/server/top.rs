//! `GET /admin/top`: the most-denied keys, summed over every instance,
//! this instance's latest counts written first.
//!
//! Keys are shown by the start of their hash; an identifier only where its
//! policy marks it `show = true`. Admin token, as the other admin routes.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use super::AppState;
use crate::error::Error;
use crate::policy::{format_window, parse_window};
use crate::storage::{TopKey, TopQuery};

/// The parameters, each named in the problem about it.
const PARAMETERS: [&str; 4] = ["policy", "bucket", "since", "limit"];
/// Most keys one answer lists, and the default.
const MAX_LISTED: u32 = 1000;
const DEFAULT_LISTED: u32 = 50;
const DEFAULT_SINCE: Duration = Duration::from_secs(3600);
/// How ad hoc keys' denials are filed: their metrics' policy label.
const ADHOC: &str = crate::telemetry::ADHOC;

pub async fn top(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, Error> {
    super::admin::verify(&state, &headers)?;
    if !state.top.is_on() {
        return Err(Error::TopOff);
    }
    let Query(pairs) = query.map_err(|e| Error::field("query", e.body_text()))?;
    let query = top_query(&state, &once_each(pairs)?)?;
    let list = state.top.list(&query).await.map_err(|e| {
        tracing::debug!(error = %e, "top list: Postgres did not answer");
        Error::StoreUnavailable
    })?;
    let keys: Vec<Value> = list.keys.iter().map(listed).collect();
    Ok(Json(json!({ "since": at(&list.since), "until": at(&list.until), "keys": keys })))
}

/// The parameters by name, each given at most once: a repeat is refused
/// rather than one of its values silently chosen.
fn once_each(pairs: Vec<(String, String)>) -> Result<BTreeMap<String, String>, Error> {
    let mut given = BTreeMap::new();
    for (name, value) in pairs {
        if given.contains_key(&name) {
            return Err(Error::field("query", format!("parameter {name:?} is given twice")));
        }
        given.insert(name, value);
    }
    Ok(given)
}

/// The query `given` asks for, each parameter checked.
fn top_query(state: &AppState, given: &BTreeMap<String, String>) -> Result<TopQuery, Error> {
    if let Some(unknown) = given.keys().find(|k| !PARAMETERS.contains(&k.as_str())) {
        let detail = format!("unknown parameter {unknown:?}: expected policy, bucket, since or limit");
        return Err(Error::field(unknown.clone(), detail));
    }
    let policy = given.get("policy").cloned();
    let bucket = given.get("bucket").cloned();
    // Postgres' text holds no NUL, so no stored name has one: said, not sent.
    if bucket.as_deref().is_some_and(|b| b.contains('\0')) {
        return Err(Error::field("bucket", "bucket cannot contain a NUL character"));
    }
    if let Some(name) = &policy {
        known_bucket(state, name, bucket.as_deref())?;
    }
    let retention = state.top.retention();
    let since = match given.get("since") {
        None => DEFAULT_SINCE.min(retention),
        Some(text) => parse_window(text).map_err(|e| Error::field("since", format!("since: {e}")))?,
    };
    if since > retention {
        let kept = format_window(retention);
        let detail = format!(
            "since reaches further back than the top list keeps denials: {kept} (PGLIMIT_TOP_RETENTION)"
        );
        return Err(Error::field("since", detail));
    }
    let limit = match given.get("limit") {
        None => DEFAULT_LISTED,
        Some(text) => text.parse().ok().filter(|n| (1..=MAX_LISTED).contains(n)).ok_or_else(|| {
            Error::field("limit", format!("limit must be a whole number from 1 to {MAX_LISTED}"))
        })?,
    };
    Ok(TopQuery { policy, bucket, since, limit })
}

/// Refuses a policy that is not in force (nor `_adhoc`), and a bucket it lacks.
fn known_bucket(state: &AppState, policy: &str, bucket: Option<&str>) -> Result<(), Error> {
    let names: Vec<String> = if policy == ADHOC {
        vec!["default".into()]
    } else {
        let policies = state.checks.policies();
        let found = policies.get(policy).ok_or_else(|| Error::UnknownPolicy(policy.to_owned()))?;
        found.buckets.iter().map(|b| b.name.to_string()).collect()
    };
    match bucket {
        Some(name) if !names.iter().any(|n| n == name) => {
            Err(Error::field("bucket", format!("policy {policy:?} has no bucket {name:?}")))
        }
        _ => Ok(()),
    }
}

fn listed(k: &TopKey) -> Value {
    json!({
        "policy": k.policy,
        "bucket": k.bucket,
        "key": hex::encode(&k.key[..8]),
        "shown": k.shown,
        "denials": k.denials,
        "first": at(&k.first),
        "last": at(&k.last),
    })
}

/// Times as in every answer: RFC 3339, milliseconds, UTC.
fn at(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
