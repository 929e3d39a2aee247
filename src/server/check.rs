//! `POST /check`: JSON in, a [`Decision`] out (200 allowed, 429 denied).

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::admin;
use super::auth::{Actor, Authorization};
use super::body::{body_bytes, parse_check, parse_reset};
use super::guard::JsonContent;
use super::headers::insert_rate_limit_headers;
use super::layers;
use super::AppState;
use crate::error::Error;
use crate::limiter::{CheckError, CheckRequest, Decision};
use crate::policy::parse_max_wait;
use crate::storage::{Acting, CallTiming};
use crate::telemetry::SlowCheck;

pub async fn check(
    State(state): State<AppState>,
    authorization: Authorization,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    state.auth.verify_header(authorization.value())?;
    let (request, max_wait) = parse_check(&body_bytes(body)?)?;
    let max_wait = max_wait.map(|text| wait_of(&state, &text)).transpose()?;
    Ok(respond(decide(&state, &request, max_wait).await?))
}

/// A `max_wait` as written, within this service's bound.
pub(super) fn wait_of(state: &AppState, text: &str) -> Result<Duration, Error> {
    let bound = state.waiting.queues().limits().max_wait;
    parse_max_wait(text, bound).map_err(|reason| Error::field("max_wait", format!("max_wait: {reason}")))
}

/// Decides `request` and notes the outcome on the request's span and in the
/// slow-check log: the one path of `/check`, `/auth/{policy}` and gRPC.
/// With `max_wait`, a check that would be denied may be held (see
/// `limiter::Waiting`); without, it goes straight to `limiter::Checks`.
pub async fn decide(
    state: &AppState,
    request: &CheckRequest,
    max_wait: Option<Duration>,
) -> Result<Decision, CheckError> {
    // Timed only for the slow-check log, so not at all when it is off; a
    // check held by max_wait took its time by request, and is left out.
    let started = state.slow_checks.enabled().then(Instant::now);
    let decision = match max_wait {
        Some(max_wait) => state.waiting.check(request, max_wait).await,
        None => state.checks.check(request).await,
    };
    let held = decision.as_ref().is_ok_and(|d| d.waited_ms.is_some_and(|ms| ms > 0));
    let started = started.filter(|_| !held);
    // An invalid request's policy name is the caller's text, not configuration: left out.
    let outcome = match &decision {
        Ok(decision) => {
            Outcome { decision: decision.outcome(), store: decision.store_label(), timing: decision.timing }
        }
        Err(CheckError::StoreUnavailable) => Outcome { decision: "error", store: "none", timing: None },
        Err(CheckError::Invalid(_)) => return decision,
    };
    layers::record_outcome(request.policy_label(), outcome.decision);
    if let Some(started) = started {
        offer_slow(state, request.policy_label(), started.elapsed(), outcome);
    }
    decision
}

/// A decided (or failed) check, labelled as metrics label it.
struct Outcome {
    decision: &'static str,
    store: &'static str,
    timing: Option<CallTiming>,
}

/// Offers a check that took `total` to the slow-check log; the entry is
/// built only if the check is among the slowest.
fn offer_slow(state: &AppState, policy: &str, total: Duration, outcome: Outcome) {
    state.slow_checks.offer(total, || {
        let none = CallTiming { queued: Duration::ZERO, call: Duration::ZERO, checks: 0 };
        let timing = outcome.timing.unwrap_or(none);
        SlowCheck {
            finished_at: chrono::Utc::now(),
            total,
            queued: timing.queued,
            call: timing.call,
            checks_in_call: timing.checks,
            store: outcome.store,
            decision: outcome.decision,
            policy: policy.into(),
        }
    });
}

/// `POST /reset`: the check's buckets (or those named) back to full, then
/// a peek at them. It takes an API token, or an admin token (an operator's
/// reset, from the console), and then the reset is audited.
pub async fn reset(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let by = operator(&state, &headers);
    if by.is_none() {
        state.auth.verify(&headers)?;
    }
    let (request, buckets) = parse_reset(&body_bytes(body)?)?;
    let decision = state.actions.reset(&request, buckets.as_deref(), by.as_ref()).await?;
    Ok(respond(decision))
}

/// Who acts, when the request holds an admin token (not when the admin
/// routes are open without one: such a reset is an application's).
fn operator(state: &AppState, headers: &HeaderMap) -> Option<Acting> {
    let admin = state.admin.as_ref().filter(|admin| !admin.is_open())?;
    let Actor(actor) = admin.identify(headers).ok()?;
    Some(Acting { actor: actor.to_string(), request_id: admin::request_id(headers) })
}

pub fn respond(decision: Decision) -> Response {
    respond_as(decision, StatusCode::TOO_MANY_REQUESTS)
}

/// 200 when allowed, `denied` when not, with the RateLimit headers and the
/// decision as the body.
pub fn respond_as(decision: Decision, denied: StatusCode) -> Response {
    let status = if decision.allowed { StatusCode::OK } else { denied };
    // Sized for a decision's body, so that it is written without growing.
    let mut body = Vec::with_capacity(256 + 192 * decision.buckets.len());
    if let Err(e) = serde_json::to_writer(&mut body, &decision) {
        tracing::error!(error = %e, "a decision could not be serialized");
        return Error::Internal.into_response();
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    // Room for every header the answer gets here and in the layers, so the
    // map is allocated once.
    let headers = response.headers_mut();
    headers.reserve(8);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    insert_rate_limit_headers(&decision, headers);
    response
}
