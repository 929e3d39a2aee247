//! What the Rust peers of bench/run share: reading the request's window, and
//! answering with a JSON body.

use std::time::Duration;

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::Value;

/// "1h", "60s", "500ms": what check.lua sends.
pub fn parse_window(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(number.parse::<u64>().ok()?.checked_mul(millis)?))
}

pub fn reply(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}
