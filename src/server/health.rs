//! `GET /healthz` and `GET /readyz`: what a load balancer's probe needs, to
//! anyone; what an operator needs, to a token holder only.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use crate::storage::Store;

/// The process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Which store is answering checks now. Still 200 in fallback: the
/// instance answers, and every instance would fall back alike. With the
/// metrics or admin token, also how many instances share the database,
/// the actions generation and the policy file in force: details that,
/// open to anyone, would count logins (a reset moves `actions`) and map
/// the deployment.
pub async fn readyz(State(state): State<AppState>, headers: HeaderMap) -> Json<Value> {
    let store = state.checks.store();
    let degraded = store.is_degraded();
    let answering = if degraded { "memory" } else { "postgres" };
    let mut body = json!({ "status": "ready", "store": answering, "degraded": degraded });
    if may_see_details(&state, &headers) {
        body["instances"] = json!(store.instances());
        body["actions"] = json!(store.actions_heard());
        body["policies"] = json!(state.checks.policies().hash());
    }
    Json(body)
}

/// Whoever may read `/metrics` or use the admin routes; a wrong or missing
/// token is no error here, so that a probe without one still reads ready.
fn may_see_details(state: &AppState, headers: &HeaderMap) -> bool {
    let metrics = state.metrics.as_ref().is_some_and(|m| m.auth.verify(headers).is_ok());
    let admin = state.admin.as_ref().is_some_and(|a| a.verify(headers).is_ok());
    metrics || admin
}
