//! The second peer for bench/run: runlimit-postgres 0.3.1 (`PostgresLimiter`)
//! behind the same request shape as pglimit's ad hoc form:
//!
//!   POST /check {"key": "k42", "limit": 1000, "window": "1h", "cost": 1}
//!   -> 200 when admitted, 429 when denied, a small JSON body either way
//!      (503 when runlimit returns an error: it fails closed).
//!
//! `peer-runlimit [DATABASE_URL [BIND]]`, else the environment: DATABASE_URL
//! (required), PEER_BIND (default 127.0.0.1:8091), PEER_POOL_SIZE (default
//! 16), PEER_KEY_SECRET (at least 32 bytes; a fixed bench value by default).
//!
//! Configuration, as runlimit's README recommends it where it says anything:
//! - its own migrations through `PostgresLimiter::migrate()` (not the raw
//!   `MIGRATOR`), on a database of its own: runlimit's advisory locks are
//!   database-wide and its README asks for "a trusted or dedicated database
//!   boundary"; bench/run creates the database `runlimit` for it. Tables:
//!   `runlimit_fixed_windows` and the capacity ledger `runlimit_capacity_shards`;
//! - the README's autovacuum starting point on the counter table;
//! - `PostgresConfig::new()` unchanged: pool acquire timeout 3 s, operation
//!   timeout 3 s, 4,096 rows per capacity shard (x 256 shards, far above the
//!   ~10,101 keys the bench uses);
//! - a bounded `cleanup_expired` every 10 s, as the README asks a deployment
//!   to schedule (with 1 h windows it deletes nothing during a run);
//! - the pool: runlimit documents no size, so 16 connections, the same as
//!   the rate-limiter-flexible peer, and otherwise SQLx's defaults, as
//!   runlimit's own tests build it (so `test_before_acquire` stays on: one
//!   Sync round trip per check, which is not a statement);
//! - subject keys through `KeyHasher` (HMAC-SHA-256), the only way its README
//!   gives to build them. Policy "bench.check", scope "key"; limit and window
//!   come from the request and are part of runlimit's policy fingerprint, so
//!   each (limit, window) counts on its own, like the other systems here.
//!
//! Semantics: runlimit's anchored fixed window (the first admitted check
//! starts it), as rate-limiter-flexible's. A denied check consumes nothing.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::Response,
    routing::{get, post},
    Json, Router,
};
use peer_common::{parse_window, reply};
use runlimit_core::{Check, DecisionView, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_postgres::{PostgresConfig, PostgresLimiter};
use serde::Deserialize;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;

const DEFAULT_SECRET: &str = "peer-runlimit-bench-secret-0123456789abcdef";
const CLEANUP_EVERY: Duration = Duration::from_secs(10);
const CLEANUP_ROWS: u32 = 1_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    key: String,
    limit: u64,
    window: String,
    #[serde(default = "one")]
    cost: u64,
}

fn one() -> u64 {
    1
}

struct Peer {
    limiter: PostgresLimiter,
    hasher: KeyHasher,
    policy_id: PolicyId,
    scope_id: ScopeId,
}

async fn check(State(peer): State<Arc<Peer>>, body: Bytes) -> Response {
    let invalid = || reply(StatusCode::BAD_REQUEST, json!({"error": "invalid-field"}));
    let Ok(request) = serde_json::from_slice::<CheckBody>(&body) else {
        return reply(StatusCode::BAD_REQUEST, json!({"error": "malformed-json"}));
    };
    if request.key.is_empty() || request.key.len() > 256 {
        return invalid();
    }
    let Some(window) = parse_window(&request.window) else {
        return invalid();
    };
    // Built per request (a SHA-256 fingerprint): limits come with the request.
    let Ok(policy) =
        FixedWindowPolicy::new(peer.policy_id.clone(), peer.scope_id.clone(), request.limit, window)
    else {
        return invalid();
    };
    let subject = peer.hasher.hash_for(&policy, request.key.as_bytes());
    let Ok(check) = Check::with_cost(&policy, subject, request.cost) else {
        return invalid();
    };
    let decision = match peer.limiter.check(&check).await {
        Ok(decision) => decision,
        Err(error) => return reply(StatusCode::SERVICE_UNAVAILABLE, json!({"error": error.to_string()})),
    };
    match decision.view() {
        DecisionView::Allowed { capacity, available, .. } => reply(
            StatusCode::OK,
            json!({"allowed": true, "limit": capacity, "remaining": available, "retry_after_s": null}),
        ),
        // Quota or storage capacity: both are denials to enforce.
        DecisionView::Denied { denial } => reply(
            StatusCode::TOO_MANY_REQUESTS,
            json!({"allowed": false, "limit": request.limit, "remaining": 0,
                   "retry_after_s": denial.retry_after_seconds()}),
        ),
        // Only a policy in shadow mode answers this; ours enforce.
        DecisionView::ShadowDenied { .. } => {
            reply(StatusCode::INTERNAL_SERVER_ERROR, json!({"error": "shadow-denied"}))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .ok_or("peer-runlimit: DATABASE_URL is required")?;
    let bind = args
        .next()
        .or_else(|| std::env::var("PEER_BIND").ok())
        .unwrap_or_else(|| "127.0.0.1:8091".to_string());
    let pool_size = match std::env::var("PEER_POOL_SIZE") {
        Ok(n) => n.parse()?,
        Err(_) => 16,
    };
    let secret = std::env::var("PEER_KEY_SECRET").unwrap_or_else(|_| DEFAULT_SECRET.to_string());

    let pool = PgPoolOptions::new().max_connections(pool_size).connect(&url).await?;
    let limiter = PostgresLimiter::with_config(pool.clone(), PostgresConfig::new());
    limiter.migrate().await?;
    sqlx::query(
        "ALTER TABLE runlimit_fixed_windows SET (
            autovacuum_vacuum_threshold = 500, autovacuum_vacuum_scale_factor = 0.01,
            autovacuum_analyze_threshold = 500, autovacuum_analyze_scale_factor = 0.02)",
    )
    .execute(&pool)
    .await?;

    let cleaner = limiter.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(CLEANUP_EVERY);
        every.tick().await; // the first tick is immediate
        loop {
            every.tick().await;
            if let Err(error) = cleaner.cleanup_expired(CLEANUP_ROWS).await {
                eprintln!("peer-runlimit: cleanup failed: {error}");
            }
        }
    });

    let peer = Arc::new(Peer {
        limiter,
        hasher: KeyHasher::new(secret.as_bytes())?,
        policy_id: PolicyId::new("bench.check")?,
        scope_id: ScopeId::new("key")?,
    });
    let app = Router::new()
        .route("/check", post(check))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(peer);
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    eprintln!("peer-runlimit: listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
