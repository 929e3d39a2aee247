//! Assembling a running service from its configuration.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::config::{Config, Database};
use crate::limiter::{
    Actions, Checks, Explain, KeySecret, Leases, Overrides, Shared, Tally, Top, WaitLimits, Waiting,
};
use crate::pg_cluster::{read_or_create_private, Cluster, ClusterError};
use crate::policy::Policies;
use crate::server::{AppState, Auth, MetricsEndpoint, ServiceStore, Services};
use crate::storage::{longest_wait, DenyCache, FallbackStore, MemoryStore, PgStore, PgStoreOptions};
use crate::telemetry;

/// How often a degraded instance asks whether Postgres is back.
const PROBE_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Policies(#[from] crate::policy::PolicyError),
    #[error("private PostgreSQL: {0}")]
    Cluster(#[from] ClusterError),
    #[error("cannot connect to PostgreSQL or apply migrations: {0}")]
    Database(#[from] sqlx::Error),
    #[error("cannot catch SIGHUP: {0}")]
    Signal(std::io::Error),
    #[error(
        "refusing to listen on {addr} ({variable}) without PGLIMIT_API_TOKENS: checks would be open to \
         the network. Set PGLIMIT_API_TOKENS, or bind {variable} to a loopback address"
    )]
    OpenOnNetwork { addr: std::net::SocketAddr, variable: &'static str },
}

/// A service ready to serve, the private cluster it runs on, if any (stop
/// it after serving; dropping it stops it too), and its background tasks
/// (policy reloads, metrics upkeep), which stop when it is dropped.
pub struct Service {
    pub state: AppState,
    pub cluster: Option<Cluster>,
    pub background: Background,
}

/// Tasks aborted when dropped: they hold nothing that needs a clean stop.
#[derive(Default)]
pub struct Background(Vec<JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

impl Service {
    pub async fn start(config: &Config) -> Result<Self, StartError> {
        // Named by variable, so that an operator who set only one knows which.
        let binds = [(Some(config.bind), "PGLIMIT_BIND"), (config.grpc_bind, "PGLIMIT_GRPC_BIND")];
        let open = binds.into_iter().filter_map(|(bind, variable)| Some((bind?, variable)));
        if let Some((addr, variable)) =
            open.filter(|(b, _)| !b.ip().is_loopback()).find(|_| config.api_tokens.is_empty())
        {
            return Err(StartError::OpenOnNetwork { addr, variable });
        }
        let hangup = crate::reload::catch_hangup().map_err(StartError::Signal)?;
        let policies = match &config.policies {
            Some(path) => Policies::load(path)?,
            None => Policies::builtin(),
        };
        let (url, secret, cluster) = match &config.database {
            Database::Shared { url, secret } => (url.clone(), secret.clone(), None),
            Database::Private { data_dir, pg_bin, secret } => {
                private_database(data_dir, pg_bin.as_deref(), secret.clone()).await?
            }
        };
        let metrics = config.metrics.then(|| metrics_endpoint(config));
        let pg = PgStore::connect(&url, pg_options(config)).await?;
        if let Some((policy, reason)) = crate::limiter::refused_leasing(&pg, &policies) {
            return Err(crate::policy::PolicyError::refused(&policy, reason).into());
        }
        let (tally, top) = top(config, &pg);
        let store =
            FallbackStore::new(pg, MemoryStore::new(config.memory_capacity), config.db_timeout, PROBE_EVERY);
        let store = DenyCache::new(store, config.memory_capacity);
        let shared = Arc::new(
            Shared::new(store, policies, secret, config.shadow)
                .counting_denials(tally)
                .publishing_secret(config.sql),
        );
        crate::reload::audit::started(shared.store(), config, shared.policies().hash()).await;
        shared.publish().await;
        let services = services(Arc::clone(&shared), config, metrics, Arc::clone(&top)).await;
        let mut background = Background::default();
        background.0.push(telemetry::sample_every_minute(Arc::clone(shared.minutes())));
        if top.is_on() {
            background.0.push(top.spawn_flushes());
        }
        let policies = config.policies.clone();
        background.0.push(crate::reload::spawn(policies, config.watch_policies, shared, hangup));
        if let Some(endpoint) = &services.metrics {
            background.0.push(upkeep(endpoint.handle.clone()));
        }
        let state = AppState::new(services);
        Ok(Self { state, cluster, background })
    }
}

/// The limiter's services over `shared`, with their tasks started (API
/// overrides loaded and then watched, held checks woken by releases), and
/// what the HTTP surface adds to them.
async fn services(
    shared: Arc<Shared<ServiceStore>>,
    config: &Config,
    metrics: Option<MetricsEndpoint>,
    top: Arc<Top<PgStore>>,
) -> Services {
    let checks = Checks::new(Arc::clone(&shared));
    let limits = WaitLimits::new(config.max_waiting, config.request_timeout, longest_wait(config.db_timeout));
    let waiting = Arc::new(Waiting::new(checks.clone(), limits));
    let overrides = Arc::new(Overrides::new(Arc::clone(&shared)));
    overrides.watch().await;
    waiting.wake_on_releases();
    Services {
        actions: Actions::new(checks.clone()),
        explain: Explain::new(checks.clone(), Arc::clone(&waiting)),
        leases: Leases::new(shared),
        checks,
        waiting,
        overrides,
        top,
        auth: Auth::new(config.api_tokens.iter().map(String::as_str)),
        admin: admin_access(config),
        metrics,
        request_timeout: config.request_timeout,
        loopback_bind: config.bind.ip().is_loopback(),
        slow_checks: telemetry::SlowChecks::new(config.slow_checks),
        console: config.console,
    }
}

/// What counts denials for the top list (`PGLIMIT_TOP`; off: a tally that
/// counts nothing), and what writes them to `pg`.
fn top(config: &Config, pg: &PgStore) -> (Arc<Tally>, Arc<Top<PgStore>>) {
    let tally = Arc::new(if config.top { Tally::new(config.memory_capacity) } else { Tally::off() });
    telemetry::top_expected(config.top);
    (Arc::clone(&tally), Arc::new(Top::new(tally, pg.clone(), config.top_retention)))
}

/// The admin routes take an admin token; without any, they are open on a
/// loopback bind where `/check` is open too, and off otherwise: once API
/// tokens are set, whatever shares loopback (a sidecar's application, an
/// SSRF in it) must not reach what its token does not.
fn admin_access(config: &Config) -> Option<Auth> {
    match config.admin_tokens.as_slice() {
        [] if config.bind.ip().is_loopback() && config.api_tokens.is_empty() => Some(Auth::default()),
        [] => None,
        tokens => Some(Auth::admin(tokens)),
    }
}

/// `/metrics` is open on a loopback bind unless `PGLIMIT_METRICS_TOKEN` is
/// set; otherwise it takes that token or any API token.
fn metrics_endpoint(config: &Config) -> MetricsEndpoint {
    let handle = telemetry::install();
    let auth = match &config.metrics_token {
        None if config.bind.ip().is_loopback() => Auth::default(),
        token => Auth::new(token.iter().chain(&config.api_tokens).map(String::as_str)),
    };
    MetricsEndpoint { handle, auth }
}

/// Folds histogram samples in even when nobody scrapes, so they do not pile up.
fn upkeep(handle: metrics_exporter_prometheus::PrometheusHandle) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(telemetry::UPKEEP_EVERY);
        loop {
            every.tick().await;
            handle.run_upkeep();
        }
    })
}

