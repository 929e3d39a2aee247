//! The policies in force, compiled for pglimit's SQL functions
//! (`pglimit.check`, docs/sql.md), and the key secret they key with: what
//! lets a check made in SQL decide as `/check` does. The service writes
//! them at start-up and on every reload; `pglimit policies push` writes
//! them for users who run no service. The last writer wins: instances
//! that share a database are expected to share a policy file.

use std::future::Future;

use super::StoreError;

/// Every policy of a file, compiled (`limiter::compiled` says the format).
#[derive(Debug, Clone)]
pub struct CompiledPolicies {
    /// The short hash of the policy file's text.
    pub source: String,
    /// Each policy's name and definition.
    pub policies: Vec<(String, serde_json::Value)>,
    /// The key secret as HMAC-SHA256's inner and outer pads; `None`: the
    /// secret stays out of the database (`PGLIMIT_SQL=off`), and one
    /// written before is removed.
    pub pads: Option<([u8; 64], [u8; 64])>,
}

impl CompiledPolicies {
    /// 8 hex digits of SHA-256 over both pads: which secret, not the secret.
    pub fn fingerprint(pads: &([u8; 64], [u8; 64])) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new().chain_update(pads.0).chain_update(pads.1).finalize();
        hex::encode(&digest[..4])
    }
}

/// Where compiled policies are written.
pub trait PolicyStore {
    /// Replaces the policies the SQL functions decide by, and the secret.
    fn publish(&self, compiled: &CompiledPolicies) -> impl Future<Output = Result<(), StoreError>> + Send;
}
