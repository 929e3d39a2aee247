//! The one place that decides what a stored key is made of.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::algorithm::Algorithm;
use crate::storage::Key;

/// Shortest accepted `PGLIMIT_KEY_SECRET`, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

/// SHA-256's block size: HMAC pads its key to it.
const BLOCK_LEN: usize = 64;

/// The server secret that keys the hash, kept as a ready-keyed HMAC so each
/// check only clones it, and as HMAC's two pads for the SQL functions that
/// derive the same keys. Its `Debug` never shows it.
#[derive(Clone)]
pub struct KeySecret {
    mac: Hmac<Sha256>,
    pads: ([u8; BLOCK_LEN], [u8; BLOCK_LEN]),
}

impl KeySecret {
    /// `None` if `bytes` is shorter than [`MIN_SECRET_LEN`].
    pub fn new(bytes: impl AsRef<[u8]>) -> Option<Self> {
        let bytes = bytes.as_ref();
        if bytes.len() < MIN_SECRET_LEN {
            return None;
        }
        let mac = Hmac::<Sha256>::new_from_slice(bytes).ok()?;
        Some(Self { mac, pads: pads(bytes) })
    }

    /// HMAC's inner and outer pads (the key, hashed if longer than a block,
    /// zero-padded, xor 0x36 and xor 0x5c), which `pglimit_hmac` takes so
    /// that SQL computes the keys of [`bucket_key`] without the secret.
    pub fn pads(&self) -> ([u8; BLOCK_LEN], [u8; BLOCK_LEN]) {
        self.pads
    }
}

/// RFC 2104's pads of `key`.
fn pads(key: &[u8]) -> ([u8; BLOCK_LEN], [u8; BLOCK_LEN]) {
    let mut block = [0u8; BLOCK_LEN];
    if key.len() > BLOCK_LEN {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    (block.map(|b| b ^ 0x36), block.map(|b| b ^ 0x5c))
}

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

/// What a bucket key identifies.
pub enum KeyScope<'a> {
    /// A bucket of a named policy, over the normalised identifier values.
    Policy { policy: &'a str, bucket: &'a str, algorithm: Algorithm, values: &'a [&'a str] },
    /// An ad hoc key chosen by the caller.
    AdHoc { key: &'a str, algorithm: Algorithm },
    /// An exact value in an API override's `when`: what is stored and
    /// listed instead of the value, and what a check's value is keyed to
    /// for comparing with it.
    OverrideValue { policy: &'a str, identifier: &'a str, value: &'a str },
}

/// The algorithm is part of the key because each reads the stored state its
/// own way: switching a bucket's algorithm starts it afresh.
///
/// HMAC-SHA256 over the scope, each part length-prefixed so that no two
/// different scopes can encode to the same bytes ("a" + "bc" vs "ab" + "c").
/// A database leak reveals counts and reset times, but no identifier, and
/// without the secret a known email cannot be tested against the table.
pub fn bucket_key(secret: &KeySecret, scope: &KeyScope<'_>) -> Key {
    let mut mac = secret.mac.clone();
    let mut part = |bytes: &[u8]| {
        mac.update(&(bytes.len() as u64).to_be_bytes());
        mac.update(bytes);
    };
    match scope {
        KeyScope::Policy { policy, bucket, algorithm, values } => {
            part(b"policy");
            part(policy.as_bytes());
            part(bucket.as_bytes());
            part(algorithm.name().as_bytes());
            values.iter().for_each(|v| part(v.as_bytes()));
        }
        KeyScope::AdHoc { key, algorithm } => {
            part(b"adhoc");
            part(key.as_bytes());
            part(algorithm.name().as_bytes());
        }
        KeyScope::OverrideValue { policy, identifier, value } => {
            part(b"override");
            part(policy.as_bytes());
            part(identifier.as_bytes());
            part(value.as_bytes());
        }
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> KeySecret {
        KeySecret::new([7u8; 32]).expect("long enough")
    }

    #[test]
    fn shifting_bytes_between_parts_changes_the_key() {
        let a = bucket_key(
            &secret(),
            &KeyScope::Policy {
                policy: "p",
                bucket: "b",
                algorithm: Algorithm::FixedWindow,
                values: &["a", "bc"],
            },
        );
        let b = bucket_key(
            &secret(),
            &KeyScope::Policy {
                policy: "p",
                bucket: "b",
                algorithm: Algorithm::FixedWindow,
                values: &["ab", "c"],
            },
        );
        assert_ne!(a, b);
    }

    #[test]
    fn ad_hoc_keys_never_collide_with_policy_buckets() {
        let adhoc =
            bucket_key(&secret(), &KeyScope::AdHoc { key: "login", algorithm: Algorithm::FixedWindow });
        let policy = bucket_key(
            &secret(),
            &KeyScope::Policy { policy: "login", bucket: "", algorithm: Algorithm::FixedWindow, values: &[] },
        );
        assert_ne!(adhoc, policy);
    }

    #[test]
    fn another_secret_gives_another_key() {
        let other = KeySecret::new([8u8; 32]).expect("long enough");
        let scope = KeyScope::AdHoc { key: "k", algorithm: Algorithm::FixedWindow };
        assert_ne!(bucket_key(&secret(), &scope), bucket_key(&other, &scope));
    }

    #[test]
    fn each_algorithm_has_its_own_key() {
        let keys: std::collections::HashSet<_> = Algorithm::ALL
            .iter()
            .map(|&algorithm| bucket_key(&secret(), &KeyScope::AdHoc { key: "k", algorithm }))
            .collect();
        assert_eq!(keys.len(), Algorithm::ALL.len());
    }

    /// What `pglimit_hmac` computes in SQL from the pads.
    fn mac_from_pads(secret: &KeySecret, message: &[u8]) -> Vec<u8> {
        let (inner, outer) = secret.pads();
        let inner_hash = Sha256::new().chain_update(inner).chain_update(message).finalize();
        Sha256::new().chain_update(outer).chain_update(inner_hash).finalize().to_vec()
    }

    #[test]
    fn the_pads_give_the_same_key_as_bucket_key_for_short_and_long_secrets() {
        // "adhoc" and "k" and "fixed_window", each after its length.
        let mut message = Vec::new();
        for part in [&b"adhoc"[..], b"k", b"fixed_window"] {
            message.extend_from_slice(&(part.len() as u64).to_be_bytes());
            message.extend_from_slice(part);
        }
        for len in [32, 64, 65, 100] {
            let secret = KeySecret::new(vec![9u8; len]).expect("long enough");
            let key = bucket_key(&secret, &KeyScope::AdHoc { key: "k", algorithm: Algorithm::FixedWindow });
            assert_eq!(mac_from_pads(&secret, &message), key.to_vec(), "a secret of {len} bytes");
        }
    }

    #[test]
    fn the_debug_form_shows_neither_the_secret_nor_its_pads() {
        assert_eq!(format!("{:?}", secret()), "KeySecret(..)");
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(KeySecret::new([1u8; 31]).is_none());
    }
}
