//! What a web browser could be made to send to pglimit.
//!
//! A page on any site can make its visitor's browser POST a `text/plain`
//! body to `http://localhost:8080/reset` (a "simple" cross-origin request,
//! sent without asking), and a name that resolves to 127.0.0.1 (DNS
//! rebinding) lets it read the answers as well. So every route that reads
//! a body takes only `Content-Type: application/json`, which a browser
//! sends cross-origin only after a preflight pglimit never answers; and on
//! a loopback bind a request must be addressed to `localhost` or an IP
//! address, never to a name a stranger's DNS controls.

use std::net::IpAddr;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{CONTENT_TYPE, HOST};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::Error;

/// Put before a handler's body: refuses a body that is not declared JSON.
pub struct JsonContent;

impl<S: Sync> FromRequestParts<S> for JsonContent {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        if declares_json(&parts.headers) {
            Ok(Self)
        } else {
            Err(Error::NotJson)
        }
    }
}

/// `application/json`, in any case, with or without parameters (`charset`).
fn declares_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Middleware: on a loopback bind, refuses a request addressed to a name
/// other than `localhost` (or `*.localhost`, which browsers resolve
/// themselves); IP addresses are fine, as rebinding needs a name. On a
/// network bind every route but the public probes takes a token, which a
/// rebinding page does not have.
pub async fn loopback_host(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.loopback_bind && !addressed_to_loopback(&request) {
        return Error::MisdirectedHost.into_response();
    }
    next.run(request).await
}

/// `Host`, else the URI's authority (HTTP/2's `:authority`); a request
/// with neither (HTTP/1.0) names nothing a stranger controls.
fn addressed_to_loopback(request: &Request) -> bool {
    let header = request.headers().get(HOST).and_then(|v| v.to_str().ok());
    let Some(host) = header.or_else(|| request.uri().host()) else {
        return true;
    };
    let name = host_name(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    name.parse::<IpAddr>().is_ok() || is_localhost(name)
}

/// `host[:port]`, `[v6][:port]` or a bare IPv6 address, without the port
/// and the brackets.
fn host_name(host: &str) -> &str {
    if let Some(bracketed) = host.strip_prefix('[') {
        return bracketed.split(']').next().unwrap_or_default();
    }
    if host.bytes().filter(|&b| b == b':').count() > 1 {
        return host; // a bare IPv6 address: its last group is not a port
    }
    host.split(':').next().unwrap_or_default()
}

/// `localhost` or a name under it, in any case, without allocating (it is
/// asked on every request).
fn is_localhost(name: &str) -> bool {
    const LOCALHOST: &str = "localhost";
    let Some(start) = name.len().checked_sub(LOCALHOST.len()) else {
        return false;
    };
    let whole_label = start == 0 || name.as_bytes()[start - 1] == b'.';
    whole_label && name.get(start..).is_some_and(|tail| tail.eq_ignore_ascii_case(LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(host: &str) -> bool {
        let request = Request::builder().uri("/check").header(HOST, host).body(axum::body::Body::empty());
        addressed_to_loopback(&request.expect("a request"))
    }

    #[test]
    fn requests_to_localhost_or_an_address_are_served_on_a_loopback_bind() {
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "app.localhost:80",
            "127.0.0.1:8080",
            "[::1]:8080",
            "::1",
            "10.0.0.7",
        ] {
            assert!(to(host), "{host}");
        }
    }

    #[test]
    fn a_name_that_a_stranger_could_point_at_loopback_is_refused() {
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "pglimit",
            "127.0.0.1.nip.io",
            "xlocalhost",
        ] {
            assert!(!to(host), "{host}");
        }
    }

    #[test]
    fn only_a_declared_json_body_is_read() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, value.parse().expect("a header value"));
            declares_json(&headers)
        };
        assert!(with("application/json") && with("Application/JSON; charset=utf-8"));
        assert!(!with("text/plain") && !with("application/x-www-form-urlencoded"));
        assert!(!with("application/jsonp") && !declares_json(&HeaderMap::new()));
    }
}
