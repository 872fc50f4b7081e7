//! What this host offers for resource limits, and taking over a delegated
//! cgroup v2 subtree when there is one.
//!
//! Detected and set up once, before the user namespace is entered (with the
//! host's credentials; afterwards host-owned cgroup files may look unmapped):
//! xfn (and whatever shares its cgroup, such as the sidecar's gatekeeper)
//! moves into a `supervisor` leaf, because a cgroup with processes cannot
//! enable controllers for children ("no internal processes"); then `cpu
//! memory pids` are enabled for the children, and every run gets its own
//! child cgroup (see [`run`]).
//!
//! Paths: crun's cgroupfs manager joins `linux.cgroupsPath` to its cgroup2
//! mount, `/sys/fs/cgroup`, and the path in `/proc/self/cgroup` is relative
//! to the root of xfn's cgroup namespace. The two agree when the mount shows
//! that same namespace's root, as it does on a host (initial namespace), in a
//! Kubernetes pod with cgroup v2 (private namespace, mount rooted at the
//! container's cgroup) and under systemd. xfn enters no cgroup namespace of
//! its own, so they keep agreeing inside its user and mount namespace.
pub(crate) mod run;

use std::path::{Path, PathBuf};

use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
use nix::unistd::{access, AccessFlags};

/// The controllers a run's limits need.
pub(crate) const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// The leaf xfn moves itself into.
pub(crate) const SUPERVISOR_LEAF: &str = "supervisor";

/// A delegated cgroup v2 subtree set up for runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delegation {
    /// The subtree's directory (under `/sys/fs/cgroup`).
    pub(crate) dir: PathBuf,
    /// The same cgroup as crun's cgroupfs manager names it (`/a/b`).
    pub(crate) cgroup: String,
}

/// How cgroups look from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CgroupSupport {
    /// A delegated cgroup v2 subtree with `cpu memory pids` enabled for
    /// children: limits are enforced.
    DelegatedV2(Delegation),
    /// xfn's cgroup v2 is writable but could not be set up for runs.
    DelegationFailed(String),
    /// /sys/fs/cgroup is cgroup v2 but xfn's cgroup is not writable.
    ReadOnlyV2,
    /// cgroup v1 or hybrid (crun 1.8.1 refuses hybrid; /sys/fs/cgroup must be
    /// covered in xfn's mount namespace).
    NotV2,
}

impl CgroupSupport {
    /// Looks at `/sys/fs/cgroup` and `/proc/self/cgroup` and, where xfn's
    /// cgroup is a writable v2 one, takes it over for runs.
    pub(crate) fn detect() -> Self {
        Self::detect_at(Path::new("/sys/fs/cgroup"), Path::new("/proc/self/cgroup"))
    }

    fn detect_at(mount: &Path, self_cgroup: &Path) -> Self {
        let is_v2 = statfs(mount)
            .map(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
            .unwrap_or(false);
        if !is_v2 {
            return Self::NotV2;
        }
        let Some(mut relative) = std::fs::read_to_string(self_cgroup)
            .ok()
            .and_then(|text| own_v2_path(&text))
        else {
            return Self::ReadOnlyV2;
        };
        // Already in a supervisor leaf (a second xfn started from the first's
        // cgroup, or a restart inside it): the subtree is the parent, set up.
        let mut already_leaf = false;
        if let Some(parent) = relative.strip_suffix(&format!("/{SUPERVISOR_LEAF}")) {
            relative = if parent.is_empty() {
                "/".into()
            } else {
                parent.to_string()
            };
            already_leaf = true;
        }
        let dir = mount.join(relative.trim_start_matches('/'));
        if !writable(&dir) {
            return Self::ReadOnlyV2;
        }
        match take_over(&dir, already_leaf) {
            Ok(()) => Self::DelegatedV2(Delegation {
                dir,
                cgroup: relative,
            }),
            Err(why) => Self::DelegationFailed(why),
        }
    }

    /// The subtree runs go under, when limits are enforced.
    pub(crate) fn delegation(&self) -> Option<&Delegation> {
        match self {
            Self::DelegatedV2(delegation) => Some(delegation),
            _ => None,
        }
    }

    /// Whether /sys/fs/cgroup must be covered by a tmpfs for crun to start.
    /// Never on a v2 host: crun needs the real cgroupfs there.
    pub(crate) fn needs_cover(&self) -> bool {
        matches!(self, Self::NotV2)
    }

    /// Why limits are not enforced, in words for a log line or an error;
    /// `None` when they are.
    pub(crate) fn why_no_limits(&self) -> Option<String> {
        match self {
            Self::DelegatedV2(_) => None,
            Self::DelegationFailed(why) => Some(format!(
                "xfn's cgroup v2 is writable but cannot be used for limits: {why}"
            )),
            Self::ReadOnlyV2 => Some(
                "xfn's cgroup v2 directory is not writable (not delegated to xfn's user)".into(),
            ),
            Self::NotV2 => {
                Some("the host does not use a unified cgroup v2 hierarchy (v1 or hybrid)".into())
            }
        }
    }

    /// With a range mapped, xfn's namespace root is another host uid: hands
    /// the subtree to it, as systemd's `Delegate=yes` hands one to a user
    /// (the directory and the files a delegatee writes). Call before
    /// entering the namespace; on failure limits are reported unenforced.
    pub(crate) fn hand_to(self, uid: u32, gid: u32) -> Self {
        let Self::DelegatedV2(delegation) = &self else {
            return self;
        };
        let files = [
            "",
            "cgroup.procs",
            "cgroup.subtree_control",
            "cgroup.threads",
        ];
        for file in files {
            let path = delegation.dir.join(file);
            if let Err(err) = std::os::unix::fs::chown(&path, Some(uid), Some(gid)) {
                return Self::DelegationFailed(format!(
                    "cannot hand {} to the mapped root (uid {uid}): {err}",
                    path.display()
                ));
            }
        }
        self
    }
}

fn writable(dir: &Path) -> bool {
    access(dir, AccessFlags::W_OK).is_ok()
        && access(&dir.join("cgroup.subtree_control"), AccessFlags::W_OK).is_ok()
        && access(&dir.join("cgroup.procs"), AccessFlags::W_OK).is_ok()
}

/// Moves every process of `dir` into its supervisor leaf and enables the
/// run controllers for `dir`'s children.
fn take_over(dir: &Path, already_leaf: bool) -> Result<(), String> {
    let available = read(&dir.join("cgroup.controllers"))?;
    let missing: Vec<&str> = CONTROLLERS
        .into_iter()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "controllers {missing:?} are not available in {} (the parent must enable them)",
            dir.display()
        ));
    }
    if !already_leaf {
        let leaf = dir.join(SUPERVISOR_LEAF);
        match std::fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(format!("cannot create {}: {err}", leaf.display())),
        }
        // One pid per write; the list can change meanwhile, and our own pid
        // is among them (all our threads follow it).
        for pid in read(&dir.join("cgroup.procs"))?.split_whitespace() {
            write(&leaf.join("cgroup.procs"), pid)?;
        }
    }
    let enable: Vec<String> = CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
    write(&dir.join("cgroup.subtree_control"), &enable.join(" "))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|err| format!("cannot read {}: {err}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text)
        .map_err(|err| format!("cannot write {text:?} to {}: {err}", path.display()))
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
        assert!(support.why_no_limits().is_some());
        assert!(support.delegation().is_none());
    }

    #[test]
    fn missing_controllers_fail_the_take_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu pids\n").unwrap();
        let err = take_over(dir.path(), false).unwrap_err();
        assert!(err.contains("memory"), "{err}");
    }
}
