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
//! a watch on the old file would not see. (A symlink to a file in another
//! directory is not followed: send SIGHUP after changing such a target.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::limiter::Limiter;
use crate::policy::{Policies, PolicyError};
use crate::storage::Store;
use crate::telemetry;

/// After a change is seen, the file must be quiet this long before it is
/// read (an editor may truncate, then write; a copy arrives in chunks)...
const SETTLE: Duration = Duration::from_millis(100);
/// ...but a file written to without a pause is read after this at most.
const SETTLE_AT_MOST: Duration = Duration::from_secs(2);

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// New policies are in force; their hash.
    Changed(String),
    /// The file holds the policies already in force.
    Unchanged,
}

/// Puts `loaded` in force if it differs from the policies in force. On
/// error nothing changes.
fn apply<S: Store>(
    loaded: Result<Policies, PolicyError>,
    limiter: &Limiter<S>,
) -> Result<Reloaded, PolicyError> {
    let policies = loaded.inspect_err(|_| telemetry::policy_reload(false))?;
    if policies.hash() == limiter.policies().hash() {
        return Ok(Reloaded::Unchanged);
    }
    let hash = policies.hash().to_owned();
    limiter.replace_policies(policies);
    telemetry::policy_reload(true);
    Ok(Reloaded::Changed(hash))
}

/// SIGHUP, caught from the start of the service: its default action would
/// terminate the process, and operators send it by habit to reload.
pub fn catch_hangup() -> std::io::Result<Signal> {
    signal(SignalKind::hangup())
}

/// Reloads `path` on every SIGHUP and, if `watch`, whenever its directory
/// reports a change to it, until the task is aborted. Without a file
/// (built-in policies) SIGHUP is only logged. If the file cannot be watched
/// (inotify instances exhausted, say), SIGHUP still reloads it.
pub fn spawn<S: Store>(
    path: Option<PathBuf>,
    watch: bool,
    limiter: Arc<Limiter<S>>,
    mut hangup: Signal,
) -> JoinHandle<()> {
    let (changed, mut changes) = mpsc::channel(1);
    let watcher = match &path {
        Some(path) if watch => watch_file(path, changed)
            .inspect_err(
                |e| tracing::warn!(error = %e, "cannot watch the policy file; SIGHUP still reloads it"),
            )
            .ok(),
        _ => None,
    };
    tokio::spawn(async move {
        let _watcher = watcher; // watching stops when it is dropped
        loop {
            let trigger = tokio::select! {
                Some(()) = hangup.recv() => "SIGHUP",
                Some(()) = changes.recv() => {
                    settle(&mut changes).await;
                    "file change"
                }
                else => return,
            };
            let Some(path) = path.clone() else {
                tracing::info!(
                    "SIGHUP: no policy file (PGLIMIT_POLICIES) to reload; the built-in policies stay"
                );
                continue;
            };
            let read = tokio::task::spawn_blocking({
                let path = path.clone();
                move || Policies::load(&path)
            });
            match read.await {
                Ok(loaded) => log_outcome(trigger, &path, apply(loaded, &limiter)),
                Err(e) => {
                    tracing::error!(error = %e, "reading the policy file failed; the policies in force stay")
                }
            }
        }
    })
}

/// Waits until no change has been reported for [`SETTLE`], or
/// [`SETTLE_AT_MOST`] has passed.
async fn settle(changes: &mut mpsc::Receiver<()>) {
    let give_up = Instant::now() + SETTLE_AT_MOST;
    while let Ok(Some(())) = tokio::time::timeout(SETTLE, changes.recv()).await {
        if Instant::now() >= give_up {
            return;
        }
    }
}

fn log_outcome(trigger: &str, path: &Path, outcome: Result<Reloaded, PolicyError>) {
    match outcome {
        Ok(Reloaded::Changed(hash)) => tracing::info!(trigger, policies = %hash, "policies reloaded"),
        Ok(Reloaded::Unchanged) => tracing::info!(trigger, "policy file unchanged"),
        Err(error) => tracing::error!(
            trigger,
            file = %path.display(),
            "policy reload failed, the policies in force stay: {error}"
        ),
    }
}

/// Sends on `changed` when something in `path`'s directory that could be
/// `path` is created, written, renamed or removed, or when the watch may
/// have missed events. Opening or reading the file (as a reload does) is
/// not a change; a writer closing it is.
fn watch_file(path: &Path, changed: mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    let name = path.file_name().map(ToOwned::to_owned);
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            Err(_) => true, // an error may hide a change: read the file again
            Ok(event) if event.need_rescan() || event.paths.is_empty() => true,
            Ok(event) => match event.kind {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => {
                    concerns(&event.paths, name.as_deref())
                }
                EventKind::Access(_) => false,
                _ => concerns(&event.paths, name.as_deref()),
            },
        };
        if relevant {
            let _ = changed.try_send(()); // full: a reload is already due
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// Whether an event on `paths` may concern the file `name`. Kubernetes
/// updates a ConfigMap by swapping a `..data` symlink the file points through.
fn concerns(paths: &[PathBuf], name: Option<&std::ffi::OsStr>) -> bool {
    paths
        .iter()
        .any(|p| p.file_name().is_some_and(|n| Some(n) == name || n.to_string_lossy().starts_with("..")))
}
