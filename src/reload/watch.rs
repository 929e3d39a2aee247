//! Which changes on disk mean the policy file is whole again and may be
//! read: its writer closed it (inotify's `IN_CLOSE_WRITE`), another file was
//! renamed onto its name (an editor's save, `mv`, a Kubernetes ConfigMap's
//! `..data` symlink swapped), or a symlink was made at its name. A write
//! still in progress is never a reason to read: a TOML file cut mid-write
//! often still parses (`limit = 1000` read as `limit = 10`, the overrides
//! missing), so writes, creating a file and removing it are ignored.
//!
//! The watch is on the file's directory, not the file: a watch on the old
//! file would not see another renamed over it. (A symlink to a file in
//! another directory is not followed: send SIGHUP after changing such a
//! target.)

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Sends on `whole` whenever [`completes`] says `path` may have become
/// whole; watching stops when the watcher returned is dropped.
pub(super) fn watch(path: &Path, whole: mpsc::Sender<()>) -> notify::Result<RecommendedWatcher> {
    let name = path.file_name().map(ToOwned::to_owned).unwrap_or_default();
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
        if completes(&event, &name) {
            let _ = whole.try_send(()); // full: a read is already due
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// Whether `event`, in the directory of the file `name`, may have made that
/// file whole. An error or a rescan may hide such an event, so it counts.
fn completes(event: &notify::Result<Event>, name: &OsStr) -> bool {
    let Ok(event) = event else { return true };
    // A rename's last path is where the file went.
    let Some(path) = event.paths.last() else { return event.need_rescan() };
    let is_the_file = path.file_name() == Some(name);
    match event.kind {
        _ if event.need_rescan() => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => is_the_file,
        EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both | RenameMode::Any)) => {
            // Kubernetes renames `..data_tmp` to `..data`, a symlink the file points through.
            is_the_file || path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".."))
        }
        // A symlink is made whole at once; a regular file is closed when written.
        EventKind::Create(_) => is_the_file && path.symlink_metadata().is_ok_and(|m| m.is_symlink()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc as std_mpsc;
    use std::time::Duration;

    /// A directory watched as the service watches it, recording every event.
    struct Watched {
        dir: PathBuf,
        events: std_mpsc::Receiver<notify::Result<Event>>,
        _watcher: RecommendedWatcher,
        markers: usize,
    }

    const NAME: &str = "policies.toml";

    impl Watched {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("pglimit-watch-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a directory to watch");
            let (sender, events) = std_mpsc::channel();
            let mut watcher = notify::recommended_watcher(sender).expect("a watcher");
            watcher.watch(&dir, RecursiveMode::NonRecursive).expect("watch the directory");
            Self { dir, events, _watcher: watcher, markers: 0 }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.join(name)
        }

        /// Whether anything done since the last call made the file whole:
        /// writes a marker file of its own and takes every event up to the
        /// marker's close (events arrive in order), so no wait is guessed.
        fn completed(&mut self) -> bool {
            self.markers += 1;
            let marker = self.path(&format!("marker-{}", self.markers));
            std::fs::write(&marker, "").expect("write the marker");
            let mut completed = false;
            loop {
                let event = self.events.recv_timeout(Duration::from_secs(30)).expect("the marker's events");
                let is_marker_closed = event.as_ref().is_ok_and(|e| {
                    e.kind == EventKind::Access(AccessKind::Close(AccessMode::Write))
                        && e.paths == std::slice::from_ref(&marker)
                });
                if is_marker_closed {
                    return completed;
                }
                completed |= completes(&event, OsStr::new(NAME));
            }
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn a_file_still_being_written_is_whole_only_once_its_writer_closes_it() {
        let mut watched = Watched::new("close");
        let mut file = std::fs::File::create(watched.path(NAME)).expect("create");
        file.write_all(b"[policies.p]\n").expect("first part");
        assert!(!watched.completed(), "created and written, still open");
        file.write_all(b"identifiers = {}\n").expect("second part");
        assert!(!watched.completed(), "written again, still open");
        drop(file);
        assert!(watched.completed(), "closed after writing");
        std::fs::remove_file(watched.path(NAME)).expect("remove");
        assert!(!watched.completed(), "a removed file is not whole");
    }

    #[test]
    fn a_file_renamed_onto_the_name_is_whole_but_the_one_renamed_away_is_not() {
        let mut watched = Watched::new("rename");
        std::fs::write(watched.path("policies.toml.tmp"), "[policies.p]\n").expect("temporary file");
        assert!(!watched.completed(), "another name written");
        std::fs::rename(watched.path("policies.toml.tmp"), watched.path(NAME)).expect("rename");
        assert!(watched.completed(), "renamed onto the name");
        std::fs::rename(watched.path(NAME), watched.path("policies.toml~")).expect("rename away");
        assert!(!watched.completed(), "renamed away, as an editor keeps a backup");
    }

    #[test]
    fn a_configmap_update_swapping_its_data_symlink_makes_the_file_whole() {
        let mut watched = Watched::new("configmap");
        let dir = watched.dir.clone();
        let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, dir.join(at)).expect("link");
        for (version, limit) in [("..v1", 1), ("..v2", 2)] {
            std::fs::create_dir(watched.path(version)).expect("version directory");
            std::fs::write(watched.path(version).join(NAME), format!("limit = {limit}")).expect("file");
        }
        link("..v1", "..data");
        link("..data/policies.toml", NAME);
        assert!(watched.completed(), "a symlink made at the name");
        // What the kubelet does: a new symlink, renamed over the old one.
        link("..v2", "..data_tmp");
        assert!(!watched.completed(), "a symlink beside the file");
        std::fs::rename(watched.path("..data_tmp"), watched.path("..data")).expect("swap");
        assert!(watched.completed(), "..data swapped");
        assert_eq!(std::fs::read_to_string(watched.path(NAME)).expect("read"), "limit = 2");
    }
}
