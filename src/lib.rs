//! # pglimit
//!
//! A rate-limit service that keeps one shared, exact limit in PostgreSQL,
//! behind one HTTP call: `POST /check`. Serverless functions cannot limit in
//! their own memory (each instance counts alone); pglimit counts in the
//! database they already have.
//!
//! A check names a policy (several buckets checked together, all or nothing)
//! or an ad hoc key. Concurrent checks are batched: one round trip and one
//! transaction decide a whole batch, locking the buckets' rows in key order,
//! so concurrent checks from any number of instances never admit more than
//! the limit. When Postgres is unreachable, each instance answers from memory
//! until it returns.
//!
//! ## Layout
//!
//! - [`config`]: environment variables, parsed once into [`config::Config`].
//! - [`policy`]: named policies from TOML; identifier kinds and normalisation.
//! - [`algorithm`]: fixed window, sliding window, sliding log, token bucket, as pure functions.
//! - [`limiter`]: request → buckets (keys are HMACs, see [`limiter::bucket_key`]) → [`limiter::Decision`].
//! - [`storage`]: the [`storage::Store`] trait; the Postgres store (lanes that
//!   batch concurrent checks), the memory store, the fallback that switches
//!   between them, and the cache of denials.
//! - [`server`]: the router, [`server::AppState`], headers, auth, `serve`.
//! - [`error`]: the one error enum, rendered as RFC 9457 problem documents.
//! - [`app`]: assembling a [`app::Service`] from a config.
//! - [`pg_cluster`]: a private PostgreSQL for zero-config runs and tests.

pub mod algorithm;
pub mod app;
pub mod config;
pub mod error;
pub mod limiter;
pub mod pg_cluster;
pub mod policy;
pub mod server;
pub mod storage;

pub use app::{Service, StartError};
pub use config::Config;
pub use server::{router, serve, AppState};
