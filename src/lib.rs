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
//! Layers point one way: [`server`] → [`limiter`] → [`policy`] →
//! [`algorithm`], and [`limiter`] → [`storage`] → [`algorithm`].
//! [`telemetry`] sits below them all: limiter and storage record metrics
//! through it, and it imports nothing of pglimit.
//!
//! - [`algorithm`]: the pure model: five algorithms, the limit rule, all or
//!   nothing across buckets. Knows nothing of configuration or HTTP.
//! - [`policy`]: named policies from TOML; identifier kinds and
//!   normalisation; the file's overrides and which one applies.
//! - [`storage`]: the [`storage::Store`] trait; Postgres (on one node, or
//!   distributed over a Citus cluster, one worker per call; lanes that batch
//!   concurrent checks), memory, the fallback between them, the deny cache.
//! - [`limiter`]: five services over one shared store and set of policies
//!   ([`limiter::Shared`]): [`limiter::Checks`] validates a request, derives
//!   its keys ([`limiter::bucket_key`]), asks the store and shapes a
//!   [`limiter::Decision`]; [`limiter::Waiting`] holds a check with
//!   `max_wait`; [`limiter::Leases`], [`limiter::Actions`] (reset, block)
//!   and [`limiter::Overrides`] (set through the API) act on limits.
//! - [`server`]: the router (a function tests call without a socket) and
//!   its state ([`AppState`]: the limiter's five services and what HTTP
//!   adds), handlers, headers, auth, the request layers (ids, logs,
//!   timeout, panics), `/metrics`, `serve`.
//! - [`telemetry`]: every metric's name and description, recorded through
//!   the `metrics` facade and rendered by the Prometheus exporter; the
//!   slow-check log.
//! - [`reload`]: the policy file reloaded on SIGHUP and on change, swapped
//!   in whole.
//! - [`error`]: every failure a caller can see, as one `Error` rendered as an
//!   RFC 9457 problem document; the limiter's errors are mapped into it.
//! - [`config`], [`app`]: environment variables, and a service assembled from them.
//! - [`cli`]: the command line (`serve`, `check-policies`, `migrate`, `healthcheck`); every
//!   variable is also a flag, validated by [`config`].
//! - [`pg_cluster`]: a private PostgreSQL for zero-config runs and tests.
//! - [`probe`]: `pglimit healthcheck`, a container's health probe.
//!
//! The design, with a check's path drawn out, is in `docs/design.md`.

pub mod algorithm;
pub mod app;
pub mod cli;
pub mod config;
pub mod error;
pub mod limiter;
pub mod pg_cluster;
pub mod policy;
pub mod probe;
pub mod reload;
pub mod server;
pub mod storage;
pub mod telemetry;

pub use app::{Service, StartError};
pub use config::Config;
pub use server::{router, serve, AppState};
