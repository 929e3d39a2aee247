//! Admin tokens and how an act is told apart by them: an entry of
//! `PGLIMIT_ADMIN_TOKENS` may be `name:secret`, and a token without a name
//! is known by its [`fingerprint`], so that the audit log says who acted
//! without ever holding a token.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::ConfigError;

/// Longest name a token may be given.
pub const MAX_TOKEN_NAME: usize = 64;

/// One admin token: the secret presented as the bearer, and who it stands for.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    /// The configured name, or else the secret's fingerprint.
    pub name: String,
    pub secret: String,
}

/// Shows the name only: the secret stays out of every log.
impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken").field("name", &self.name).finish_non_exhaustive()
    }
}

/// `token:` and the first 8 hex digits of the SHA-256 of `secret`: enough
/// to tell a few tokens apart, far too little to find one.
pub fn fingerprint(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    format!("token:{}", &hex::encode(&digest[..4]))
}

/// Whether `name` may name a token: letters, digits, `.`, `_` and `-`, 1 to 64.
pub fn is_token_name(name: &str) -> bool {
    (1..=MAX_TOKEN_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The entries of `var` (already split), each `name:secret` or a bare
/// secret. An error names `var` and the entry's place, never its text.
pub fn admin_tokens(var: &'static str, entries: Vec<String>) -> Result<Vec<AdminToken>, ConfigError> {
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| match entry.split_once(':') {
            None => Ok(AdminToken { name: fingerprint(&entry), secret: entry }),
            Some((name, secret)) if is_token_name(name) && !secret.trim().is_empty() => {
                Ok(AdminToken { name: name.to_owned(), secret: secret.trim().to_owned() })
            }
            Some(_) => Err(ConfigError::new(
                var,
                format!(
                    "entry {} is not name:secret (a name is 1 to {MAX_TOKEN_NAME} letters, digits, '.', \
                     '_' or '-', and the secret is not empty)",
                    i + 1
                ),
            )),
        })
        .collect()
}

/// Every variable set, as the audit log's start-up row shows it: a secret
/// (read from its file too) only as `set`. Not even a fingerprint: a
/// database password may be weak, and a fast digest of it could confirm a
/// guess offline.
pub fn shown_settings(get: &impl Fn(&str) -> Option<String>) -> BTreeMap<String, String> {
    let mut shown = BTreeMap::new();
    for setting in super::variables::ALL.iter().map(|v| v.erased()) {
        let value = if setting.secret {
            super::secret(get, setting.var).ok().flatten().map(|_| "set".to_owned())
        } else {
            get(setting.var)
        };
        if let Some(value) = value {
            shown.insert(setting.var.to_owned(), value);
        }
    }
    shown
}

/// A digest of [`shown_settings`]: 16 hex digits that differ when any
/// setting does (a secret only by being set or not).
pub fn settings_digest(shown: &BTreeMap<String, String>) -> String {
    let mut hash = Sha256::new();
    for (var, value) in shown {
        hash.update(var.as_bytes());
        hash.update(b"=");
        hash.update(value.as_bytes());
        hash.update(b"\n");
    }
    hex::encode(&hash.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(entries: &[&str]) -> Result<Vec<AdminToken>, ConfigError> {
        admin_tokens("PGLIMIT_ADMIN_TOKENS", entries.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn a_named_token_is_its_name_and_its_secret() {
        let tokens = parsed(&["alice:s3cret", "ops.team-2_b:x:y"]).expect("valid");
        assert_eq!((tokens[0].name.as_str(), tokens[0].secret.as_str()), ("alice", "s3cret"));
        assert_eq!((tokens[1].name.as_str(), tokens[1].secret.as_str()), ("ops.team-2_b", "x:y"));
    }

    #[test]
    fn a_token_without_a_name_is_known_by_a_fingerprint_that_is_not_the_token() {
        let tokens = parsed(&["plain-secret-token"]).expect("valid");
        let name = &tokens[0].name;
        assert!(name.starts_with("token:") && name.len() == 14, "{name}");
        assert!(name[6..].bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
        assert!(!name.contains("plain-secret-token"));
        assert_eq!(tokens[0].secret, "plain-secret-token");
        assert_ne!(fingerprint("a"), fingerprint("b"));
    }

    #[test]
    fn a_malformed_name_is_refused_naming_the_variable_and_never_the_secret() {
        let long = format!("{}:secret-1", "n".repeat(MAX_TOKEN_NAME + 1));
        for entry in ["al ice:secret-1", ":secret-1", "alice:", "ali/ce:secret-1", long.as_str()] {
            let err = parsed(&["ok-token", entry]).expect_err(entry);
            assert_eq!(err.var, "PGLIMIT_ADMIN_TOKENS");
            assert!(err.reason.starts_with("entry 2 "), "{err}");
            assert!(!err.to_string().contains("secret-1"), "{err}");
        }
        assert!(parsed(&[&format!("{}:s", "n".repeat(MAX_TOKEN_NAME))]).is_ok(), "64 characters will do");
    }

    #[test]
    fn the_settings_digest_changes_with_a_setting_and_a_secret_is_only_said_to_be_set() {
        let get = |shadow: &'static str| {
            move |var: &str| match var {
                "PGLIMIT_API_TOKENS" => Some("hunter2".to_owned()),
                "PGLIMIT_SHADOW" => Some(shadow.to_owned()),
                _ => None,
            }
        };
        let (one, two) = (shown_settings(&get("true")), shown_settings(&get("false")));
        assert_eq!(one["PGLIMIT_SHADOW"], "true");
        assert_eq!(one["PGLIMIT_API_TOKENS"], "set");
        assert!(
            !format!("{one:?}").contains("hunter2") && !format!("{one:?}").contains(&fingerprint("hunter2"))
        );
        assert_ne!(settings_digest(&one), settings_digest(&two));
        assert_eq!(settings_digest(&one).len(), 16);
    }
}
