//! Per-run root filesystems: an overlay of the cached layer dirs, or a copy of
//! the flattened rootfs where overlay is not allowed.
//!
//! Every run gets its own [`Rootfs`] in its own `run_dir`, and whatever the
//! function writes stays there:
//! - **overlay**: `run_dir` becomes a small tmpfs holding `upper/`, `work/`
//!   and the mount point `rootfs/` of an overlay (`userxattr`, so it mounts
//!   in a user namespace) whose lower dirs are the cached, read-only layer
//!   dirs. Writes land in the tmpfs and vanish with it; the layer dirs are
//!   never written (overlay only ever copies up into the upper dir).
//! - **copy**: `run_dir` becomes a tmpfs, `run_dir/rootfs` a fresh copy of
//!   the flattened rootfs in it.
//!
//! Either way a run can write at most [`RootfsOptions::size_bytes`] (and
//! create at most [`tmpfs_inodes`] of it files) before it gets ENOSPC; the
//! disk under the cache is never written by a function.
//!
//! [`Rootfs::cleanup`] (also run on drop) unmounts (detaching a busy mount)
//! and removes `run_dir`, on every path, including a `prepare` that failed
//! halfway. These mounts need a user + mount namespace where the caller is
//! uid 0 (as xfn is after entering its namespace) or real root. Everything
//! here blocks (mounts, copies): call it from `spawn_blocking` in async code.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/rootfs/mod.rs`.
mod copy;
mod overlay;

use std::path::{Path, PathBuf};

pub(crate) use copy::copy_tree;
pub(crate) use overlay::{mount_tmpfs, unmount};

/// `--rootfs`: how runs get their root filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RootfsMode {
    /// Overlay where the probe at start says it works, else copy.
    #[default]
    Auto,
    /// Always overlay; an error where overlay cannot be mounted.
    Overlay,
    /// Always a per-run copy of the flattened rootfs.
    Copy,
}

/// The mode runs actually use, after the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResolvedMode {
    /// Overlay of the layer dirs with a tmpfs upper.
    Overlay,
    /// Copy of the flattened rootfs.
    Copy,
}

impl RootfsMode {
    /// Resolves the mode given the result of `overlay_supported`.
    pub(crate) fn resolve(self, overlay_ok: bool) -> Result<ResolvedMode, RootfsError> {
        match (self, overlay_ok) {
            (RootfsMode::Copy, _) | (RootfsMode::Auto, false) => Ok(ResolvedMode::Copy),
            (RootfsMode::Overlay, true) | (RootfsMode::Auto, true) => Ok(ResolvedMode::Overlay),
            (RootfsMode::Overlay, false) => Err(RootfsError::OverlayUnsupported),
        }
    }
}

