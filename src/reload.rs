//! Policies reloaded without a restart: on SIGHUP, and when the policy file
//! changes on disk.
//!
//! A new file is read and validated whole, then put in force at once:
//! checks in flight finish on the policies they started with, later ones
//! use the new. A broken file changes nothing: the old policies stay in
//! force and the error is logged with its line and column. Counters are
//! keyed by policy, bucket and algorithm, not by limit or window, so a
//! changed limit or window applies to the counts already there.
//!
//! The watch is on the file's directory, not the file: editors and
//! Kubernetes ConfigMaps replace a file by renaming another over it, which
//! a watch on the old file would not see.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::limiter::Limiter;
use crate::policy::Policies;
use crate::storage::Store;
use crate::telemetry;

/// After a change is seen, how long to wait for the writer to finish (an
/// editor may truncate, then write) before reading the file.
const SETTLE: Duration = Duration::from_millis(100);

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// New policies are in force; their hash.
    Changed(String),
    /// The file holds the policies already in force.
    Unchanged,
}

/// Reads `path` and puts its policies in force if they differ from the
/// ones in force. On error nothing changes.
pub fn reload<S: Store>(path: &Path, limiter: &Limiter<S>) -> Result<Reloaded, crate::policy::PolicyError> {
    let policies = Policies::load(path).inspect_err(|_| telemetry::policy_reload(false))?;
    if policies.hash() == limiter.policies().hash() {
        return Ok(Reloaded::Unchanged);
    }
    let hash = policies.hash().to_owned();
    limiter.replace_policies(policies);
    telemetry::policy_reload(true);
    Ok(Reloaded::Changed(hash))
}

/// Reloads `path` on every SIGHUP and, if `watch`, whenever its directory
/// reports a change to it, until the task is aborted. Without a file
/// (built-in policies) SIGHUP is still caught, so that a reload signal
/// sent by habit does not terminate the service.
pub fn spawn<S: Store>(
    path: Option<PathBuf>,
    watch: bool,
    limiter: Arc<Limiter<S>>,
) -> std::io::Result<JoinHandle<()>> {
    let mut hangup = signal(SignalKind::hangup())?;
    let (changed, mut changes) = mpsc::channel(1);
    let watcher = match &path {
        Some(path) if watch => Some(watch_file(path, changed).map_err(std::io::Error::other)?),
        _ => None,
    };
    Ok(tokio::spawn(async move {
        let _watcher = watcher; // watching stops when it is dropped
        loop {
            let trigger = tokio::select! {
                Some(()) = hangup.recv() => "SIGHUP",
                Some(()) = changes.recv() => {
                    tokio::time::sleep(SETTLE).await;
                    while changes.try_recv().is_ok() {}
                    "file change"
                }
                else => return,
            };
            match &path {
                Some(path) => log_outcome(trigger, path, reload(path, &limiter)),
                None => tracing::info!(
                    "SIGHUP: no policy file (PGLIMIT_POLICIES) to reload; the built-in policies stay"
                ),
            }
        }
    }))
}

fn log_outcome(trigger: &str, path: &Path, outcome: Result<Reloaded, crate::policy::PolicyError>) {
    match outcome {
        Ok(Reloaded::Changed(hash)) => tracing::info!(trigger, policies = %hash, "policies reloaded"),
        Ok(Reloaded::Unchanged) => tracing::debug!(trigger, "policy file unchanged"),
        Err(error) => tracing::error!(
            trigger,
            file = %path.display(),
            "policy reload failed, the policies in force stay: {error}"
        ),
    }
}

/// Sends on `changed` when something in `path`'s directory that could be
/// `path` is created, written, renamed or removed. Reading the file (as a
/// reload does) is not a change.
fn watch_file(path: &Path, changed: mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    let name = path.file_name().map(ToOwned::to_owned);
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        // Kubernetes swaps a `..data` symlink; the file is a link through it.
        let concerns_file = event.paths.iter().any(|p| {
            p.file_name().is_some_and(|n| Some(n) == name.as_deref() || n.to_string_lossy().starts_with(".."))
        });
        if concerns_file {
            let _ = changed.try_send(()); // full: a reload is already due
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}
