//! The one place that decides what a stored key is made of.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::algorithm::Algorithm;
use crate::storage::Key;

/// Shortest accepted `PGLIMIT_KEY_SECRET`, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

/// The server secret that keys the hash, kept as a ready-keyed HMAC so each
/// check only clones it. Its `Debug` never shows it.
#[derive(Clone)]
pub struct KeySecret(Hmac<Sha256>, Box<([u8; 64], [u8; 64])>);

impl KeySecret {
    /// `None` if `bytes` is shorter than [`MIN_SECRET_LEN`].
    pub fn new(bytes: impl AsRef<[u8]>) -> Option<Self> {
        let bytes = bytes.as_ref();
        if bytes.len() < MIN_SECRET_LEN {
            return None;
        }
        let mac = Hmac::<Sha256>::new_from_slice(bytes).ok()?;
        Some(Self(mac, Box::new(pads(bytes))))
    }

    /// HMAC-SHA256's inner and outer pads for this secret: what the SQL
    /// functions key with (`sql/identifiers.sql`).
    pub fn pads(&self) -> ([u8; 64], [u8; 64]) {
        *self.1
    }
}

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

/// The key zero-padded to SHA-256's block (hashed first when longer), XOR
/// 0x36 and 0x5c (RFC 2104).
fn pads(secret: &[u8]) -> ([u8; 64], [u8; 64]) {
    use sha2::Digest;
    let mut block = [0u8; 64];
    if secret.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(secret));
    } else {
        block[..secret.len()].copy_from_slice(secret);
    }
    (block.map(|b| b ^ 0x36), block.map(|b| b ^ 0x5c))
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
    let mut mac = secret.0.clone();
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

    #[test]
    fn short_secrets_are_refused() {
        assert!(KeySecret::new([1u8; 31]).is_none());
    }
}