/// Errors preparing or cleaning a rootfs.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// `--rootfs overlay` where the probe failed.
    #[error(
        "overlay rootfs requested but overlayfs with userxattr cannot be mounted here; use --rootfs copy or auto"
    )]
    OverlayUnsupported,
    /// Overlay mode without layers, or copy mode without a flattened rootfs.
    #[error("rootfs: {0}")]
    Input(&'static str),
    /// A step failed.
    #[error("rootfs: {step} {path}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// On what.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io_err<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// The default of [`RootfsOptions::size_bytes`] (`--rootfs-size`): room
/// for what functions write (caches, generated files), a stop for one that
/// would fill the node's memory.
pub(crate) const DEFAULT_ROOTFS_SIZE: u64 = 256 << 20;

/// How many files a tmpfs of `size_bytes` may hold: one per 8 KiB, at least
/// 1024. Inodes take kernel memory that `size=` does not count, so a tmpfs
/// of a bounded size needs a bounded inode count too (millions of empty
/// files would otherwise fit in any size).
pub(crate) fn tmpfs_inodes(size_bytes: u64) -> u64 {
    (size_bytes / 8192).max(1024)
}

/// Tuning of [`Rootfs::prepare_with`].
#[derive(Debug, Clone)]
pub(crate) struct RootfsOptions {
    /// The most a run can write to its rootfs, in bytes (and in files:
    /// [`tmpfs_inodes`] of it): the size of the tmpfs holding the overlay's
    /// upper dir, or what a copy's tmpfs may hold beyond the copy (tmpfs
    /// takes memory only as it is used).
    pub(crate) size_bytes: u64,
    /// Mount with `mount(2)` even where the new mount API is available (the
    /// path old kernels take; tests use it).
    pub(crate) legacy_mount: bool,
    /// The id (uid and gid) of xfn's namespace that is the image's root:
    /// 0, or 1 where functions run under ids past xfn's own
    /// (`image::store::owners`). The rootfs's top directory, which xfn
    /// makes, is given to it, so that the function's root owns its `/` as
    /// it owns the image's files.
    pub(crate) root_id: u32,
}

impl Default for RootfsOptions {
    fn default() -> Self {
        Self {
            size_bytes: DEFAULT_ROOTFS_SIZE,
            legacy_mount: false,
            root_id: 0,
        }
    }
}

/// One run's root filesystem.
#[derive(Debug)]
pub(crate) struct Rootfs {
    run_dir: PathBuf,
    path: PathBuf,
    /// Mounts made, in order (unmounted in reverse).
    mounts: Vec<PathBuf>,
    /// Whether run_dir was created (and so is ours to remove).
    created: bool,
    cleaned: bool,
}

/// Gives `dir`, made by xfn, to the image's root `root_id` (nothing to do
/// when that is xfn's own id 0).
fn give_to_root(dir: &Path, root_id: u32) -> Result<(), RootfsError> {
    if root_id == 0 {
        return Ok(());
    }
    std::os::unix::fs::lchown(dir, Some(root_id), Some(root_id))
        .map_err(io_err("giving the image's root", dir))
}

impl Rootfs {
    /// Prepares a rootfs in `run_dir` (created here with its parents; must
    /// not exist yet) with default options. `layers` are the extracted layer dirs, bottom first
    /// (overlay mode); `flattened` is the flattened rootfs (copy mode).
    pub(crate) fn prepare(
        mode: ResolvedMode,
        layers: &[PathBuf],
        flattened: Option<&Path>,
        run_dir: &Path,
    ) -> Result<Rootfs, RootfsError> {
        Self::prepare_with(mode, layers, flattened, run_dir, &RootfsOptions::default())
    }

    /// [`Rootfs::prepare`] with explicit options.
    pub(crate) fn prepare_with(
        mode: ResolvedMode,
        layers: &[PathBuf],
        flattened: Option<&Path>,
        run_dir: &Path,
        options: &RootfsOptions,
    ) -> Result<Rootfs, RootfsError> {
        let mut rootfs = Rootfs {
            run_dir: run_dir.to_path_buf(),
            path: run_dir.join("rootfs"),
            mounts: Vec::new(),
            created: false,
            cleaned: false,
        };
        if let Some(parent) = run_dir.parent() {
            std::fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        // On any error below, dropping `rootfs` undoes what was done. An
        // existing run_dir is refused: it is not ours to remove.
        std::fs::create_dir(run_dir).map_err(io_err("creating", run_dir))?;
        rootfs.created = true;
        match mode {
            ResolvedMode::Overlay => rootfs.mount_overlay(layers, options)?,
            ResolvedMode::Copy => {
                let src = flattened.ok_or(RootfsError::Input(
                    "copy mode needs the flattened rootfs of the image",
                ))?;
                rootfs.copy(src, options)?;
            }
        }
        Ok(rootfs)
    }

    /// Copies `src` into a tmpfs on the run dir, then shrinks the tmpfs to
    /// the copy plus the allowance of `options`.
    fn copy(&mut self, src: &Path, options: &RootfsOptions) -> Result<(), RootfsError> {
        let run_dir = self.run_dir.clone();
        // Unsized while copying (the kernel's default, half of memory): the
        // image's size is the cache's business, bounded when it was pulled.
        overlay::mount_tmpfs(&run_dir, None)
            .map_err(io_err("mounting the run tmpfs on", &run_dir))?;
        self.mounts.push(run_dir.clone());
        copy_tree(src, &self.path).map_err(io_err("copying into", &self.path))?;
        give_to_root(&self.path, options.root_id)?;
        overlay::bound_tmpfs(&run_dir, options.size_bytes)
            .map_err(io_err("bounding the run tmpfs on", &run_dir))
    }

    fn mount_overlay(
        &mut self,
        layers: &[PathBuf],
        options: &RootfsOptions,
    ) -> Result<(), RootfsError> {
        if layers.is_empty() {
            return Err(RootfsError::Input("overlay mode needs at least one layer"));
        }
        let run_dir = self.run_dir.clone();
        overlay::mount_tmpfs(&run_dir, Some(options.size_bytes))
            .map_err(io_err("mounting the run tmpfs on", &run_dir))?;
        self.mounts.push(run_dir.clone());
        let upper = run_dir.join("upper");
        let work = run_dir.join("work");
        for d in [&upper, &work, &self.path] {
            std::fs::create_dir(d).map_err(io_err("creating", d))?;
        }
        // The overlay's `/` is the upper dir's.
        give_to_root(&upper, options.root_id)?;
        overlay::mount_overlay(&overlay::OverlaySpec {
            layers,
            upper: &upper,
            work: &work,
            target: &self.path,
            run_dir: &run_dir,
            legacy: options.legacy_mount,
        })
        .map_err(io_err("mounting the overlay on", &self.path))?;
        self.mounts.push(self.path.clone());
        Ok(())
    }

    /// The root filesystem's directory (an OCI bundle's `root.path`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts and removes everything of this run. Idempotent; also run on
    /// drop (where errors can only be logged).
    pub(crate) fn cleanup(&mut self) -> Result<(), RootfsError> {
        if self.cleaned {
            return Ok(());
        }
        while let Some(mp) = self.mounts.pop() {
            if let Err(e) = overlay::unmount(&mp) {
                self.mounts.push(mp.clone());
                return Err(io_err("unmounting", &mp)(e));
            }
        }
        if self.created {
            remove_run_dir(&self.run_dir)?;
        }
        self.cleaned = true;
        Ok(())
    }

    /// Removes what a killed process left in `run_dir` (mounts under it,
    /// then the dir); for a restarted daemon's sweep of its run dirs.
    pub(crate) fn cleanup_stale(run_dir: &Path) -> Result<(), RootfsError> {
        remove_run_dir(run_dir)
    }
}

/// Detaches whatever is still mounted under `run_dir`, then removes it. It
/// never deletes through a mount: if one stays, it fails instead.
fn remove_run_dir(run_dir: &Path) -> Result<(), RootfsError> {
    // A run's usual end: its own mounts are gone by now, and all it wrote
    // was in them, so its dir is empty. A plain rmdir removes it, and
    // cannot delete through a mount (it fails on a mount point and on a dir
    // that holds anything). Only otherwise read `mountinfo`, which lists
    // every mount of xfn's namespace (two per warm container): reading it
    // once per run was about 11 % of a loaded daemon's own CPU
    // (benches/PROFILE.md).
    match std::fs::remove_dir(run_dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    let mounted =
        overlay::mounts_under(run_dir).map_err(io_err("reading mounts under", run_dir))?;
    if !mounted.is_empty() {
        for mp in mounted {
            overlay::unmount(&mp).map_err(io_err("unmounting", &mp))?;
        }
        let left =
            overlay::mounts_under(run_dir).map_err(io_err("reading mounts under", run_dir))?;
        if let Some(mp) = left.first() {
            return Err(RootfsError::Io {
                step: "unmounting",
                path: mp.clone(),
                source: std::io::Error::other("still mounted after detaching"),
            });
        }
    }
    crate::image::extract::fsops::remove_path(run_dir).map_err(io_err("removing", run_dir))
}

impl Drop for Rootfs {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            tracing::error!(error = %crate::chain::Chain(&e), run_dir = %self.run_dir.display(), "rootfs cleanup failed");
        }
    }
}

/// Whether an overlay rootfs works here: run once at start, inside the user +
/// mount namespace runs use. Under a temp dir in `scratch_dir` (on the same
/// filesystem as the layer cache) it makes a layer with an overlay whiteout
/// (char device 0:0) and an opaque dir, mounts it exactly as a run would
/// (tmpfs upper, `userxattr`), checks that the whiteout hides, the opaque dir
/// hides and a write lands in the upper dir, then cleans up.
pub(crate) fn overlay_supported(scratch_dir: &Path) -> bool {
    match probe(scratch_dir) {
        Ok(()) => true,
        Err(e) => {
            tracing::info!(reason = %e, "overlay rootfs not available here");
            false
        }
    }
}

fn probe(scratch_dir: &Path) -> Result<(), String> {
    let tmp = tempfile::Builder::new()
        .prefix(".xfn-overlay-probe-")
        .tempdir_in(scratch_dir)
        .map_err(|e| format!("temp dir in {}: {e}", scratch_dir.display()))?;
    let lower = tmp.path().join("lower");
    let below = tmp.path().join("below");
    let step = |what: &str, e: std::io::Error| format!("{what}: {e}");
    for d in [&lower, &below, &below.join("opq")] {
        std::fs::create_dir(d).map_err(|e| step("mkdir", e))?;
    }
    std::fs::write(below.join("hidden"), b"x").map_err(|e| step("write", e))?;
    std::fs::write(below.join("opq/hidden"), b"x").map_err(|e| step("write", e))?;
    rustix::fs::mknodat(
        rustix::fs::CWD,
        lower.join("hidden"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .map_err(|e| step("mknod of an overlay whiteout", e.into()))?;
    std::fs::create_dir(lower.join("opq")).map_err(|e| step("mkdir", e))?;
    rustix::fs::setxattr(
        lower.join("opq"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| step("user xattr", e.into()))?;
    let mut rootfs = Rootfs::prepare(
        ResolvedMode::Overlay,
        &[below, lower],
        None,
        &tmp.path().join("run"),
    )
    .map_err(|e| crate::chain::one_line(&e))?;
    let root = rootfs.path().to_path_buf();
    let checks = (|| {
        if root.join("hidden").symlink_metadata().is_ok() {
            return Err("whiteouts are not honoured".to_string());
        }
        if root.join("opq/hidden").symlink_metadata().is_ok() {
            return Err("opaque dirs are not honoured".to_string());
        }
        std::fs::write(root.join("written"), b"y").map_err(|e| step("write to the overlay", e))
    })();
    let cleaned = rootfs.cleanup().map_err(|e| crate::chain::one_line(&e));
    checks.and(cleaned)
}

#[cfg(test)]
mod tests;
