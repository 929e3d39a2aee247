//! `POST /admin/explain`: what `/check` would answer now for the same body,
//! and why (see `limiter::Explain`). An admin route: the answer names
//! blocks, overrides and waiters, which the application need not see.
//! Nothing is counted: explain reads the buckets and decides from them.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

use super::admin::verify;
use super::body::{body_bytes, parse_check};
use super::guard::JsonContent;
use super::AppState;
use crate::error::Error;
use crate::limiter::Explanation;
use crate::storage::Key;
use chrono::{DurationRound, TimeDelta};

pub async fn explain(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Explanation>, Error> {
    verify(&state, &headers)?;
    // The body of a check, refused as /check refuses it; a valid
    // `max_wait` plays no part.
    let (request, max_wait) = parse_check(&body_bytes(body)?)?;
    if let Some(text) = &max_wait {
        super::check::wait_of(&state, text)?;
    }
    let explanation = state.explain.explain(&request).await?;
    Ok(Json(with_denials(&state, explanation).await))
}

/// The explanation with each key's place in the top list, so that an
/// identity typed in shows whether it is among the most denied. Left out
/// when the list is off or cannot be read (Postgres away).
async fn with_denials(state: &AppState, explanation: Explanation) -> Explanation {
    if !state.top.is_on() {
        return explanation;
    }
    let keys: Vec<Key> = explanation.buckets.iter().map(|b| b.full_key).collect();
    let retention = state.top.retention();
    match state.top.denials_of(&keys, retention).await {
        Ok(found) => {
            // The list counts whole minutes: from the start of the oldest one kept.
            let back =
                TimeDelta::from_std(retention).map_or(explanation.checked_at, |r| explanation.checked_at - r);
            let since = back.duration_trunc(TimeDelta::minutes(1)).unwrap_or(back);
            explanation.with_denials(&found, since)
        }
        Err(error) => {
            tracing::debug!(%error, "explain could not read the top list");
            explanation
        }
    }
}
