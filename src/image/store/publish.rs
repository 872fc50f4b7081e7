//! The one way into the store: work is written under `tmp/` and renamed
//! into place whole; leftovers of processes that are gone are swept.
use std::path::Path;

use super::{io_err, ImageError, Store};

impl Store {
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

    /// Writes `data` to `dest` through a temp file and a rename.
    pub(crate) fn publish_bytes(&self, dest: &Path, data: &[u8]) -> Result<(), ImageError> {
        let tmp = self.tmp_file("write")?;
        std::fs::write(&tmp, data).map_err(io_err(&tmp))?;
        self.publish_file(tmp, dest)
    }

    /// Renames a finished temp file into place.
    pub(crate) fn publish_file(
        &self,
        tmp: tempfile::TempPath,
        dest: &Path,
    ) -> Result<(), ImageError> {
        tmp.persist(dest).map_err(|e| ImageError::Io {
            path: dest.to_path_buf(),
            source: e.error,
        })
    }

    /// Renames a finished temp dir into place; when another process got
    /// there first, keeps theirs (the content is the same by construction).
    pub(crate) fn publish_dir(
        &self,
        work: tempfile::TempDir,
        dest: &Path,
    ) -> Result<(), ImageError> {
        use std::os::unix::fs::PermissionsExt;
        // tempdir makes 0700 dirs; an image root is normally 0755 and other
        // users (the container's) must traverse it.
        let _ = std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755));
        match std::fs::rename(work.path(), dest) {
            Ok(()) => {
                let _ = work.keep();
                Ok(())
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
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}
