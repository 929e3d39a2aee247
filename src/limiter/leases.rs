//! Leases of concurrency buckets, as the caller sees them: an admitted
//! check of a concurrency bucket takes one, and `/release` or `/renew`
//! name it by its id.
//!
//! The id is 128 random bits (from the thread's CSPRNG) written in hex,
//! so it cannot be guessed and names nothing of the check; only its SHA-256
//! is stored, so that the table does not hold what releases a lease.
//!
//! Renewals keep a lease at most its policy's `max_lease_life` from when it
//! was taken (a day for ad hoc keys, whose leases are no longer than that):
//! work that needs longer takes a new lease.

use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use sha2::{Digest, Sha256};

use super::request::{CheckError, CheckRequest, Invalid};
use super::shared::Shared;
use crate::policy::{Policies, DEFAULT_MAX_LEASE_LIFE};
use crate::storage::{self, Key, NewLease, Renewal, Store, StoreError};

/// What every lease id starts with: a reader of logs tells it from a key.
const PREFIX: &str = "lease_";
/// Random bytes in an id.
const RANDOM_BYTES: usize = 16;

/// Where no lease can be kept (a store without `keeps_leases`: Citus
/// mode), the first policy that would take one, and why it is refused:
/// refused whole, at start or at a reload, rather than on every check.
pub fn refused_leasing(store: &impl Store, policies: &Policies) -> Option<(Arc<str>, Invalid)> {
    if store.keeps_leases() {
        return None;
    }
    let (policy, bucket) = policies.iter().find_map(|p| Some((p, p.leasing_bucket()?)))?;
    Some((policy.name.clone(), Invalid::NoLeases { bucket: bucket.name.clone() }))
}

/// A new lease id, and the lease as it is stored: by the id's hash,
/// renewable for `max_life`.
pub(super) fn mint(max_life: Duration) -> (String, NewLease) {
    let mut random = [0u8; RANDOM_BYTES];
    rand::thread_rng().fill_bytes(&mut random);
    let id = format!("{PREFIX}{}", hex::encode(random));
    let stored = stored(&id);
    (id, NewLease { id: stored, max_life })
}

/// How long renewals may keep a lease `request` takes: its policy's
/// `max_lease_life`, or the ad hoc one.
pub(super) fn max_life(policies: &Policies, request: &CheckRequest) -> Duration {
    match request {
        CheckRequest::Policy { policy, .. } => {
            policies.get(policy).map_or(DEFAULT_MAX_LEASE_LIFE, |p| p.max_lease_life)
        }
        CheckRequest::AdHoc { .. } => DEFAULT_MAX_LEASE_LIFE,
    }
}

fn stored(id: &str) -> Key {
    Sha256::digest(id.as_bytes()).into()
}

/// The stored hash of a lease id as the caller sent it, if it is one.
pub fn parse(id: &str) -> Result<Key, Invalid> {
    let random = id.strip_prefix(PREFIX).filter(|hex| {
        hex.len() == 2 * RANDOM_BYTES && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    match random {
        Some(_) => Ok(stored(id)),
        None => Err(Invalid::Lease(format!(
            "lease must be a lease id as a check answered it (\"{PREFIX}\" and {} hex digits)",
            2 * RANDOM_BYTES
        ))),
    }
}

/// Releases and renewals of leases, by the id a check answered.
pub struct Leases<S> {
    shared: Arc<Shared<S>>,
}

impl<S: Store + storage::LeaseStore> Leases<S> {
    pub fn new(shared: Arc<Shared<S>>) -> Self {
        Self { shared }
    }

    /// Frees a lease's slots: `Some(true)` if it held any, `Some(false)` if
    /// it was released already or has ended, `None` if there is no such lease.
    pub async fn release(&self, id: &str) -> Result<Option<bool>, CheckError> {
        let id = parse(id)?;
        self.shared.store.release(&id).await.map_err(unavailable)
    }

    /// Extends a lease by its lease time, unless that would keep it past
    /// its `max_lease_life`.
    pub async fn renew(&self, id: &str) -> Result<Renewal, CheckError> {
        let id = parse(id)?;
        self.shared.store.renew(&id).await.map_err(unavailable)
    }
}

fn unavailable(e: StoreError) -> CheckError {
    tracing::warn!(error = %e, "a lease could not be released or renewed");
    CheckError::StoreUnavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_id_parses_to_its_stored_hash() {
        let (id, lease) = mint(DEFAULT_MAX_LEASE_LIFE);
        assert_eq!(parse(&id), Ok(lease.id));
        assert_ne!(mint(DEFAULT_MAX_LEASE_LIFE).0, id, "ids are random");
    }

    #[test]
    fn ids_of_another_shape_are_refused() {
        for bad in [
            "",
            "lease_",
            "lease_0123",
            "LEASE_00112233445566778899aabbccddeeff",
            "lease_00112233445566778899AABBCCDDEEFF",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse("lease_00112233445566778899aabbccddeeff").is_ok());
    }
}