fn pg_options(config: &Config) -> PgStoreOptions {
    PgStoreOptions {
        connections: config.db_pool_size,
        pipeline: config.db_pipeline,
        longest_wait: longest_wait(config.db_timeout),
        patience: config.db_timeout,
        cleanup_rate: config.cleanup_rate,
        cleanup_batch: 1000,
        audit_retention: config.audit_retention,
        unlogged: config.unlogged,
        citus: config.citus,
        citus_checks: config.citus_checks,
        reach: config.db_reach.clone(),
    }
}

/// Zero-config mode: a private cluster in `dir`, and the configured key
/// secret or else one generated once and kept beside it (so counters
/// survive restarts).
async fn private_database(
    dir: &Path,
    bin: Option<&Path>,
    secret: Option<KeySecret>,
) -> Result<(String, KeySecret, Option<Cluster>), StartError> {
    let (dir, bin) = (dir.to_owned(), bin.map(Path::to_owned));
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(&dir, bin.as_deref()).map(|c| (c, dir)))
        .await
        .map_err(|e| ClusterError::Io(format!("cluster start-up task failed: {e}")))?;
    let (cluster, dir) = cluster?;
    let secret = match secret {
        Some(secret) => secret,
        None => load_or_create_secret(&dir)?,
    };
    let (data_dir, port) = (cluster.data_dir().display(), cluster.port());
    tracing::info!(%data_dir, port, "started a private PostgreSQL (DATABASE_URL is not set)");
    Ok((cluster.url(), secret, Some(cluster)))
}

fn load_or_create_secret(dir: &Path) -> Result<KeySecret, ClusterError> {
    let path = dir.join("key-secret");
    let text = read_or_create_private(&path, || hex::encode(rand::random::<[u8; 32]>()))?;
    KeySecret::new(text.trim().as_bytes())
        .ok_or_else(|| ClusterError::Io(format!("{} holds a key secret that is too short", path.display())))
}
