//! The cluster's directory and secrets on disk: created by this account,
//! readable by it alone, never regenerated once they exist, and refused
//! when another account could have chosen them (a directory made first by
//! another local user would let that user pick the superuser's password).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::host::effective_uid;
use super::{io, ClusterError};

/// Creates `dir` (and missing parents) with `mode`, or takes the one that is
/// there only if this account owns it and nobody else may write to it.
pub(super) fn own_directory(dir: &Path, mode: u32) -> Result<(), ClusterError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(|e| io(format!("cannot create data directory {}", dir.display()), e))?;
    }
    let meta = fs::metadata(dir).map_err(|e| io(format!("cannot read {}", dir.display()), e))?;
    if !meta.is_dir() {
        return Err(ClusterError::Io(format!("{} is not a directory", dir.display())));
    }
    check_owned(dir, &meta, 0o022, "chmod go-w")
}

/// Refuses `path` unless this account owns it and none of the `forbidden`
/// permission bits are set; the message names the path and the way out.
fn check_owned(path: &Path, meta: &fs::Metadata, forbidden: u32, fix: &str) -> Result<(), ClusterError> {
    let me = effective_uid();
    if me != Some(meta.uid()) {
        let me = me.map_or("unknown".to_owned(), |uid| uid.to_string());
        return Err(ClusterError::Io(format!(
            "{} belongs to uid {}, not to this account (uid {me}): another account could have chosen \
             the private cluster's password or key secret; remove it, or set PGLIMIT_DATA_DIR to a \
             directory of this account's",
            path.display(),
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(ClusterError::Io(format!(
            "{} has mode {mode:04o}, open to other accounts: `{fix} {}`, or set PGLIMIT_DATA_DIR to \
             another directory",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

pub(super) fn load_or_create_password(dir: &Path) -> Result<String, ClusterError> {
    let password =
        read_or_create_private(&dir.join("pg-password"), || hex::encode(rand::random::<[u8; 24]>()))?;
    Ok(password.trim().to_owned())
}

/// Reads `path`, or, only if it does not exist, creates it with `make()`,
/// readable by its owner alone from the start. Any other error is returned:
/// regenerating a secret that exists but cannot be read would silently reset
/// every counter, or lock the service out of its own cluster. A file that
/// another account owns, or that group or others may read or write, is
/// refused: its secret is not this service's alone.
pub fn read_or_create_private(path: &Path, make: impl FnOnce() -> String) -> Result<String, ClusterError> {
    match fs::File::open(path) {
        Ok(file) => return read_owned(path, file),
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

/// The secret in `file`, checked through the same handle it is read from.
fn read_owned(path: &Path, mut file: fs::File) -> Result<String, ClusterError> {
    let meta = file.metadata().map_err(|e| io(format!("cannot read {}", path.display()), e))?;
    check_owned(path, &meta, 0o077, "chmod 600")?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text)
        .map_err(|e| io(format!("cannot read {}", path.display()), e))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pglimit-private-{name}-{:016x}", rand::random::<u64>()));
        own_directory(&dir, 0o700).expect("a new directory is ours");
        dir
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("metadata").mode() & 0o7777
    }

    #[test]
    fn a_new_directory_and_its_secrets_are_readable_by_this_account_alone() {
        let dir = scratch("new");
        let secret = read_or_create_private(&dir.join("key-secret"), || "s3cret".into()).expect("created");
        assert_eq!(secret, "s3cret");
        assert_eq!((mode(&dir), mode(&dir.join("key-secret"))), (0o700, 0o600));
        assert_eq!(
            read_or_create_private(&dir.join("key-secret"), || "other".into()).expect("read"),
            "s3cret"
        );
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_directory_others_may_write_to_is_refused_naming_it() {
        let dir = scratch("open");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = own_directory(&dir, 0o700).expect_err("refused").to_string();
        assert!(error.contains(&format!("{} has mode 0777", dir.display())), "{error}");
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_secret_file_others_may_read_is_refused_naming_it() {
        let dir = scratch("readable");
        let path = dir.join("pg-password");
        fs::write(&path, "chosen elsewhere").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let error = read_or_create_private(&path, || "new".into()).expect_err("refused").to_string();
        assert!(error.contains(&format!("{} has mode 0644", path.display())), "{error}");
        assert!(error.contains("chmod 600"), "{error}");
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
