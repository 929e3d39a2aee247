//! The cluster's secrets on disk: created readable by their owner alone,
//! and never regenerated once they exist.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{io, ClusterError};

pub(super) fn load_or_create_password(dir: &Path) -> Result<String, ClusterError> {
    let password =
        read_or_create_private(&dir.join("pg-password"), || hex::encode(rand::random::<[u8; 24]>()))?;
    Ok(password.trim().to_owned())
}

/// Reads `path`, or, only if it does not exist, creates it with `make()`,
/// readable by its owner alone from the start. Any other error is returned:
/// regenerating a secret that exists but cannot be read would silently reset
/// every counter, or lock the service out of its own cluster.
pub fn read_or_create_private(path: &Path, make: impl FnOnce() -> String) -> Result<String, ClusterError> {
    match fs::read_to_string(path) {
        Ok(text) => return Ok(text),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("cannot read {}", path.display()), e))
        }
        Err(_) => {}
    }
    let text = make();
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io(format!("cannot create {}", path.display()), e))?;
    file.write_all(text.as_bytes()).map_err(|e| io(format!("cannot write {}", path.display()), e))?;
    Ok(text)
}
