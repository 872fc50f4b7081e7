//! Per-run bundle directories and ids under `<cache>/run`, and the sweep of
//! whatever an xfn that died left there. Ids are `xfn-<instance>-<n>`: the
//! instance id (see [`crate::instance`]) tells a later xfn whether the
//! owner is still alive.
//!
//! # Choice: a server's run state on a tmpfs of its own
//!
//! Every call makes and removes a bundle dir and its `config.json`, crun's
//! state dir (`state.json`, `exec.fifo`, the pid file) and the rootfs's
//! mount point. On the cache's disk (ext4 here) that churn of inodes was
//! 8–10 % of all the CPU a call costs at 16 callers (benches/PROFILE.md):
//! the inode allocator scans for recently freed inodes when dirs churn.
//! So where the containers end with xfn ([`RunDir::open`]'s `in_memory`:
//! `xfn start` and `xfn adapt` in a PID namespace of their own,
//! `crate::pidns`), that state goes under `<cache>/run/live`, a tmpfs
//! mounted in xfn's own mount namespace: nothing is written to the disk
//! per call, and the tmpfs goes with the namespace, so even a SIGKILLed
//! xfn leaves no state behind (its containers go with its PID namespace).
//! Elsewhere (`xfn run`, `xfn render`, a server the kernel refused a PID
//! namespace) the state stays on the disk under `<cache>/run`: a killed
//! xfn's containers may outlive it there, and only crun's state on disk
//! lets the next xfn on the cache find and delete them.
//!
//! The host does not see a server's state: tests read it through
//! `/proc/<xfn>/root/<cache>/run/live`.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::instance::Instance;

use oci_spec::runtime::Spec;

/// Errors of bundle handling.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A directory or file could not be written.
    #[error("cannot prepare the run bundle {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The spec could not be saved.
    #[error("cannot write the runtime spec")]
    Spec(#[from] oci_spec::OciSpecError),
}

/// The run directory: `bundles/` for config.json files, `crun/` for crun's
/// state, `rootfs/` for the runs' root filesystems; in `<cache>/run`
/// itself, or in the tmpfs `<cache>/run/live` (see the module doc).
#[derive(Debug)]
pub(crate) struct RunDir {
    /// `<cache>/run`, on the disk.
    root: PathBuf,
    /// Where this xfn's runs put their state: `root`, or `live`'s.
    state: PathBuf,
    /// The tmpfs holding `state`, when the state is in memory: held for
    /// its drop, which unmounts it with the last sandbox using it.
    _live: Option<LiveMount>,
    next: AtomicU64,
    instance: Arc<Instance>,
}

/// The prefix of every container id and bundle.
const PREFIX: &str = "xfn-";

/// The per-run state dirs, in the order they are made.
const STATE_DIRS: [&str; 3] = ["bundles", "crun", "rootfs"];

