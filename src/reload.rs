//! Policies reloaded without a restart: on SIGHUP, and when the policy file
//! has been rewritten on disk.
//!
//! A new file is read and validated whole, then put in force at once:
//! checks in flight finish on the policies they started with, later ones
//! use the new. A broken file changes nothing: the old policies stay in
//! force and the error is logged with its line and column. Counters are
//! keyed by policy, bucket and algorithm, not by limit or window, so a
//! changed limit or window applies to the counts already there.
//!
//! On disk, only a file made whole counts (`watch`: closed by its writer,
//! or renamed or linked into place), never a write in progress. As a belt,
//! such a file is read twice, [`SETTLE`] apart, and put in force only if
//! both reads agree: a second writer still at work makes them differ, and
//! its own close brings another read. SIGHUP reads the file once, at once.
//!
//! A reload that changes the policies is written to the audit log
//! (`audit.rs`, which writes the start-up's row too).

pub mod audit;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::limiter::Shared;
use crate::policy::{Policies, PolicyError};
use crate::storage::{AuditStore, PolicyStore, Store};
use crate::telemetry;

/// After the file is made whole, it must stay quiet this long before it is
/// read (a rename and a close may come together), and its two reads are this
/// far apart...
pub const SETTLE: Duration = Duration::from_millis(100);
/// ...but a file made whole again and again is read after this at most.
const SETTLE_AT_MOST: Duration = Duration::from_secs(2);

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// New policies are in force: the hashes of the old and the new.
    Changed { before: String, after: String },
    /// The file holds the policies already in force.
    Unchanged,
}

/// Puts `loaded` in force if it differs from the policies in force. On
/// error nothing changes.
fn apply<S: Store>(
    loaded: Result<Policies, PolicyError>,
    limiter: &Shared<S>,
) -> Result<Reloaded, PolicyError> {
    let policies = loaded.inspect_err(|_| telemetry::policy_reload(false))?;
    if let Some((policy, reason)) = crate::limiter::refused_leasing(limiter.store(), &policies) {
        telemetry::policy_reload(false);
        return Err(PolicyError::refused(&policy, reason));
    }
    if policies.hash() == limiter.policies().hash() {
        return Ok(Reloaded::Unchanged);
    }
    let (before, after) = (limiter.policies().hash().to_owned(), policies.hash().to_owned());
    limiter.replace_policies(policies);
    telemetry::policy_reload(true);
    Ok(Reloaded::Changed { before, after })
}

/// SIGHUP, caught from the start of the service: its default action would
/// terminate the process, and operators send it by habit to reload.
pub fn catch_hangup() -> std::io::Result<Signal> {
    signal(SignalKind::hangup())
}

/// Reloads `path` on every SIGHUP and, if `watch`, whenever it is made
/// whole on disk, until the task is aborted. Without a file (built-in
/// policies) SIGHUP is only logged. If the file cannot be watched (inotify
/// instances exhausted, say), SIGHUP still reloads it.
pub fn spawn<S: Store + AuditStore + PolicyStore>(
    path: Option<PathBuf>,
    watch: bool,
    limiter: Arc<Shared<S>>,
    mut hangup: Signal,
) -> JoinHandle<()> {
    if path.is_some() {
        telemetry::reloads_expected();
    }
    let (whole, mut made_whole) = mpsc::channel(1);
    let watcher = match &path {
        Some(path) if watch => watch::watch(path, whole)
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
                Some(()) = hangup.recv() => Trigger::Hangup,
                Some(()) = made_whole.recv() => {
                    settle(&mut made_whole).await;
                    Trigger::FileWritten
                }
                else => return,
            };
            reload(trigger, path.as_deref(), &limiter).await;
        }
    })
}

