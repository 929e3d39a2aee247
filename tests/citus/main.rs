//! Citus mode on a real cluster: a coordinator and two workers started by
//! `scripts/citus` (`scripts/test --citus` starts one, sets
//! `PGLIMIT_CITUS_URL` and `PGLIMIT_CITUS_DIR`, and runs these one at a
//! time: one of them stops a worker, another reads the coordinator's log).
//!
//! Ignored by a plain `cargo test`, which has no cluster; run through the
//! script, they fail, never skip, when the cluster is missing.

#[path = "../common/mod.rs"]
mod common;

mod audit;
mod decisions;
mod exact;
mod explain;
mod operations;
mod routing;
mod sql;

use std::path::PathBuf;

use axum::http::StatusCode;
use common::{check, instance};
use serde_json::Value;

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"];

/// A pool of the test's own on a node. The nodes' certificate is the X.509
/// v1 one Citus makes, which rustls cannot read, and sqlx, unlike libpq
/// and pglimit, does not fall back to plaintext under `sslmode=prefer`.
async fn direct(url: &str) -> sqlx::PgPool {
    sqlx::PgPool::connect_with(node_options(url)).await.expect("connect to a node")
}

/// A pool of the test's own on the node at `port`, with `url`'s credentials.
async fn direct_at(url: &str, port: u16) -> sqlx::PgPool {
    sqlx::PgPool::connect_with(node_options(url).port(port)).await.expect("connect to a node")
}

fn node_options(url: &str) -> sqlx::postgres::PgConnectOptions {
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("a node's URL");
    options.ssl_mode(sqlx::postgres::PgSslMode::Disable)
}

/// The coordinator's URL and the cluster's directory.
fn cluster() -> (String, PathBuf) {
    let (Ok(url), Ok(dir)) = (std::env::var("PGLIMIT_CITUS_URL"), std::env::var("PGLIMIT_CITUS_DIR")) else {
        panic!("no Citus cluster: run `scripts/test --citus`, which builds Citus if needed and starts one")
    };
    (url, PathBuf::from(dir))
}

async fn three_instances() -> Vec<pglimit::AppState> {
    let (url, _) = cluster();
    let mut apps = Vec::new();
    // These tests hold checks to exactness, not to the outage timeout: a
    // burst of hundreds on three nodes sharing two cores may take longer
    // than the default 250 ms, which would answer from memory.
    for _ in 0..3 {
        apps.push(instance(&url, &[("PGLIMIT_DB_TIMEOUT_MS", "2000")]).await);
    }
    for app in &apps {
        let ready = common::readyz(app).await;
        assert_eq!(ready["store"], "postgres", "{ready}");
    }
    apps
}

/// Fires every body at once, round-robin over `apps`; returns the replies,
/// asserting each was decided by Postgres (no error, no deadlock, no fallback).
async fn fire(apps: &[pglimit::AppState], bodies: Vec<Value>) -> Vec<(bool, Value)> {
    fire_answered(apps, bodies).await.into_iter().map(|(allowed, sent, _)| (allowed, sent)).collect()
}

/// [`fire`], with each check's answer beside what was sent.
async fn fire_answered(apps: &[pglimit::AppState], bodies: Vec<Value>) -> Vec<(bool, Value, Value)> {
    let tasks: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let app = apps[i % apps.len()].clone();
            tokio::spawn(async move { (check(&app, body.clone()).await, body) })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        let (reply, body) = task.await.expect("check task");
        assert_eq!(reply.body["store"], "postgres", "decided by postgres: {}", reply.body);
        match reply.status {
            StatusCode::OK => replies.push((true, body, reply.body)),
            StatusCode::TOO_MANY_REQUESTS => replies.push((false, body, reply.body)),
            other => panic!("unexpected status {other}: {}", reply.body),
        }
    }
    replies
}

fn admitted(replies: &[(bool, Value)]) -> usize {
    replies.iter().filter(|(allowed, _)| *allowed).count()
}
