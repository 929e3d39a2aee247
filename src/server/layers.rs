//! What wraps every request: an id, a log line, a time limit, and a panic
//! turned into a problem document. All from tower and tower-http.
//!
//! The id is the caller's `x-request-id` if it sent a plain one, else a new
//! one ([`RandomIds`]); it is echoed on every answer (problem documents
//! included) and is a field of the request's span. The span and its closing line ("finished
//! processing request": status, latency, policy, decision) are at `debug`,
//! so they cost nothing at the default log level;
//! `RUST_LOG=info,pglimit=debug,tower_http=debug` turns them on, and then
//! every line logged while serving a request carries its id.

use std::any::Any;
use std::time::Duration;

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::http::{HeaderValue, Request, Response};
use axum::response::IntoResponse;
use axum::Router;
use tower::timeout::error::Elapsed;
use tower::{BoxError, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::{Level, Span};

use crate::error::Error;

/// Wraps `router` in the layers, outermost first (public for tests, which
/// wrap routes of their own that panic or stall).
pub fn wrap(router: Router, request_timeout: Duration) -> Router {
    let trace = TraceLayer::new_for_http()
        .make_span_with(request_span)
        .on_request(())
        .on_response(
            DefaultOnResponse::new().level(Level::DEBUG).latency_unit(tower_http::LatencyUnit::Micros),
        )
        .on_failure(());
    router.layer(
        ServiceBuilder::new()
            .map_request(drop_unfit_request_id)
            .layer(SetRequestIdLayer::x_request_id(RandomIds))
            .layer(trace)
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(CatchPanicLayer::custom(panic_problem))
            .layer(HandleErrorLayer::new(timeout_problem))
            .timeout(request_timeout),
    )
}

/// Request ids of 128 random bits in lowercase hex, 32 digits: unique
/// across instances like a UUID, and, unlike a counter, they tell nothing
/// of how many requests an instance serves (anyone may ask `/healthz`).
#[derive(Clone, Copy)]
struct RandomIds;

impl MakeRequestId for RandomIds {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        // Written into a buffer rather than with format!, which cost a
        // measurable share of a denial answered from memory.
        let mut id = [0u8; 32];
        hex(rand::random(), &mut id);
        HeaderValue::from_bytes(&id).ok().map(RequestId::new)
    }
}

/// The low digits of `n` in lowercase hex, filling `out`.
fn hex(mut n: u128, out: &mut [u8]) {
    for digit in out.iter_mut().rev() {
        *digit = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// Longest caller-chosen request id kept.
const MAX_REQUEST_ID: usize = 128;

/// A caller's id is kept only if it is short and plain (letters, digits,
/// `.`, `_`, `:`, `-`): it is echoed and logged, so it must not carry a
/// log line's worth of anything. Otherwise a new one is made.
fn drop_unfit_request_id(mut request: Request<Body>) -> Request<Body> {
    let fit = |v: &[u8]| {
        (1..=MAX_REQUEST_ID).contains(&v.len())
            && v.iter().all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(b))
    };
    if request.headers().get(X_REQUEST_ID).is_some_and(|v| !fit(v.as_bytes())) {
        request.headers_mut().remove(X_REQUEST_ID);
    }
    request
}

const X_REQUEST_ID: &str = "x-request-id";

/// The policy and decision are recorded into it by the check handler
/// ([`record_outcome`]).
fn request_span(request: &Request<Body>) -> Span {
    let id = request.extensions().get::<RequestId>().and_then(|id| id.header_value().to_str().ok());
    tracing::debug_span!(
        "request",
        request_id = id.unwrap_or(""),
        method = %request.method(),
        path = request.uri().path(),
        policy = tracing::field::Empty,
        decision = tracing::field::Empty,
    )
}

/// Notes what a check decided on the current request's span (never an
/// identifier or a key: the policy's configured name, or `_adhoc`).
pub fn record_outcome(policy: &str, decision: &str) {
    let span = Span::current();
    span.record("policy", policy);
    span.record("decision", decision);
}

async fn timeout_problem(error: BoxError) -> Error {
    if error.is::<Elapsed>() {
        Error::RequestTimeout
    } else {
        tracing::error!(%error, "a request failed in a middleware layer");
        Error::Internal
    }
}

/// A handler panicked: log why, answer 500 with a problem document. The
/// connection stays usable and the service keeps serving.
fn panic_problem(panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(not a string)");
    tracing::error!(panic = message, "a request handler panicked");
    Error::Internal.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn request_ids_are_32_random_hex_digits_that_count_nothing() {
        let make = || {
            let id = RandomIds.make_request_id(&Request::new(())).expect("an id");
            id.header_value().to_str().expect("ascii").to_owned()
        };
        let (first, second) = (make(), make());
        assert_eq!(first.len(), 32, "{first}");
        assert!(first.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{first}");
        // A count would leave consecutive ids alike but for their last digits;
        // 64 random bits are alike once in 2^64.
        assert_ne!(first[..16], second[..16], "consecutive ids share a prefix");
    }

    #[test]
    fn a_panic_becomes_a_500_problem_document() {
        let response = panic_problem(Box::new("boom"));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()["content-type"], "application/problem+json");
    }

    #[tokio::test]
    async fn a_request_over_its_time_is_a_503_problem_with_retry_after() {
        let response = timeout_problem(Box::new(Elapsed::new())).await.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(response.headers()["content-type"], "application/problem+json");
    }
}
