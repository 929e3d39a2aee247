use std::process::ExitCode;

use pglimit::cli::{self, Run, Vars};
use pglimit::config::variables::BIND;
use pglimit::config::{Config, ConfigError, Database, LogFormat};
use pglimit::pg_cluster::StopMode;
use pglimit::Service;
use tracing_subscriber::EnvFilter;

/// glibc's malloc and free, and its arena locks between the runtime's
/// threads, showed in a check's CPU profile; the measurement is in
/// `bench/results/2026-12-02-0226-2cpu-intel-xeon-notes.md`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match cli::parse() {
        Run::Serve(vars) => serve(&vars),
        Run::Migrate(vars) => block_on(None, migrate(&vars)),
        Run::CheckPolicies(file) => cli::check_policies(&file),
        Run::PushPolicies(file, vars) => block_on(None, push_policies(&file, &vars)),
        Run::Healthcheck(bind) => block_on(None, healthcheck(bind)),
    }
}

/// Runs `task` on a multi-threaded runtime of `threads` workers (`None`: one
/// per CPU).
fn block_on(threads: Option<usize>, task: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        builder.worker_threads(threads);
    }
    match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(task),
        Err(e) => {
            eprintln!("pglimit: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn healthcheck(bind: Option<String>) -> ExitCode {
    let addr = match BIND.value_of(bind) {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("pglimit: healthcheck: {e}");
            return ExitCode::FAILURE;
        }
    };
    match pglimit::probe::healthz(addr, std::time::Duration::from_secs(3)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pglimit: healthcheck: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(vars: &Vars) -> ExitCode {
    let config = match vars.config() {
        Ok(config) => config,
        Err(e) => return configuration_error(&e),
    };
    init_tracing(config.log_format);
    block_on(config.worker_threads, async {
        match run(config).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn migrate(vars: &Vars) -> ExitCode {
    let (url, config) = match vars.migration() {
        Ok(migration) => migration,
        Err(e) => return configuration_error(&e),
    };
    init_tracing(config.log_format);
    match pglimit::storage::migrate(&url, config.db_reach.clone(), config.unlogged, config.citus).await {
        Ok(()) => {
            println!("pglimit: migrations applied");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pglimit: cannot apply migrations: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `pglimit policies push FILE`: the policies and the key secret written
/// for the SQL functions, after the migrations.
async fn push_policies(file: &std::path::Path, vars: &Vars) -> ExitCode {
    let config = match vars.config() {
        Ok(config) => config,
        Err(e) => return configuration_error(&e),
    };
    init_tracing(config.log_format);
    let Database::Shared { url, secret } = &config.database else {
        eprintln!(
            "pglimit: configuration error: DATABASE_URL: policies push needs it, and PGLIMIT_KEY_SECRET"
        );
        return ExitCode::FAILURE;
    };
    let policies = match pglimit::policy::Policies::load(file) {
        Ok(policies) => policies,
        Err(e) => {
            eprintln!("pglimit: {e}");
            return ExitCode::FAILURE;
        }
    };
    let compiled = pglimit::limiter::compile(&policies, secret, config.shadow, true);
    let (reach, unlogged, citus) = (config.db_reach.clone(), config.unlogged, config.citus);
    match pglimit::storage::push_policies(url, reach, unlogged, citus, &compiled).await {
        Ok(()) => {
            let names: Vec<&str> = compiled.policies.iter().map(|(name, _)| name.as_str()).collect();
            println!("pglimit: policies {} pushed ({})", compiled.source, names.join(", "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pglimit: cannot push the policies: {e}");
            ExitCode::FAILURE
        }
    }
}

fn configuration_error(e: &ConfigError) -> ExitCode {
    eprintln!("pglimit: configuration error: {e}");
    ExitCode::FAILURE
}

async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let service = Service::start(&config).await?;
    let listener = tokio::net::TcpListener::bind(config.bind).await?;
    if service.state.auth.is_open() {
        tracing::warn!(
            "PGLIMIT_API_TOKENS is not set: /check is unauthenticated, so pglimit listens on loopback only"
        );
    }
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let grpc = match config.grpc_bind {
        Some(bind) => Some(tokio::net::TcpListener::bind(bind).await?),
        None => None,
    };
    // One signal stops both servers; each then finishes its requests in flight.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let waiting = std::sync::Arc::clone(&service.state.waiting);
    tokio::spawn(async move {
        shutdown_signal().await;
        // Held checks answer now rather than hold the shutdown up (or be cut off).
        waiting.queues().close();
        let _ = stop.send(true);
    });
    let when_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let top = std::sync::Arc::clone(&service.state.top);
    let http = pglimit::serve(listener, service.state.clone(), when_stopped(stopped.clone()));
    match grpc {
        Some(grpc) => {
            tracing::info!(addr = %grpc.local_addr()?, "listening for gRPC (Envoy's rate limit service)");
            let grpc = pglimit::server::serve_grpc(grpc, service.state, when_stopped(stopped));
            tokio::try_join!(http, grpc)?;
        }
        None => http.await?,
    }
    // The counts since the last flush, before a private cluster stops.
    if top.is_on() {
        top.flush_at_exit().await;
    }
    if let Some(cluster) = service.cluster {
        tokio::task::spawn_blocking(move || cluster.stop(StopMode::Fast)).await??;
        tracing::info!("stopped the private PostgreSQL");
    }
    Ok(())
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return ctrl_c.await.unwrap_or(()),
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: finishing requests in flight");
}