/// Reads `path` as `trigger` asks, puts what it holds in force if it is
/// new and valid, and logs what happened.
async fn reload<S: Store + AuditStore + PolicyStore>(
    trigger: Trigger,
    path: Option<&Path>,
    limiter: &Shared<S>,
) {
    let Some(path) = path else {
        tracing::info!("SIGHUP: no policy file (PGLIMIT_POLICIES) to reload; the built-in policies stay");
        return;
    };
    let read = tokio::task::spawn_blocking({
        let path = path.to_owned();
        move || trigger.read(&path)
    });
    match read.await {
        Ok(Some(loaded)) => {
            let outcome = apply(loaded, limiter);
            if let Ok(Reloaded::Changed { before, after }) = &outcome {
                audit::reloaded(limiter.store(), trigger.name(), path, before, after).await;
                limiter.publish().await;
            }
            log_outcome(trigger.name(), path, outcome);
        }
        Ok(None) => tracing::info!(
            trigger = trigger.name(),
            "policy file still being written (two reads differed); read again once its writer closes it"
        ),
        Err(e) => tracing::error!(error = %e, "reading the policy file failed; the policies in force stay"),
    }
}

/// What asks for a reload, which decides how the file is read.
#[derive(Clone, Copy)]
enum Trigger {
    Hangup,
    FileWritten,
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Self::Hangup => "SIGHUP",
            Self::FileWritten => "file change",
        }
    }

    /// The file as read for this trigger (blocking): at once for a signal,
    /// twice [`SETTLE`] apart for a file made whole.
    fn read(self, path: &Path) -> Option<Result<Policies, PolicyError>> {
        match self {
            Self::Hangup => Some(Policies::load(path)),
            Self::FileWritten => read_twice(path, || std::thread::sleep(SETTLE)),
        }
    }
}

/// Reads `path`, waits with `between`, reads it again: what it holds if the
/// two reads agree, `None` if they differ (a writer is still at work).
fn read_twice(path: &Path, between: impl FnOnce()) -> Option<Result<Policies, PolicyError>> {
    let first = Policies::load(path);
    between();
    let second = Policies::load(path);
    let same = match (&first, &second) {
        (Ok(first), Ok(second)) => first.hash() == second.hash(),
        (Err(first), Err(second)) => first.to_string() == second.to_string(),
        _ => false,
    };
    same.then_some(second)
}

/// Waits until the file has not been made whole again for [`SETTLE`], or
/// [`SETTLE_AT_MOST`] has passed.
async fn settle(made_whole: &mut mpsc::Receiver<()>) {
    let give_up = Instant::now() + SETTLE_AT_MOST;
    while let Ok(Some(())) = tokio::time::timeout(SETTLE, made_whole.recv()).await {
        if Instant::now() >= give_up {
            return;
        }
    }
}

fn log_outcome(trigger: &str, path: &Path, outcome: Result<Reloaded, PolicyError>) {
    match outcome {
        Ok(Reloaded::Changed { after, .. }) => {
            tracing::info!(trigger, policies = %after, "policies reloaded")
        }
        Ok(Reloaded::Unchanged) => tracing::info!(trigger, "policy file unchanged"),
        Err(error) => tracing::error!(
            trigger,
            file = %path.display(),
            "policy reload failed, the policies in force stay: {error}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "[policies.p]\nidentifiers = { ip = \"ip\" }\n\
        [[policies.p.buckets]]\nname = \"b\"\non = [\"ip\"]\nwindow = \"1h\"\nlimit = 10";

    /// Reads a file holding `first`, rewritten to `then` between the reads.
    fn read_while_rewritten(test: &str, first: &str, then: &str) -> Option<Result<Policies, PolicyError>> {
        let path =
            std::env::temp_dir().join(format!("pglimit-read-twice-{test}-{}.toml", std::process::id()));
        std::fs::write(&path, first).expect("write the file");
        let read = read_twice(&path, || std::fs::write(&path, then).expect("rewrite the file"));
        std::fs::remove_file(&path).expect("remove the file");
        read
    }

    #[test]
    fn a_file_that_changes_between_its_two_reads_is_not_put_in_force() {
        assert!(read_while_rewritten("changed", VALID, &format!("{VALID}00")).is_none());
        assert!(read_while_rewritten("emptied", VALID, "").is_none(), "valid, then not");
    }

    #[test]
    fn a_file_that_reads_the_same_twice_is_what_it_holds_valid_or_not() {
        let read = read_while_rewritten("same", VALID, VALID);
        let hash = read.expect("the reads agree").expect("valid").hash().to_owned();
        assert_eq!(hash, crate::policy::short_hash(VALID));
        let broken = read_while_rewritten("broken", "limit =", "limit =").expect("the reads agree");
        assert!(broken.is_err());
    }
}
