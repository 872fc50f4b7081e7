//! Per-run bundle directories and ids under `<cache>/run`, and the sweep of
//! whatever an xfn that died left there. Ids are `xfn-<instance>-<n>`: the
//! instance id (see [`crate::instance`]) tells a later xfn whether the
//! owner is still alive.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::instance::Instance;

use oci_spec::runtime::Spec;

/// Errors of bundle handling.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A directory or file could not be written.
    #[error("cannot prepare the run bundle {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The spec could not be saved.
    #[error("cannot write the runtime spec: {0}")]
    Spec(#[from] oci_spec::OciSpecError),
}

/// The run directory: `bundles/` for config.json files, `crun/` for crun's
/// state.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    next: AtomicU64,
    instance: Arc<Instance>,
}

/// The prefix of every container id and bundle.
const PREFIX: &str = "xfn-";

impl RunDir {
    /// Opens `root` (creating it) for `instance`, removing bundles and temp
    /// entries (`.<instance>.…`, see [`Instance::temp_name`]) of dead
    /// instances.
    pub fn open(root: &Path, instance: Arc<Instance>) -> Result<Self, BundleError> {
        let io = |source| BundleError::Io {
            path: root.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(root.join("bundles")).map_err(io)?;
        std::fs::create_dir_all(root.join("crun")).map_err(io)?;
        let run_dir = Self {
            root: root.to_path_buf(),
            next: AtomicU64::new(0),
            instance,
        };
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                if run_dir
                    .instance
                    .is_dead_temp(&entry.file_name().to_string_lossy())
                {
                    tracing::info!(path = %entry.path().display(), "removing a temp entry left by an earlier xfn");
                    let _ = crate::image::extract::fsops::remove_path(&entry.path());
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(root.join("bundles")) {
            for entry in entries.flatten() {
                if run_dir.is_stale(&entry.file_name().to_string_lossy()) {
                    tracing::info!(bundle = %entry.path().display(), "removing a bundle left by an earlier xfn");
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(run_dir)
    }

    /// Whether the container or bundle `id` belongs to an xfn that is gone.
    pub fn is_stale(&self, id: &str) -> bool {
        id.strip_prefix(PREFIX)
            .is_some_and(|name| self.instance.is_dead_name(name))
    }

    /// crun's `--root`.
    pub fn crun_state(&self) -> PathBuf {
        self.root.join("crun")
    }

    /// A fresh bundle directory with `spec` saved as its config.json; removed
    /// when the returned [`Bundle`] is dropped.
    pub fn bundle(&self) -> Result<Bundle, BundleError> {
        let id = format!(
            "{PREFIX}{}",
            self.instance
                .name(self.next.fetch_add(1, Ordering::Relaxed))
        );
        let dir = self.root.join("bundles").join(&id);
        std::fs::create_dir(&dir).map_err(|source| BundleError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Bundle { id, dir })
    }
}

/// One run's bundle directory; removed on drop.
#[derive(Debug)]
pub struct Bundle {
    /// The container id.
    pub id: String,
    /// The directory.
    pub dir: PathBuf,
}

impl Bundle {
    /// Writes config.json.
    pub fn write_spec(&self, spec: &Spec) -> Result<(), BundleError> {
        spec.save(self.dir.join("config.json"))?;
        Ok(())
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.dir) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), %err, "cannot remove a run bundle");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(dir: &Path) -> Arc<Instance> {
        crate::instance::of_cache(dir).unwrap()
    }

    #[test]
    fn bundles_are_removed_on_drop_and_ids_unique() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::open(&dir.path().join("run"), instance(dir.path())).unwrap();
        let a = run.bundle().unwrap();
        let b = run.bundle().unwrap();
        assert_ne!(a.id, b.id);
        let path = a.dir.clone();
        assert!(path.is_dir());
        drop(a);
        assert!(!path.exists());
    }

    #[test]
    fn stale_ids_are_those_of_dead_instances() {
        let dir = tempfile::tempdir().unwrap();
        // Left by an instance that is gone (no lock held), and by an xfn
        // that named things by pid.
        for stale in ["xfn-0123456789abcdef-3", "xfn-1-0"] {
            std::fs::create_dir_all(dir.path().join("run/bundles").join(stale)).unwrap();
        }
        let run = RunDir::open(&dir.path().join("run"), instance(dir.path())).unwrap();
        assert!(!dir
            .path()
            .join("run/bundles/xfn-0123456789abcdef-3")
            .exists());
        assert!(!dir.path().join("run/bundles/xfn-1-0").exists());
        let own = run.bundle().unwrap();
        assert!(!run.is_stale(&own.id));
        assert!(run.is_stale("xfn-0123456789abcdef-1"));
        assert!(!run.is_stale("someone-else"));
    }
}
