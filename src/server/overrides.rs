//! `POST` and `GET /admin/overrides`, `DELETE /admin/overrides/{id}`:
//! overrides set at runtime (a customer's plan at signup, say), applied by
//! every instance within a second and before the policy file's. They take
//! an admin token, as the other admin routes do.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::SecondsFormat;
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin::{acting, verify};
use super::body::{body_bytes, deserialize};
use super::guard::JsonContent;
use super::AppState;
use crate::error::Error;
use crate::limiter::{OverrideError, OverrideRequest};
use crate::storage::StoredOverride;

/// Most overrides one listing returns, and the default.
const MAX_LISTED: u32 = 10_000;
const DEFAULT_LISTED: u32 = 1_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideBody {
    policy: String,
    when: BTreeMap<String, String>,
    limits: Option<BTreeMap<String, u64>>,
    unlimited: Option<bool>,
    deny: Option<bool>,
    until: Option<String>,
    note: Option<String>,
}

impl From<OverrideError> for Error {
    fn from(e: OverrideError) -> Self {
        match e {
            OverrideError::UnknownPolicy(name) => Self::UnknownPolicy(name),
            OverrideError::Invalid { field, detail } => Self::field(field, detail),
            OverrideError::Unavailable => Self::StoreUnavailable,
        }
    }
}

pub async fn add(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), Error> {
    let by = acting(&state, &headers)?;
    let OverrideBody { policy, when, limits, unlimited, deny, until, note } =
        deserialize(&body_bytes(body)?)?;
    let request = OverrideRequest { policy, when, limits, unlimited, deny, until, note };
    let added = state.overrides.add(&request, &by).await?;
    let mut body = listed(&added.stored);
    body["replaced"] = json!(added.replaced);
    Ok((StatusCode::CREATED, Json(body)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listing {
    policy: Option<String>,
    limit: Option<u32>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Listing>, QueryRejection>,
) -> Result<Json<Value>, Error> {
    verify(&state, &headers)?;
    let Query(listing) = query.map_err(|e| Error::field("query", e.body_text()))?;
    let limit = listing.limit.unwrap_or(DEFAULT_LISTED);
    if !(1..=MAX_LISTED).contains(&limit) {
        return Err(Error::field("limit", format!("limit must be from 1 to {MAX_LISTED}")));
    }
    if let Some(policy) = listing.policy.as_deref().filter(|p| state.overrides.policies().get(p).is_none()) {
        return Err(Error::UnknownPolicy(policy.to_owned()));
    }
    let overrides = state.overrides.list(listing.policy.as_deref(), limit).await?;
    Ok(Json(json!({ "overrides": overrides.iter().map(listed).collect::<Vec<_>>() })))
}

pub async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let by = acting(&state, &headers)?;
    if !state.overrides.remove(&id, &by).await? {
        return Err(Error::UnknownOverride(id));
    }
    Ok(Json(json!({ "removed": id })))
}

/// An override in the shape it was given, exact values shown only by their
/// keyed hash (`hmac:<hex>`).
fn listed(o: &StoredOverride) -> Value {
    let mut out = json!({
        "id": o.id,
        "policy": o.policy,
        "when": o.when,
        "until": o.until.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
        "note": o.note,
        "created_at": o.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
    });
    match o.action.as_str() {
        "limits" => out["limits"] = json!(o.limits),
        action => out[action] = json!(true),
    }
    out
}
