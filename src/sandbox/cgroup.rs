//! What this host offers for resource limits: is there a writable, delegated
//! cgroup v2 subtree xfn could give crun? Detected once, before the user
//! namespace is entered (afterwards host-owned cgroup files look unmapped).
use std::path::{Path, PathBuf};

use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
use nix::unistd::{access, AccessFlags};

/// How cgroups look from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSupport {
    /// /sys/fs/cgroup is a cgroup v2 mount and xfn's own cgroup is writable
    /// with these controllers available.
    DelegatedV2 {
        /// xfn's own cgroup directory.
        path: PathBuf,
        /// Controllers listed in its cgroup.controllers.
        controllers: Vec<String>,
    },
    /// /sys/fs/cgroup is cgroup v2 but xfn's cgroup is not writable.
    ReadOnlyV2,
    /// cgroup v1 or hybrid (crun 1.8.1 refuses hybrid; /sys/fs/cgroup must be
    /// covered in xfn's mount namespace).
    NotV2,
}

impl CgroupSupport {
    /// Looks at `/sys/fs/cgroup` and `/proc/self/cgroup`.
    pub fn detect() -> Self {
        Self::detect_at(Path::new("/sys/fs/cgroup"), Path::new("/proc/self/cgroup"))
    }

    fn detect_at(mount: &Path, self_cgroup: &Path) -> Self {
        let is_v2 = statfs(mount)
            .map(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
            .unwrap_or(false);
        if !is_v2 {
            return Self::NotV2;
        }
        let Some(relative) = std::fs::read_to_string(self_cgroup)
            .ok()
            .and_then(|text| own_v2_path(&text))
        else {
            return Self::ReadOnlyV2;
        };
        let path = mount.join(relative.trim_start_matches('/'));
        let writable = access(&path, AccessFlags::W_OK).is_ok()
            && access(&path.join("cgroup.subtree_control"), AccessFlags::W_OK).is_ok()
            && access(&path.join("cgroup.procs"), AccessFlags::W_OK).is_ok();
        if !writable {
            return Self::ReadOnlyV2;
        }
        let controllers = std::fs::read_to_string(path.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Self::DelegatedV2 { path, controllers }
    }

    /// Whether /sys/fs/cgroup must be covered by a tmpfs for crun to start.
    pub fn needs_cover(&self) -> bool {
        matches!(self, Self::NotV2)
    }

    /// Why limits are not enforced, in words for a log line or an error.
    pub fn why_no_limits(&self) -> String {
        match self {
            Self::DelegatedV2 { path, .. } => format!(
                "a delegated cgroup v2 subtree exists at {}, but this xfn does not enforce limits through it yet",
                path.display()
            ),
            Self::ReadOnlyV2 => "xfn's cgroup v2 directory is not writable (not delegated)".into(),
            Self::NotV2 => "the host does not use a unified cgroup v2 hierarchy (v1 or hybrid)".into(),
        }
    }
}

/// The path in `0::<path>` of a /proc/self/cgroup text.
fn own_v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_v2_path() {
        assert_eq!(
            own_v2_path("12:cpu:/x\n0::/user.slice/xfn\n").as_deref(),
            Some("/user.slice/xfn")
        );
        assert_eq!(own_v2_path("1:name=systemd:/\n"), None);
    }

    #[test]
    fn a_non_cgroup_mount_is_not_v2() {
        let dir = tempfile::tempdir().unwrap();
        let support = CgroupSupport::detect_at(dir.path(), Path::new("/proc/self/cgroup"));
        assert_eq!(support, CgroupSupport::NotV2);
        assert!(support.needs_cover());
    }
}
