//! The HTTP surface: the router, its shared state, and `serve`.

mod admin;
mod audit;
mod auth;
mod body;
mod check;
mod console;
mod envoy;
mod explain;
mod forward_auth;
mod grpc;
mod guard;
mod headers;
mod health;
mod layers;
mod leases;
mod metrics;
mod overrides;
mod overview;
mod top;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::routing::{any, delete, get, post};
use axum::Router;
use tokio::net::TcpListener;

pub use auth::{Actor, Auth};
pub use body::parse as parse_check_body;
pub use grpc::serve_grpc;
pub use headers::rate_limit_headers;
pub use layers::wrap as wrap_in_layers;
pub use metrics::MetricsEndpoint;

use crate::error::Error;
use crate::limiter::{Actions, Checks, Explain, Leases, Overrides, Top, Waiting};
use crate::storage::{DenyCache, FallbackStore, PgStore};
use crate::telemetry::SlowChecks;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The store a running service uses: Postgres, falling back to memory,
/// with repeated denials answered from memory.
pub type ServiceStore = DenyCache<FallbackStore<PgStore>>;

/// Everything a request handler needs, behind one `Arc`: each request
/// clones the state, and one shared counter to bump costs less than one per
/// part (they are written by both cores on every request).
#[derive(Clone)]
pub struct AppState(Arc<Services>);

/// The limiter's six services over one shared store and set of
/// policies, then what the HTTP surface adds. `waiting` and `overrides`
/// are `Arc`s because each runs a task (wakes, reloads) that ends with it.
pub struct Services {
    /// `/check`, `/auth/{policy}` and gRPC without `max_wait`.
    pub checks: Checks<ServiceStore>,
    /// Checks with `max_wait`.
    pub waiting: Arc<Waiting<ServiceStore>>,
    /// `/release` and `/renew`.
    pub leases: Leases<ServiceStore>,
    /// `/reset` and `/admin/blocks`.
    pub actions: Actions<ServiceStore>,
    /// `/admin/overrides`.
    pub overrides: Arc<Overrides<ServiceStore>>,
    /// `/admin/explain`.
    pub explain: Explain<ServiceStore>,
    /// `/admin/top`, and the counting behind it, written to Postgres.
    pub top: Arc<Top<PgStore>>,
    pub auth: Auth,
    /// Who may use the admin routes; `None`: nobody (no admin token on a
    /// network bind).
    pub admin: Option<Auth>,
    /// `None` with `PGLIMIT_METRICS=false`: `/metrics` is a 404.
    pub metrics: Option<MetricsEndpoint>,
    pub request_timeout: Duration,
    /// `PGLIMIT_BIND` is a loopback address: requests must be addressed to
    /// loopback too (`guard`).
    pub loopback_bind: bool,
    /// The slowest checks since the last reset (`/admin/slow-checks`).
    pub slow_checks: SlowChecks,
    /// `PGLIMIT_CONSOLE=on`: `/console` is served; else it is a 404.
    pub console: bool,
}

impl AppState {
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;
    fn deref(&self) -> &Services {
        &self.0
    }
}

/// The whole HTTP API, without a socket (tests call it directly).
pub fn router(state: AppState) -> Router {
    let timeout = state.request_timeout;
    let routes = Router::new()
        .route("/check", post(check::check))
        .route("/reset", post(check::reset))
        .route("/release", post(leases::release))
        .route("/renew", post(leases::renew))
        .route("/auth/{policy}", any(forward_auth::forward_auth))
        .route("/admin/blocks", get(admin::list).post(admin::block).delete(admin::unblock))
        .route("/admin/explain", post(explain::explain))
        .route("/admin/overrides", get(overrides::list).post(overrides::add))
        .route("/admin/overrides/{id}", delete(overrides::remove))
        .route("/admin/overview", get(overview::overview))
        .route("/console", get(console::page))
        .route("/console/{file}", get(console::asset))
        .route("/admin/top", get(top::top))
        .route("/admin/slow-checks", get(admin::slow_checks).delete(admin::reset_slow_checks))
        .route("/admin/audit", get(audit::list))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::loopback_host))
        .with_state(state);
    layers::wrap(routes, timeout)
}

/// Serves `router(state)` on `listener` until `shutdown` completes, then
/// lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

/// The OpenAPI 3.1 description of this API, kept true by `tests/api/openapi.rs`
/// and by a schemathesis run against the live service (`faults/fuzz-api`).
pub const OPENAPI: &str = include_str!("../../openapi.json");

async fn openapi() -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn not_found(uri: Uri) -> Error {
    Error::NotFound(uri.path().to_owned())
}

async fn method_not_allowed() -> Error {
    Error::MethodNotAllowed
}
