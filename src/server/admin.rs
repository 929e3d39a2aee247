//! The admin routes: `POST`, `DELETE` and `GET /admin/blocks`; `GET` and
//! `DELETE /admin/slow-checks`; and who acts on them ([`acting`]).
//!
//! They take an admin token (`PGLIMIT_ADMIN_TOKENS`), never an API token:
//! an application may reset its own users' counters, but only an operator
//! blocks. Without admin tokens they are served on a loopback bind only.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use chrono::SecondsFormat;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Actor;
use super::body::{body_bytes, deserialize, unique_keys};
use super::guard::JsonContent;
use super::AppState;
use crate::error::Error;
use crate::limiter::BlockRequest;
use crate::storage::{Acting, Block, BlockTarget};
use crate::telemetry::{SlowCheck, SlowListing};

/// Most blocks one listing returns, and the default.
const MAX_LISTED: u32 = 10_000;
const DEFAULT_LISTED: u32 = 1_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockBody {
    policy: String,
    #[serde(deserialize_with = "unique_keys")]
    identifiers: Option<BTreeMap<String, String>>,
    bucket: Option<String>,
    #[serde(rename = "for")]
    duration: Option<String>,
    reason: Option<String>,
}

impl BlockBody {
    fn into_request(self) -> Result<BlockRequest, Error> {
        let identifiers =
            self.identifiers.ok_or_else(|| Error::field("identifiers", "identifiers is required"))?;
        let (policy, bucket, duration, reason) = (self.policy, self.bucket, self.duration, self.reason);
        Ok(BlockRequest { policy, identifiers, bucket, duration, reason })
    }
}

/// Who the request's admin token stands for; an error if it is not one.
pub(super) fn verify(state: &AppState, headers: &HeaderMap) -> Result<Actor, Error> {
    state.admin.as_ref().ok_or(Error::AdminDisabled)?.identify(headers)
}

/// [`verify`], and the request's id as the layers set it: who acts, for
/// the audit log.
pub(super) fn acting(state: &AppState, headers: &HeaderMap) -> Result<Acting, Error> {
    let Actor(actor) = verify(state, headers)?;
    Ok(Acting { actor: actor.to_string(), request_id: request_id(headers) })
}

/// The `x-request-id` the layers set (the caller's, if plain, else a new one).
pub(super) fn request_id(headers: &HeaderMap) -> Option<String> {
    headers.get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

pub async fn block(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Error> {
    let by = acting(&state, &headers)?;
    let request = deserialize::<BlockBody>(&body_bytes(body)?)?.into_request()?;
    let (targets, until) = state.actions.block(&request, &by).await?;
    Ok(Json(json!({ "blocked": targets.iter().map(target).collect::<Vec<_>>(), "until": at(&until) })))
}

pub async fn unblock(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Error> {
    let by = acting(&state, &headers)?;
    let request = deserialize::<BlockBody>(&body_bytes(body)?)?.into_request()?;
    let (targets, lifted) = state.actions.unblock(&request, &by).await?;
    Ok(Json(json!({ "unblocked": targets.iter().map(target).collect::<Vec<_>>(), "lifted": lifted })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listing {
    limit: Option<u32>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Listing>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, Error> {
    verify(&state, &headers)?;
    let Query(listing) = query.map_err(|e| Error::field("limit", e.body_text()))?;
    let limit = listing.limit.unwrap_or(DEFAULT_LISTED);
    if !(1..=MAX_LISTED).contains(&limit) {
        return Err(Error::field("limit", format!("limit must be from 1 to {MAX_LISTED}")));
    }
    let blocks = state.actions.blocks(limit).await?;
    Ok(Json(json!({ "blocks": blocks.iter().map(listed).collect::<Vec<_>>() })))
}

/// `GET /admin/slow-checks`: the slowest checks since the last reset, the
/// slowest first.
pub async fn slow_checks(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, Error> {
    verify(&state, &headers)?;
    Ok(Json(slow_listing(&state.slow_checks.listing())))
}

/// `DELETE /admin/slow-checks`: empties the log; answers what it held.
pub async fn reset_slow_checks(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, Error> {
    verify(&state, &headers)?;
    Ok(Json(slow_listing(&state.slow_checks.reset())))
}

fn slow_listing(listing: &SlowListing) -> Value {
    json!({
        "capacity": listing.capacity,
        "since": at(&listing.since),
        "seen": listing.seen,
        "checks": listing.checks.iter().map(slow_check).collect::<Vec<_>>(),
    })
}

/// One slow check in whole microseconds, the rest computed from the rounded
/// figures so that the phases add up to the total exactly.
fn slow_check(c: &SlowCheck) -> Value {
    let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let (total, queue, call) = (us(c.total), us(c.queued), us(c.call));
    json!({
        "finished_at": at(&c.finished_at),
        "total_us": total,
        "queue_us": queue,
        "call_us": call,
        "rest_us": total.saturating_sub(queue).saturating_sub(call),
        "checks_in_call": c.checks_in_call,
        "store": c.store,
        "decision": c.decision,
        "policy": &*c.policy,
    })
}

/// A blocked bucket key, by the names an operator knows it by; never an identifier.
fn target(t: &BlockTarget) -> Value {
    json!({ "key": hex::encode(t.key), "policy": &*t.policy, "bucket": &*t.bucket })
}

/// Times as in every answer: RFC 3339, milliseconds, UTC.
pub(super) fn at(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn listed(b: &Block) -> Value {
    json!({
        "key": hex::encode(b.key),
        "kind": b.kind,
        "policy": b.policy,
        "bucket": b.bucket,
        "until": at(&b.until),
        "reason": b.reason,
        "created_at": at(&b.created_at),
    })
}
