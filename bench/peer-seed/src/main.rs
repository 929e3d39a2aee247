//! The third peer for bench/run: the seed design itself as a service, the
//! naive limiter pglimit must beat. axum, one SQLx pool, and per request one
//! reference upsert (bench/pgbench/upsert.sql's statement, with the request's
//! key and window as parameters) behind the same request shape as pglimit's
//! ad hoc form:
//!
//!   POST /check {"key": "k42", "limit": 1000, "window": "1h"}
//!   -> 200 when admitted (the window's count, this check included, is at
//!      most the limit), 429 when not, a small JSON body either way (503 when
//!      the database answers with an error).
//!
//! `peer-seed [DATABASE_URL [BIND]]`, else the environment: DATABASE_URL
//! (required), PEER_BIND (default 127.0.0.1:8092), PEER_POOL_SIZE (default
//! 32, as the seed design has it).
//!
//! Choices: a fixed window anchored to the first check of a key (as the
//! reference upsert: it resets when `reset_at` has passed); every check
//! counts, denied ones too (the statement has no condition on the limit);
//! the key is SHA-256 of the request's key, computed by Postgres as in the
//! reference; the table (the reference's `raw_limit`) is created at start
//! in the database it is given (bench/run's `seed`); the pool keeps SQLx's
//! defaults but `test_before_acquire`, off so that a check costs one round
//! trip, the upsert, as a pgbench transaction of the reference does.

use axum::{
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::Response,
    routing::{get, post},
    Json, Router,
};
use peer_common::{parse_window, reply};
use serde::Deserialize;
use serde_json::json;
use sqlx::{postgres::PgPoolOptions, PgPool};

/// bench/pgbench/schema.sql's table.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS raw_limit (
    key bytea PRIMARY KEY,
    count bigint NOT NULL,
    reset_at timestamptz NOT NULL
)";

/// bench/pgbench/upsert.sql's statement; $1 the request's key, $2 its window
/// in seconds.
const UPSERT: &str = "INSERT INTO raw_limit (key, count, reset_at) \
    VALUES (sha256($1::bytea), 1, now() + $2::float8 * interval '1 second') \
    ON CONFLICT (key) DO UPDATE SET \
    count = CASE WHEN raw_limit.reset_at <= now() THEN 1 ELSE raw_limit.count + 1 END, \
    reset_at = CASE WHEN raw_limit.reset_at <= now() THEN now() + $2::float8 * interval '1 second' \
    ELSE raw_limit.reset_at END \
    RETURNING count";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    key: String,
    limit: i64,
    window: String,
}

async fn check(State(pool): State<PgPool>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<CheckBody>(&body) else {
        return reply(StatusCode::BAD_REQUEST, json!({"error": "malformed-json"}));
    };
    let window = parse_window(&request.window).filter(|w| !w.is_zero());
    let (Some(window), false, true) = (window, request.key.is_empty(), request.limit > 0) else {
        return reply(StatusCode::BAD_REQUEST, json!({"error": "invalid-field"}));
    };
    let count: i64 = match sqlx::query_scalar(UPSERT)
        .bind(request.key.as_bytes())
        .bind(window.as_secs_f64())
        .fetch_one(&pool)
        .await
    {
        Ok(count) => count,
        Err(error) => return reply(StatusCode::SERVICE_UNAVAILABLE, json!({"error": error.to_string()})),
    };
    let remaining = (request.limit - count).max(0);
    if count <= request.limit {
        reply(StatusCode::OK, json!({"allowed": true, "limit": request.limit, "remaining": remaining}))
    } else {
        reply(
            StatusCode::TOO_MANY_REQUESTS,
            json!({"allowed": false, "limit": request.limit, "remaining": 0}),
        )
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .ok_or("peer-seed: DATABASE_URL is required")?;
    let bind = args
        .next()
        .or_else(|| std::env::var("PEER_BIND").ok())
        .unwrap_or_else(|| "127.0.0.1:8092".to_string());
    let pool_size = match std::env::var("PEER_POOL_SIZE") {
        Ok(n) => n.parse()?,
        Err(_) => 32,
    };

    let pool =
        PgPoolOptions::new().max_connections(pool_size).test_before_acquire(false).connect(&url).await?;
    sqlx::query(SCHEMA).execute(&pool).await?;

    let app = Router::new()
        .route("/check", post(check))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    eprintln!("peer-seed: listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
