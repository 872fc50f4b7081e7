//! Per-run bundle directories and ids under `<cache>/run`, and the sweep of
//! whatever an xfn that died left there.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
}

/// The prefix of every id this process gives out: `xfn-<pid>-`. The pid
/// tells a later xfn whether the owner is still alive.
fn own_prefix() -> String {
    format!("xfn-{}-", std::process::id())
}

/// Whether `id` belongs to an xfn process that no longer exists.
pub fn is_stale(id: &str) -> bool {
    let Some(pid) = id
        .strip_prefix("xfn-")
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
    else {
        return false;
    };
    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
}

impl RunDir {
    /// Opens `root` (creating it), removing bundles of dead xfn processes.
    pub fn open(root: &Path) -> Result<Self, BundleError> {
        let io = |source| BundleError::Io {
            path: root.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(root.join("bundles")).map_err(io)?;
        std::fs::create_dir_all(root.join("crun")).map_err(io)?;
        if let Ok(entries) = std::fs::read_dir(root.join("bundles")) {
            for entry in entries.flatten() {
                if is_stale(&entry.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            next: AtomicU64::new(0),
        })
    }

    /// crun's `--root`.
    pub fn crun_state(&self) -> PathBuf {
        self.root.join("crun")
    }

    /// A fresh bundle directory with `spec` saved as its config.json; removed
    /// when the returned [`Bundle`] is dropped.
    pub fn bundle(&self) -> Result<Bundle, BundleError> {
        let id = format!(
            "{}{}",
            own_prefix(),
            self.next.fetch_add(1, Ordering::Relaxed)
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

    #[test]
    fn bundles_are_removed_on_drop_and_ids_unique() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::open(dir.path()).unwrap();
        let a = run.bundle().unwrap();
        let b = run.bundle().unwrap();
        assert_ne!(a.id, b.id);
        let path = a.dir.clone();
        assert!(path.is_dir());
        drop(a);
        assert!(!path.exists());
    }

    #[test]
    fn stale_ids_are_those_of_dead_processes() {
        assert!(!is_stale(&format!("{}7", own_prefix())));
        assert!(is_stale("xfn-4000000000-1"));
        assert!(!is_stale("someone-else"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bundles/xfn-4000000000-3")).unwrap();
        RunDir::open(dir.path()).unwrap();
        assert!(!dir.path().join("bundles/xfn-4000000000-3").exists());
    }
}
