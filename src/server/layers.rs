//! What wraps every request: an id, a log line, a time limit, and a panic
//! turned into a problem document. All from tower and tower-http.
//!
//! The id is the caller's `x-request-id` if it sent a plain one, else a new
//! one ([`CountedIds`]); it is echoed on every answer (problem documents included) and is
//! a field of the request's span. The span and its closing line ("finished
//! processing request": status, latency, policy, decision) are at `debug`,
//! so they cost nothing at the default log level;
//! `RUST_LOG=info,pglimit=debug,tower_http=debug` turns them on, and then
//! every line logged while serving a request carries its id.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
            .layer(SetRequestIdLayer::x_request_id(CountedIds::new()))
            .layer(trace)
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(CatchPanicLayer::custom(panic_problem))
            .layer(HandleErrorLayer::new(timeout_problem))
            .timeout(request_timeout),
    )
}

/// Request ids made of a random per-process prefix and a counter
/// (`3f9a0c1d2e4b5a68-1a2b`): unique across instances like a UUID, but
/// without drawing 122 random bits and formatting them for every request,
/// which cost a measurable share of a denial answered from memory.
#[derive(Clone)]
struct CountedIds {
    /// The prefix and its dash, rendered once.
    prefix: [u8; PREFIX_LEN],
    next: Arc<AtomicU64>,
}

const PREFIX_LEN: usize = 17;

impl CountedIds {
    fn new() -> Self {
        let mut prefix = [b'-'; PREFIX_LEN];
        hex(rand::random(), &mut prefix[..16]);
        Self { prefix, next: Arc::new(AtomicU64::new(0)) }
    }
}

impl MakeRequestId for CountedIds {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Written into a buffer rather than with format!, which cost a
        // measurable share of a denial answered from memory.
        let mut id = [0u8; PREFIX_LEN + 16];
        id[..PREFIX_LEN].copy_from_slice(&self.prefix);
        let digits = (16 - n.leading_zeros() as usize / 4).max(1);
        hex(n, &mut id[PREFIX_LEN..PREFIX_LEN + digits]);
        HeaderValue::from_bytes(&id[..PREFIX_LEN + digits]).ok().map(RequestId::new)
    }
}

/// The low digits of `n` in lowercase hex, filling `out`.
fn hex(mut n: u64, out: &mut [u8]) {
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
    fn request_ids_are_the_prefix_in_hex_a_dash_and_the_count_in_hex() {
        let mut ids = CountedIds::new();
        let prefix = std::str::from_utf8(&ids.prefix).expect("ascii").to_owned();
        assert!(prefix.ends_with('-') && prefix[..16].bytes().all(|b| b.is_ascii_hexdigit()));
        for n in [0u64, 1, 0xf, 0x10, 0x1a2b, u64::MAX] {
            ids.next.store(n, Ordering::Relaxed);
            let id = ids.make_request_id(&Request::new(())).expect("an id");
            assert_eq!(id.header_value(), &format!("{prefix}{n:x}"));
        }
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
