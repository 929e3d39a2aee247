//! `GET /admin/overview`: what the console's first page shows, in one
//! call: which store answers and how many instances share it, the policies
//! in force with their buckets, and this instance's checks and denials in
//! each of the last 15 minutes. Takes an admin token.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use chrono::{SecondsFormat, Utc};
use serde_json::{json, Value};

use super::admin::verify;
use super::AppState;
use crate::policy::{format_window, BucketDef, Policy};
use crate::storage::Store;
use crate::telemetry::Minute;

pub async fn overview(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, crate::error::Error> {
    verify(&state, &headers)?;
    let store = state.checks.store();
    let degraded = store.is_degraded();
    let kind = if degraded { "memory" } else { "postgres" };
    let shared = state.checks.shared();
    let policies = state.checks.policies();
    let mut policies: Vec<_> = policies.iter().collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    let minutes = shared.minutes().last(Utc::now());
    Ok(Json(json!({
        "store": { "kind": kind, "degraded": degraded, "instances": store.instances() },
        "policies": policies.iter().map(|p| policy(p, shared.is_shadow(p))).collect::<Vec<_>>(),
        "minutes": minutes.iter().map(minute).collect::<Vec<_>>(),
    })))
}

fn policy(p: &Policy, shadow: bool) -> Value {
    json!({ "name": &*p.name, "shadow": shadow, "buckets": p.buckets.iter().map(bucket).collect::<Vec<_>>() })
}

/// A bucket as a policy file writes it: a calendar window by its
/// spelling and zone, any other by the shortest duration.
fn bucket(b: &BucketDef) -> Value {
    let window = match &b.calendar {
        Some(calendar) => format!("{} ({})", calendar.unit.spelling(), calendar.zone.name()),
        None => format_window(b.window),
    };
    json!({
        "name": &*b.name,
        "algorithm": b.algorithm.name(),
        "limit": b.limit,
        "window": window,
        "identifiers": b.on,
    })
}

fn minute(m: &Minute) -> Value {
    json!({
        "minute": m.start.to_rfc3339_opts(SecondsFormat::Secs, true),
        "checks": m.checks,
        "denied": m.denied,
    })
}
