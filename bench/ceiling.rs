//! The HTTP ceiling for `bench/run`: a minimal axum server that does what
//! pglimit's `POST /check` does before it reaches the limiter (reads the
//! body, deserializes the same JSON shape with serde_json) and answers a
//! fixed small JSON body, with no storage at all. Whatever pglimit serves
//! beyond this is the cost of deciding.
//!
//! `cargo run --release --example ceiling -- 127.0.0.1:8081` (the address
//! defaults to `CEILING_BIND`, then `127.0.0.1:8081`).

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Deserialize;

/// The same fields as pglimit's request body (both forms in one shape).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct CheckBody {
    policy: Option<String>,
    identifiers: Option<BTreeMap<String, String>>,
    key: Option<String>,
    limit: Option<u64>,
    window: Option<String>,
    algorithm: Option<String>,
    cost: Option<u64>,
}

const ALLOWED: &str = concat!(
    r#"{"allowed":true,"limit":1000000000,"remaining":999999999,"#,
    r#""reset_at":"2026-11-29T16:00:00.000Z","retry_after_s":null,"store":"none","degraded":false}"#
);

async fn check(body: Bytes) -> Response {
    let json = [(header::CONTENT_TYPE, "application/json")];
    match serde_json::from_slice::<CheckBody>(&body) {
        Ok(request) if request.key.is_some() || request.policy.is_some() => {
            (StatusCode::OK, json, ALLOWED).into_response()
        }
        _ => (StatusCode::BAD_REQUEST, json, r#"{"status":400}"#).into_response(),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let bind = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("CEILING_BIND").ok())
        .unwrap_or_else(|| "127.0.0.1:8081".to_string());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    eprintln!("ceiling: listening on {}", listener.local_addr()?);
    let app = Router::new().route("/check", post(check));
    axum::serve(listener, app).await
}
