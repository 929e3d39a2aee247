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
    Ok(Json(state.explain.explain(&request).await?))
}
