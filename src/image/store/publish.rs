//! The one way into the store: work is written under `tmp/`, made durable,
//! and renamed into place whole; leftovers of processes that are gone are
//! swept.
//!
//! Durability, in the order a power loss would otherwise tear it: the
//! content is on disk *before* the rename that publishes it (a file by
//! `fsync`, a layer tree by one `syncfs` of the cache's filesystem), and the
//! rename is on disk (the parent directory `fsync`ed) before the caller
//! goes on to publish what depends on it (a ref after its manifest, config
//! and layers). Why `syncfs` for trees: a layer can hold tens of thousands
//! of files, and one `fsync` each costs a journal commit each; one `syncfs`
//! writes them in one pass (it also flushes whatever else is dirty on that
//! filesystem, which on a cache volume is mostly more of the same).
use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::{io_err, ContentStore, ImageError};

impl ContentStore {
    /// A temp file under `tmp/`, removed when dropped unless published.
    pub(crate) fn tmp_file(&self, what: &str) -> Result<tempfile::TempPath, ImageError> {
        let tmp = self.tmp_root();
        tempfile::Builder::new()
            .prefix(&self.tmp_prefix(what))
            .tempfile_in(&tmp)
            .map(|f| f.into_temp_path())
            .map_err(io_err(&tmp))
    }

    /// A temp dir under `tmp/`, removed when dropped unless published.
    pub(crate) fn tmp_dir(&self, what: &str) -> Result<tempfile::TempDir, ImageError> {
        let tmp = self.tmp_root();
        tempfile::Builder::new()
            .prefix(&self.tmp_prefix(what))
            .tempdir_in(&tmp)
            .map_err(io_err(&tmp))
    }

    /// Writes `data` to `dest` through a temp file and a rename, durably.
    pub(crate) fn publish_bytes(&self, dest: &Path, data: &[u8]) -> Result<(), ImageError> {
        let tmp = self.tmp_file("write")?;
        File::create(&tmp)
            .and_then(|mut file| file.write_all(data))
            .map_err(io_err(&tmp))?;
        self.publish_file(tmp, dest)
    }

    /// Renames a finished temp file into place, its bytes on disk first.
    pub(crate) fn publish_file(
        &self,
        tmp: tempfile::TempPath,
        dest: &Path,
    ) -> Result<(), ImageError> {
        File::open(&tmp)
            .and_then(|file| file.sync_all())
            .map_err(io_err(&tmp))?;
        tmp.persist(dest).map_err(|e| ImageError::Io {
            path: dest.to_path_buf(),
            source: e.error,
        })?;
        sync_parent(dest)
    }

    /// Renames a finished temp dir into place, its tree on disk first; when
    /// another process got there first, keeps theirs (the content is the
    /// same by construction).
    pub(crate) fn publish_dir(
        &self,
        work: tempfile::TempDir,
        dest: &Path,
    ) -> Result<(), ImageError> {
        use std::os::unix::fs::PermissionsExt;
        // tempdir makes 0700 dirs; an image root is normally 0755 and other
        // users (the container's) must traverse it. The store's own 0700
        // directories above it keep it private (see the store's header).
        let _ = std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755));
        let tree = File::open(work.path()).map_err(io_err(work.path()))?;
        nix::unistd::syncfs(&tree).map_err(|errno| io_err(work.path())(errno.into()))?;
        match std::fs::rename(work.path(), dest) {
            Ok(()) => {
                let _ = work.keep();
                sync_parent(dest)
            }
            Err(_) if dest.is_dir() => Ok(()), // `work` is removed on drop
            Err(e) => Err(io_err(dest)(e)),
        }
    }

    /// Removes `tmp/` entries of xfn instances that are gone.
    pub(super) fn clean_tmp(&self) {
        let Ok(entries) = std::fs::read_dir(self.tmp_root()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name.to_str().and_then(|n| n.split('.').next()) else {
                continue;
            };
            if owner.is_empty() || self.instance().is_live(owner) {
                continue;
            }
            let _ = remove_file_or_tree(&entry.path());
        }
    }
}

/// Removes a file, or a directory with everything under it: what is left
/// in `tmp/` is either.
pub(super) fn remove_file_or_tree(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// Makes a rename into `path`'s directory durable.
pub(super) fn sync_parent(path: &Path) -> Result<(), ImageError> {
    let parent = path.parent().unwrap_or(Path::new("."));
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(io_err(parent))
}
