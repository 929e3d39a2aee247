//! Assembling a running service from its configuration.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, Database};
use crate::limiter::{KeySecret, Limiter};
use crate::pg_cluster::{read_or_create_private, Cluster, ClusterError};
use crate::policy::Policies;
use crate::server::{AppState, Auth};
use crate::storage::{longest_wait, DenyCache, FallbackStore, MemoryStore, PgStore, PgStoreOptions};

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
    #[error(
        "refusing to listen on {0} without PGLIMIT_API_TOKENS: /check would be open to the network. \
         Set PGLIMIT_API_TOKENS, or bind to a loopback address"
    )]
    OpenOnNetwork(std::net::SocketAddr),
}

/// A service ready to serve, and the private cluster it runs on, if any
/// (stop it after serving; dropping it stops it too).
pub struct Service {
    pub state: AppState,
    pub cluster: Option<Cluster>,
}

impl Service {
    pub async fn start(config: &Config) -> Result<Self, StartError> {
        if config.api_tokens.is_empty() && !config.bind.ip().is_loopback() {
            return Err(StartError::OpenOnNetwork(config.bind));
        }
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
        let pg = PgStore::connect(&url, pg_options(config)).await?;
        let store =
            FallbackStore::new(pg, MemoryStore::new(config.memory_capacity), config.db_timeout, PROBE_EVERY);
        let store = DenyCache::new(store, config.memory_capacity);
        let limiter = Limiter::new(store, policies, secret);
        let auth = Auth::new(config.api_tokens.iter().map(String::as_str));
        let state = AppState { limiter: Arc::new(limiter), auth: Arc::new(auth) };
        Ok(Self { state, cluster })
    }
}

fn pg_options(config: &Config) -> PgStoreOptions {
    PgStoreOptions {
        connections: config.db_pool_size,
        longest_wait: longest_wait(config.db_timeout),
        cleanup_rate: config.cleanup_rate,
        cleanup_batch: 1000,
        unlogged: config.unlogged,
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
