//! Every failure a caller can see, as one enum rendered as an RFC 9457
//! problem document (`application/problem+json`).
//!
//! A denied check is not here: it is a normal [`crate::limiter::Decision`].

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;

use crate::limiter::{CheckError, Invalid};
use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("{detail}")]
    InvalidField { field: String, detail: String },
    #[error("no policy named {0:?} is configured")]
    UnknownPolicy(String),
    /// A forward-auth request's header is missing or malformed.
    #[error("{detail}")]
    InvalidHeader { header: String, detail: String },
    /// `/auth/{policy}` names no policy, or one without a `forward_auth` table.
    #[error("{0}")]
    NoForwardAuth(String),
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("the counter store is unreachable and this policy fails closed (or this action needs it); retry shortly")]
    StoreUnavailable,
    #[error("no resource at {0}")]
    NotFound(String),
    #[error("no override has id {0:?}: it was removed, or never set")]
    UnknownOverride(String),
    /// `/release` or `/renew` of a lease that does not exist (or has ended).
    #[error("{0}")]
    NoLease(&'static str),
    /// `/renew` of a lease that would then outlive its policy's `max_lease_life`.
    #[error(
        "renewing would keep this lease past its max_lease_life (its policy's; 1d for ad hoc keys): its \
         life ends at {}, and it still ends at {} unless released; take a new lease for longer work",
        rfc3339(ends_by),
        rfc3339(ends)
    )]
    LeaseLifeExceeded { ends: DateTime<Utc>, ends_by: DateTime<Utc> },
    #[error("method not allowed here")]
    MethodNotAllowed,
    #[error("the request took longer than the configured PGLIMIT_REQUEST_TIMEOUT_MS; retry shortly")]
    RequestTimeout,
    #[error("an internal error occurred; it is logged")]
    Internal,
    #[error(
        "the admin routes are disabled: set PGLIMIT_ADMIN_TOKENS (without it they are open only on a \
         loopback bind with no PGLIMIT_API_TOKENS)"
    )]
    AdminDisabled,
    /// `/admin/top` on an instance that counts no denials.
    #[error("the top list is off on this instance (PGLIMIT_TOP=off): no denial is counted")]
    TopOff,
    /// A body-reading route got a body not declared as JSON (see `server::guard`).
    #[error("the request body must be JSON, declared with Content-Type: application/json")]
    NotJson,
    /// A request to a loopback bind addressed to a name (see `server::guard`).
    #[error(
        "pglimit listens on loopback and answers only requests addressed to localhost or an IP address \
         (a Host name could be DNS rebinding): send Host: localhost"
    )]
    MisdirectedHost,
}

impl Error {
    pub fn field(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::InvalidField { field: field.into(), detail: detail.into() }
    }

    /// A problem with the request header `header`, which the detail names.
    pub fn header(header: &str, detail: impl std::fmt::Display) -> Self {
        Self::InvalidHeader { header: header.to_owned(), detail: format!("{header}: {detail}") }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::MalformedJson(_) | Self::InvalidField { .. } => StatusCode::BAD_REQUEST,
            Self::UnknownPolicy(_) | Self::InvalidHeader { .. } => StatusCode::BAD_REQUEST,
            Self::NoForwardAuth(_) => StatusCode::NOT_FOUND,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::NotFound(_) | Self::UnknownOverride(_) | Self::NoLease(_) => StatusCode::NOT_FOUND,
            Self::LeaseLifeExceeded { .. } => StatusCode::CONFLICT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RequestTimeout => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::AdminDisabled => StatusCode::FORBIDDEN,
            Self::TopOff => StatusCode::NOT_FOUND,
            Self::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::MisdirectedHost => StatusCode::MISDIRECTED_REQUEST,
        }
    }

    /// A stable, machine-readable name for the kind of problem.
    fn kind(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed-json",
            Self::InvalidField { .. } => "invalid-field",
            Self::UnknownPolicy(_) => "unknown-policy",
            Self::InvalidHeader { .. } => "invalid-header",
            Self::NoForwardAuth(_) => "not-found",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::Unauthorized(_) => "unauthorized",
            Self::StoreUnavailable => "store-unavailable",
            Self::NotFound(_) | Self::UnknownOverride(_) => "not-found",
            Self::NoLease(_) => "unknown-lease",
            Self::LeaseLifeExceeded { .. } => "lease-life-exceeded",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::RequestTimeout => "request-timeout",
            Self::Internal => "internal",
            Self::AdminDisabled => "admin-disabled",
            Self::TopOff => "top-off",
            Self::NotJson => "unsupported-media-type",
            Self::MisdirectedHost => "misdirected-request",
        }
    }
}

impl From<CheckError> for Error {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Invalid(invalid) => invalid.into(),
            CheckError::StoreUnavailable => Self::StoreUnavailable,
        }
    }
}

/// Names the request field each mistake is about.
impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Self {
        let field = match &invalid {
            Invalid::UnknownPolicy(name) => return Self::UnknownPolicy(name.clone()),
            Invalid::UnexpectedIdentifier { name, .. }
            | Invalid::MissingIdentifier { name, .. }
            | Invalid::BadIdentifier { name, .. } => format!("identifiers.{name}"),
            Invalid::KeyLength => "key".into(),
            Invalid::Limit(_) => "limit".into(),
            Invalid::Window(_) => "window".into(),
            Invalid::Timezone(_) => "timezone".into(),
            Invalid::CostRange | Invalid::CostOverLimit { .. } => "cost".into(),
            Invalid::UnknownBucket { field, .. } => (*field).into(),
            Invalid::BlockFor(_) => "for".into(),
            Invalid::ReasonLength => "reason".into(),
            Invalid::Lease(_) => "lease".into(),
            Invalid::NoLeases { .. } => "algorithm".into(),
            Invalid::MaxWait { .. } => "max_wait".into(),
        };
        Self::field(field, invalid.to_string())
    }
}

/// A time as the API writes it elsewhere: RFC 3339, milliseconds, UTC.
fn rfc3339(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        telemetry::problem(self.kind());
        let mut body = json!({
            "type": format!("urn:pglimit:problem:{}", self.kind()),
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": self.to_string(),
        });
        match &self {
            Self::InvalidField { field, .. } => body["field"] = json!(field),
            Self::UnknownPolicy(_) => body["field"] = json!("policy"),
            Self::NoLease(_) | Self::LeaseLifeExceeded { .. } => body["field"] = json!("lease"),
            Self::InvalidHeader { header, .. } => body["header"] = json!(header),
            Self::NotJson => body["header"] = json!("content-type"),
            Self::MisdirectedHost => body["header"] = json!("host"),
            _ => {}
        }
        let mut response = (status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match self {
            Self::Unauthorized(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::StoreUnavailable | Self::RequestTimeout => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}
