//! The audit rows the service writes of itself, as `system`: a reload that
//! put new policies in force (their digests before and after), and a
//! start-up (the configuration's digest, and the policies it began with).
//! Each is written on its own; a failure is logged and changes nothing.

use std::path::Path;

use crate::config::Config;
use crate::storage::{Acting, AuditAction, AuditEntry, AuditStore};

/// What a reload or start-up row's target is: the policy file's path, or
/// `builtin` without one.
pub fn target(path: Option<&Path>) -> String {
    path.map_or_else(|| "builtin".to_owned(), |p| p.display().to_string())
}

/// Records that `trigger` (`SIGHUP`, `file change`) put the policies of
/// `path` in force, their digest going from `before` to `after`.
pub async fn reloaded<S: AuditStore>(store: &S, trigger: &str, path: &Path, before: &str, after: &str) {
    let entry = AuditEntry::new(&Acting::system(), AuditAction::PoliciesReloaded, target(Some(path)))
        .with("trigger", trigger)
        .with("before", before)
        .with("after", after);
    record(store, &entry).await;
}

/// Records a start-up with `config` (every variable set, secrets by their
/// fingerprints, and their digest) and the policies of digest `policies`.
pub async fn started<S: AuditStore>(store: &S, config: &Config, policies: &str) {
    let entry = AuditEntry::new(&Acting::system(), AuditAction::Started, target(config.policies.as_deref()))
        .with("config_digest", config.digest.as_str())
        .with("settings", serde_json::json!(config.shown))
        .with("policies", policies)
        .with("version", env!("CARGO_PKG_VERSION"));
    record(store, &entry).await;
}

async fn record<S: AuditStore>(store: &S, entry: &AuditEntry) {
    if let Err(error) = store.record(entry).await {
        tracing::warn!(%error, action = entry.action.as_str(), "an audit row could not be written; it is lost");
    }
}
