//! The audit log of administrative acts (`pglimit_audit`): who blocked,
//! unblocked, reset or set an override, and when the policies or the
//! service changed. Rows are only ever added; the one delete is the
//! cleanup's, past `PGLIMIT_AUDIT_RETENTION`. An act on limits writes its
//! row in its own transaction ([`super::ActionStore`],
//! [`super::OverrideStore`]), so a row exists exactly when the act took
//! effect; reloads and start-ups write theirs alone ([`AuditStore::record`]).

use std::future::Future;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::{Key, StoreError};

/// What an audit row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    Block,
    Unblock,
    OverrideSet,
    OverrideRemoved,
    Reset,
    PoliciesReloaded,
    Started,
}

impl AuditAction {
    pub const ALL: [Self; 7] = [
        Self::Block,
        Self::Unblock,
        Self::OverrideSet,
        Self::OverrideRemoved,
        Self::Reset,
        Self::PoliciesReloaded,
        Self::Started,
    ];

    /// As stored, and as `GET /admin/audit?action=` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Unblock => "unblock",
            Self::OverrideSet => "override_set",
            Self::OverrideRemoved => "override_removed",
            Self::Reset => "reset",
            Self::PoliciesReloaded => "policies_reloaded",
            Self::Started => "started",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

/// Who acted, and in which request (its `x-request-id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acting {
    /// An admin token's name or fingerprint; `system` for the service's own acts.
    pub actor: String,
    pub request_id: Option<String>,
}

impl Acting {
    /// The service itself: a reload on SIGHUP or a file change, a start-up.
    pub fn system() -> Self {
        Self { actor: "system".into(), request_id: None }
    }
}

/// One row to write. `detail` says what changed, never a raw identifier:
/// keys are shown by [`key_prefix`].
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub acting: Acting,
    pub action: AuditAction,
    /// What an operator filters by: `policy/bucket`, an override's id, a
    /// policy file's path or `builtin`.
    pub target: String,
    pub detail: Map<String, Value>,
}

impl AuditEntry {
    pub fn new(acting: &Acting, action: AuditAction, target: impl Into<String>) -> Self {
        Self { acting: acting.clone(), action, target: target.into(), detail: Map::new() }
    }

    /// Adds `name` to the detail (what only the store knows, such as when
    /// a block ends, is added this way in the act's transaction).
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.detail.insert(name.to_owned(), value.into());
        self
    }
}

/// A key as the audit log shows it: the first 8 bytes of the HMAC in hex,
/// enough to find it among the blocks, nothing of what it identifies.
pub fn key_prefix(key: &Key) -> String {
    hex::encode(&key[..8])
}

/// A time as every answer writes one: RFC 3339, milliseconds, UTC.
pub fn audit_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A row as read back.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub request_id: Option<String>,
    pub action: String,
    pub target: String,
    pub detail: Value,
}

/// One page of the log: rows older than `before` (an id), the newest first.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub action: Option<AuditAction>,
    pub target: Option<String>,
    pub before: Option<i64>,
    pub limit: u32,
}

/// Writing the rows no change to limits carries, and reading the log.
pub trait AuditStore: Send + Sync {
    /// Adds one row on its own.
    fn record(&self, entry: &AuditEntry) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The rows `query` asks for, the newest (highest id) first.
    fn audit(&self, query: &AuditQuery) -> impl Future<Output = Result<Vec<AuditRow>, StoreError>> + Send;
}
