//! `GET /metrics`: the Prometheus text format, rendered by the exporter of
//! [`crate::telemetry`].

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use metrics_exporter_prometheus::PrometheusHandle;

use super::{AppState, Auth};
use crate::error::Error;

/// What `/metrics` serves, and who may read it.
#[derive(Clone)]
pub struct MetricsEndpoint {
    pub handle: PrometheusHandle,
    /// Open on a loopback bind without `PGLIMIT_METRICS_TOKEN`; otherwise
    /// that token or an API token.
    pub auth: Auth,
}

pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Result<impl IntoResponse, Error> {
    let endpoint = state.metrics.as_ref().ok_or_else(|| Error::NotFound("/metrics".into()))?;
    endpoint.auth.verify(&headers)?;
    let body = endpoint.handle.render();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body))
}
