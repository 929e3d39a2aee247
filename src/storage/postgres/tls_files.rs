//! The certificate and key files the TLS settings name, checked before
//! sqlx reads them: sqlx reads them at each handshake and says only "No
//! such file or directory", and reads a client key whatever its mode,
//! where libpq refuses one that others on the host may read.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

pub(super) fn readable(named: &str, path: &str) -> Result<(), sqlx::Error> {
    std::fs::File::open(path).map(drop).map_err(|e| refuse(format!("{named}: cannot read {path}: {e}")))
}

/// A client key, held to libpq's rule: a regular file, no access for group
/// or others, or group read at most when root owns it.
pub(super) fn private(named: &str, path: &str) -> Result<(), sqlx::Error> {
    let metadata =
        std::fs::metadata(path).map_err(|e| refuse(format!("{named}: cannot read {path}: {e}")))?;
    if !metadata.is_file() {
        return Err(refuse(format!("{named}: {path} is not a regular file")));
    }
    let mode = metadata.permissions().mode() & 0o777;
    if exposed(metadata.uid(), mode) {
        return Err(refuse(format!(
            "{named}: {path} has group or others access (mode {mode:04o}): a private key must be 0600 or \
             less, or 0640 or less when root owns it, as libpq requires (chmod 0600 {path})"
        )));
    }
    Ok(())
}

/// libpq's test (`fe-secure-openssl.c`): root may let its group read.
fn exposed(owner: u32, mode: u32) -> bool {
    let forbidden = if owner == 0 { 0o037 } else { 0o077 };
    mode & forbidden != 0
}

fn refuse(message: String) -> sqlx::Error {
    sqlx::Error::Configuration(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_private_as_libpq_says() {
        for mode in [0o600, 0o400, 0o700] {
            assert!(!exposed(1000, mode) && !exposed(0, mode), "{mode:o}");
        }
        for mode in [0o640, 0o644, 0o604, 0o660, 0o610] {
            assert!(exposed(1000, mode), "{mode:o} owned by a user");
        }
        assert!(!exposed(0, 0o640), "0640 owned by root");
        for mode in [0o644, 0o660, 0o650, 0o604] {
            assert!(exposed(0, mode), "{mode:o} owned by root");
        }
    }

    #[test]
    fn a_directory_is_not_a_key() {
        let error = private("PGSSLKEY", "/").expect_err("refused").to_string();
        assert!(error.contains("PGSSLKEY: / is not a regular file"), "{error}");
    }
}
