//! INTERIM per-run root filesystems, until `crate::rootfs` (owned by the
//! rootfs work) lands: then `Runner::prepare_rootfs` switches to it and this
//! file goes. Kept deliberately small: an overlay of the image's layer dirs
//! (read-only lowers, shared) with upper and work dirs on a per-run tmpfs, or
//! a `cp -a` of the flattened rootfs onto a per-run tmpfs. Both unmounted
//! and removed when the [`RunRootfs`] is dropped.
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// How per-run root filesystems are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RootfsMode {
    /// Overlay when the kernel allows it here (probed once), else copy.
    #[default]
    Auto,
    /// Always overlay.
    Overlay,
    /// Always copy.
    Copy,
}

/// Errors of rootfs preparation.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// A mount failed.
    #[error("cannot mount {what} at {path}: {source}")]
    Mount {
        /// What.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: nix::Error,
    },
    /// File system trouble.
    #[error("{path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Copying failed.
    #[error("copying the image rootfs failed: {0}")]
    Copy(String),
}

/// One run's root filesystem; unmounted and removed on drop.
#[derive(Debug)]
pub struct RunRootfs {
    base: PathBuf,
    rootfs: PathBuf,
}

impl RunRootfs {
    /// The directory to use as the container's root.
    pub fn path(&self) -> &Path {
        &self.rootfs
    }
}

impl Drop for RunRootfs {
    fn drop(&mut self) {
        // Lazy unmounts: a mount still busy for an instant (crun just exited)
        // must not survive the run.
        let _ = umount2(&self.rootfs, MntFlags::MNT_DETACH);
        let _ = umount2(&self.base, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn tmpfs(base: &Path) -> Result<RunRootfs, RootfsError> {
    std::fs::create_dir(base).map_err(|source| RootfsError::Io {
        path: base.to_path_buf(),
        source,
    })?;
    let rootfs = RunRootfs {
        base: base.to_path_buf(),
        rootfs: base.join("rootfs"),
    };
    mount(
        Some("tmpfs"),
        base,
        Some("tmpfs"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        Some("mode=755"),
    )
    .map_err(|source| RootfsError::Mount {
        what: "tmpfs",
        path: base.to_path_buf(),
        source,
    })?;
    for dir in ["rootfs", "upper", "work"] {
        let path = base.join(dir);
        std::fs::create_dir(&path).map_err(|source| RootfsError::Io { path, source })?;
    }
    Ok(rootfs)
}

/// An overlay of `layers` (bottom first) at `base/rootfs`.
pub fn overlay(base: &Path, layers: &[PathBuf]) -> Result<RunRootfs, RootfsError> {
    let rootfs = tmpfs(base)?;
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|l| l.display().to_string())
        .collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.join(":"),
        base.join("upper").display(),
        base.join("work").display()
    );
    mount(
        Some("overlay"),
        &rootfs.rootfs,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(|source| RootfsError::Mount {
        what: "overlay",
        path: rootfs.rootfs.clone(),
        source,
    })?;
    Ok(rootfs)
}

/// A copy of `flattened` at `base/rootfs`.
pub fn copy(base: &Path, flattened: &Path) -> Result<RunRootfs, RootfsError> {
    let rootfs = tmpfs(base)?;
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", flattened.display()))
        .arg(&rootfs.rootfs)
        .status()
        .map_err(|e| RootfsError::Copy(e.to_string()))?;
    if !status.success() {
        return Err(RootfsError::Copy(format!("cp exited with {status}")));
    }
    Ok(rootfs)
}