impl RunDir {
    /// Opens `root` (creating it) for `instance`, removing bundles and temp
    /// entries (`.<instance>.…`, see [`Instance::temp_name`]) of dead
    /// instances from the disk; with `in_memory`, this xfn's own runs then
    /// keep their state in the tmpfs `root/live` (see the module doc).
    pub(crate) fn open(
        root: &Path,
        instance: Arc<Instance>,
        in_memory: bool,
    ) -> Result<Self, BundleError> {
        let io = |source| BundleError::Io {
            path: root.to_path_buf(),
            source,
        };
        for dir in STATE_DIRS {
            std::fs::create_dir_all(root.join(dir)).map_err(io)?;
        }
        let live = in_memory
            .then(|| LiveMount::acquire(&root.join("live")))
            .transpose()?;
        let state = live
            .as_ref()
            .map_or_else(|| root.to_path_buf(), |l| l.path.clone());
        for dir in STATE_DIRS {
            std::fs::create_dir_all(state.join(dir)).map_err(|source| BundleError::Io {
                path: state.join(dir),
                source,
            })?;
        }
        let run_dir = Self {
            root: root.to_path_buf(),
            state,
            _live: live,
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
    pub(crate) fn is_stale(&self, id: &str) -> bool {
        id.strip_prefix(PREFIX)
            .is_some_and(|name| self.instance.is_dead_name(name))
    }

    /// crun's `--root` for this xfn's runs.
    pub(crate) fn crun_state(&self) -> PathBuf {
        self.state.join("crun")
    }

    /// crun's `--root` on the disk, where dead instances' containers may be
    /// (the same as [`Self::crun_state`] unless the state is in memory).
    pub(crate) fn crun_state_on_disk(&self) -> PathBuf {
        self.root.join("crun")
    }

    /// Where this xfn's runs get their root filesystems.
    pub(crate) fn rootfs_dir(&self) -> PathBuf {
        self.state.join("rootfs")
    }

    /// A fresh bundle directory with `spec` saved as its config.json; removed
    /// when the returned [`Bundle`] is dropped.
    pub(crate) fn bundle(&self) -> Result<Bundle, BundleError> {
        let id = format!(
            "{PREFIX}{}",
            self.instance
                .name(self.next.fetch_add(1, Ordering::Relaxed))
        );
        let dir = self.state.join("bundles").join(&id);
        std::fs::create_dir(&dir).map_err(|source| BundleError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Bundle { id, dir })
    }
}

/// One run's bundle directory; removed on drop.
#[derive(Debug)]
pub(crate) struct Bundle {
    /// The container id.
    pub(crate) id: String,
    /// The directory.
    pub(crate) dir: PathBuf,
}

impl Bundle {
    /// Writes config.json.
    pub(crate) fn write_spec(&self, spec: &Spec) -> Result<(), BundleError> {
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

/// The tmpfs at `<cache>/run/live` in xfn's mount namespace, shared by the
/// sandboxes of one process on one cache and unmounted with the last of
/// them (a test process makes many on many caches; a server one, whose
/// namespace ends with it anyway).
#[derive(Debug)]
struct LiveMount {
    path: PathBuf,
}

/// How many sandboxes use each live tmpfs of this process. Counted under
/// one lock, so that a tmpfs is never mounted over one still in use (which
/// would hide its runs' state) nor unmounted while a sandbox is being
/// opened on it.
static LIVE_USERS: Mutex<Option<HashMap<PathBuf, usize>>> = Mutex::new(None);

/// The bound on a live tmpfs. What it holds per container is about 20 KiB
/// (the bundle's config.json, most of it the precompiled seccomp filter,
/// and crun's state files; the rootfs's contents are in a tmpfs of their
/// own), so this is thousands of containers at once: a bound against a
/// leak, not a limit a server reaches.
const LIVE_SIZE: u64 = 64 << 20;

impl LiveMount {
    fn acquire(path: &Path) -> Result<Self, BundleError> {
        let io = |source| BundleError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut users = LIVE_USERS.lock().unwrap_or_else(|e| e.into_inner());
        let count = users
            .get_or_insert_with(HashMap::new)
            .entry(path.to_path_buf())
            .or_insert(0);
        if *count == 0 {
            std::fs::create_dir_all(path).map_err(io)?;
            crate::rootfs::mount_tmpfs(path, Some(LIVE_SIZE)).map_err(io)?;
        }
        *count += 1;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for LiveMount {
    fn drop(&mut self) {
        let mut users = LIVE_USERS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = users.as_mut().and_then(|u| u.get_mut(&self.path)) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            users.as_mut().map(|u| u.remove(&self.path));
            if let Err(err) = crate::rootfs::unmount(&self.path) {
                tracing::warn!(path = %self.path.display(), %err, "cannot unmount the run state's tmpfs");
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
        let run = RunDir::open(&dir.path().join("run"), instance(dir.path()), false).unwrap();
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
        let run = RunDir::open(&dir.path().join("run"), instance(dir.path()), false).unwrap();
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
