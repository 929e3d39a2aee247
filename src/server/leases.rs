//! `POST /release` and `POST /renew`: a concurrency bucket's lease, by the
//! id its check answered; the same authorization as `/check`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::auth::Authorization;
use super::body::{body_bytes, deserialize};
use super::guard::JsonContent;
use super::AppState;
use crate::error::Error;
use crate::limiter::Granted;
use crate::storage::Renewal;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    lease: String,
}

/// Frees the lease's slots: `"released": true` if it held any, `false` if
/// it was released already or has ended (idempotent); 404 if there is no
/// such lease (or it ended long enough ago to be cleaned up).
pub async fn release(
    State(state): State<AppState>,
    authorization: Authorization,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    state.auth.verify_header(authorization.value())?;
    let body: LeaseBody = deserialize(&body_bytes(body)?)?;
    match state.leases.release(&body.lease).await? {
        Some(released) => Ok(Json(json!({ "released": released })).into_response()),
        None => Err(Error::NoLease("no such lease: it never existed, or it ended and was cleaned up")),
    }
}

/// Extends the lease by its lease time from now; 404 if it has ended, was
/// released (or a reset ended it), or does not exist; 409 if the renewal
/// would keep it past its policy's `max_lease_life` (it is left as it was).
pub async fn renew(
    State(state): State<AppState>,
    authorization: Authorization,
    _: JsonContent,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    state.auth.verify_header(authorization.value())?;
    let body: LeaseBody = deserialize(&body_bytes(body)?)?;
    match state.leases.renew(&body.lease).await? {
        Renewal::Renewed(expires_at) => {
            let lease = Granted { id: body.lease, expires_at };
            Ok(Json(json!({ "lease": lease })).into_response())
        }
        Renewal::PastMaxLife { ends, ends_by } => Err(Error::LeaseLifeExceeded { ends, ends_by }),
        Renewal::Unknown => {
            Err(Error::NoLease("no such lease: it has ended, was released, or never existed"))
        }
    }
}
