//! `GET /console` and the two files it loads: the support console, one
//! page written by hand (`console/index.html`, `console.js`,
//! `console.css`), embedded in the binary at build time, so that serving it
//! needs no CDN, no Node and no file on disk.
//!
//! Served only with `PGLIMIT_CONSOLE=on` (else a 404, as for any unknown
//! path). The page is public: it holds no data. Every call it makes sends
//! `Authorization: Bearer <admin token>`, typed by the user and kept in the
//! page's memory, never in a cookie, so neither another site (no ambient
//! credential to ride on) nor a page that frames it can act through it.
//! The headers forbid inline script and style, framing and sniffing.

use axum::extract::{Path, State};
use axum::http::{header, HeaderName, Uri};
use axum::response::IntoResponse;

use super::AppState;
use crate::error::Error;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// Only files of this origin, none inline, and no framing (clickjacking).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; frame-ancestors 'none'";

/// The headers of every file of the console.
fn strict(content_type: &'static str) -> [(HeaderName, &'static str); 5] {
    [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ]
}

/// `GET /console`: the page.
pub async fn page(State(state): State<AppState>, uri: Uri) -> Result<impl IntoResponse, Error> {
    served(&state, &uri)?;
    Ok((strict("text/html; charset=utf-8"), PAGE))
}

/// `GET /console/console.js` and `GET /console/console.css`.
pub async fn asset(
    State(state): State<AppState>,
    Path(file): Path<String>,
    uri: Uri,
) -> Result<impl IntoResponse, Error> {
    served(&state, &uri)?;
    match file.as_str() {
        "console.js" => Ok((strict("text/javascript; charset=utf-8"), SCRIPT)),
        "console.css" => Ok((strict("text/css; charset=utf-8"), STYLE)),
        _ => Err(Error::NotFound(uri.path().to_owned())),
    }
}

/// With the console off, its paths are as unknown as any other.
fn served(state: &AppState, uri: &Uri) -> Result<(), Error> {
    if state.console {
        Ok(())
    } else {
        Err(Error::NotFound(uri.path().to_owned()))
    }
}
