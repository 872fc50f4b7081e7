//! Entering xfn's own user and mount namespace, once, while the process is
//! still single-threaded (the kernel refuses `unshare(CLONE_NEWUSER)` to a
//! multi-threaded process, and tokio starts threads).
//!
//! Choice: **unshare in-process, no outer process.** The xfn process itself
//! moves into the new namespaces, so there is no parent to forward signals
//! or exit codes, and no run ever costs a re-exec. When a 65536-id range must
//! be mapped, the map has to be written by a process that stays in the parent
//! namespace, so xfn forks a tiny helper *before* unsharing: it waits on a
//! pipe, writes `/proc/<xfn>/{uid,gid}_map` and exits; xfn reaps it. Without
//! CAP_SETUID/CAP_SETGID only the own id can be mapped, which xfn does itself
//! (`setgroups` denied first, as user_namespaces(7) demands).
//!
//! Choice: **the entry hands back a token, no global.** [`enter`] returns
//! the [`Namespace`] it made, and `Runner::new` takes it: a runner cannot be
//! built before the process entered (the compiler says so, not a run-time
//! `NotInNamespace`), and what a runner knows of its namespace (the id
//! mapping, cgroup support) is handed to it, not read from a `static` that
//! tests and commands share. Only "entered already" is process-wide, as the
//! kernel's namespace is: an atomic flag refuses a second entry.
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{
    access, fork, getegid, geteuid, getpid, pipe, AccessFlags, ForkResult, Gid, Uid,
};

use super::cgroup::CgroupSupport;
use super::ucounts::UcountLimits;

/// How many ids a privileged mapping maps.
pub const RANGE_SIZE: u32 = 65536;

/// Errors of namespace entry.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// A syscall failed.
    #[error("cannot {what}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The errno.
        source: nix::Error,
    },
    /// Writing an id map failed.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The map-writing helper failed.
    #[error(
        "the id-map helper failed ({0}); is the range {1} free and mapped in the parent namespace?"
    )]
    Helper(String, String),
    /// The cache directory could not be prepared.
    #[error("cannot prepare the cache dir {path}")]
    CacheDir {
        /// The dir.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// With a range mapped, the cache dir must be reachable by the mapped root.
    #[error("the cache dir {path} is not reachable by xfn's mapped root (host uid {uid}): every parent directory must be searchable by that uid; choose another --cache-dir (e.g. /var/cache/xfn) or make the parents world-searchable")]
    CacheUnreachable {
        /// The dir.
        path: PathBuf,
        /// The host uid of the namespace's root.
        uid: u32,
    },
    /// Entered twice.
    #[error("the user namespace was already entered")]
    AlreadyEntered,
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> UsernsError {
    move |source| UsernsError::Sys { what, source }
}

/// What to map.
#[derive(Debug, Clone)]
pub struct UsernsOptions {
    /// Host uid that uid 0 maps to when a range may be mapped.
    pub map_root_uid: u32,
    /// Host gid that gid 0 maps to when a range may be mapped.
    pub map_root_gid: u32,
    /// The cache dir; made owned by the mapped root before entering.
    pub cache_dir: PathBuf,
}

/// The id mapping in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdMapping {
    /// Only xfn's own ids, mapped to 0 (unprivileged).
    Own {
        /// Host uid.
        uid: u32,
        /// Host gid.
        gid: u32,
    },
    /// A range of [`RANGE_SIZE`] ids starting at these host ids.
    Range {
        /// Host uid of uid 0.
        uid: u32,
        /// Host gid of gid 0.
        gid: u32,
    },
}

/// The namespace xfn entered: what the runner needs to know about it, and
/// the proof that the process is in it (only [`enter`] makes one).
#[derive(Debug, Clone)]
pub struct Namespace {
    mapping: IdMapping,
    cgroups: CgroupSupport,
    ucounts: UcountLimits,
}

impl Namespace {
    /// The id mapping.
    pub fn mapping(&self) -> IdMapping {
        self.mapping
    }

    /// cgroup support, detected before entering.
    pub(crate) fn cgroups(&self) -> &CgroupSupport {
        &self.cgroups
    }

    /// The per-namespace kernel counts set for xfn's namespace and to set
    /// for each run's (`ucounts.rs`).
    pub(crate) fn ucounts(&self) -> &UcountLimits {
        &self.ucounts
    }

    /// How many ids it maps (each run's namespace maps the same).
    pub(crate) fn mapped_ids(&self) -> u32 {
        match self.mapping {
            IdMapping::Own { .. } => 1,
            IdMapping::Range { .. } => RANGE_SIZE,
        }
    }
}

/// Whether this process entered already (the one process-wide fact).
static ENTERED: AtomicBool = AtomicBool::new(false);

/// Whether this process may map a range: root, or CAP_SETUID and CAP_SETGID.
fn can_map_range() -> bool {
    use caps::{has_cap, CapSet, Capability};
    let has = |cap| has_cap(None, CapSet::Effective, cap).unwrap_or(false);
    geteuid().is_root() || (has(Capability::CAP_SETUID) && has(Capability::CAP_SETGID))
}

/// Enters a new user and mount namespace. Must be called while the process
/// is single-threaded. The namespace it returns is what `Runner::new` needs.
pub fn enter(options: &UsernsOptions) -> Result<Namespace, UsernsError> {
    if ENTERED.swap(true, Ordering::SeqCst) {
        return Err(UsernsError::AlreadyEntered);
    }
    let cgroups = CgroupSupport::detect();
    let range_available = range_is_mapped("/proc/self/uid_map", options.map_root_uid)
        && range_is_mapped("/proc/self/gid_map", options.map_root_gid);
    if can_map_range() && !range_available {
        // E.g. "root" inside a container whose own namespace maps fewer ids.
        tracing::warn!(
            uid = options.map_root_uid,
            gid = options.map_root_gid,
            "the id range to map is not mapped here; mapping only xfn's own ids"
        );
    }
    let mapping = if can_map_range() && range_available {
        IdMapping::Range {
            uid: options.map_root_uid,
            gid: options.map_root_gid,
        }
    } else {
        IdMapping::Own {
            uid: geteuid().as_raw(),
            gid: getegid().as_raw(),
        }
    };
    if let IdMapping::Range { uid, gid } = mapping {
        own_cache_dir(&options.cache_dir, uid, gid)?;
    }
    // The namespace's root must own a delegated cgroup to create run cgroups.
    let cgroups = match mapping {
        IdMapping::Range { uid, gid } => cgroups.hand_to(uid, gid),
        IdMapping::Own { .. } => cgroups,
    };
    match mapping {
        IdMapping::Own { uid, gid } => {
            unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
                .map_err(sys("unshare the user and mount namespaces"))?;
            write_file("/proc/self/setgroups", "deny")?;
            write_file("/proc/self/uid_map", &format!("0 {uid} 1\n"))?;
            write_file("/proc/self/gid_map", &format!("0 {gid} 1\n"))?;
        }
        IdMapping::Range { uid, gid } => {
            enter_with_range(uid, gid)?;
            // Host root is not mapped inside: become the namespace's root
            // (host `map_root_uid`) and drop host supplementary groups, which
            // would show as unmapped.
            nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))
                .map_err(sys("setresgid(0) in the new namespace"))?;
            nix::unistd::setgroups(&[]).map_err(sys("drop supplementary groups"))?;
            nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))
                .map_err(sys("setresuid(0) in the new namespace"))?;
        }
    }
    if let IdMapping::Range { uid, .. } = mapping {
        let all = AccessFlags::R_OK | AccessFlags::W_OK | AccessFlags::X_OK;
        if access(&options.cache_dir, all).is_err() {
            return Err(UsernsError::CacheUnreachable {
                path: options.cache_dir.clone(),
                uid,
            });
        }
    }
    // Mounts made for runs (overlays, bundles) must never reach the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("make / rprivate"))?;
    if cgroups.needs_cover() && Path::new("/sys/fs/cgroup").is_dir() {
        // crun 1.8.1 refuses hybrid cgroups; with its cgroup manager disabled
        // it only needs /sys/fs/cgroup not to look hybrid.
        mount(
            Some("tmpfs"),
            "/sys/fs/cgroup",
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=755,size=16k"),
        )
        .map_err(sys("cover /sys/fs/cgroup with a tmpfs"))?;
    }
    // All functions together leave the host's processes of xfn's uid half
    // of its inotify and fanotify counts (`ucounts.rs`).
    let ucounts = UcountLimits::from_host();
    for failed in ucounts.bound_own() {
        tracing::warn!(%failed, "cannot bound a per-uid kernel count for the functions");
    }
    tracing::debug!(?mapping, ?cgroups, "entered the user and mount namespace");
    Ok(Namespace {
        mapping,
        cgroups,
        ucounts,
    })
}

/// With a range mapped, ids outside it (host root included) are unmapped
/// inside: files they own look owned by `nobody`, and even namespace root
/// cannot write them. The cache dir must therefore be owned by the mapped
/// root before entering. An existing cache owned by someone else is handed
/// over recursively, once.
fn own_cache_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), UsernsError> {
    use std::os::unix::fs::MetadataExt;
    let err = |source| UsernsError::CacheDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let meta = std::fs::metadata(dir).map_err(err)?;
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(());
    }
    chown_tree(dir, uid, gid).map_err(err)
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn enter_with_range(uid: u32, gid: u32) -> Result<(), UsernsError> {
    let (go_read, go_write) = pipe().map_err(sys("create a pipe"))?;
    let target = getpid();
    // SAFETY: the process is single-threaded (documented precondition of
    // `enter`, and main calls it before any thread exists), so the child may
    // run ordinary Rust code; it only writes two files and exits with `_exit`.
    match unsafe { fork() }.map_err(sys("fork the id-map helper"))? {
        ForkResult::Child => {
            drop(go_write);
            let code = map_helper(go_read, target.as_raw(), uid, gid);
            // SAFETY: `_exit` ends the forked child without running the
            // parent's atexit handlers or destructors a second time.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(go_read);
            let unshared = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS);
            let mut go = std::fs::File::from(go_write);
            if unshared.is_ok() {
                // A failed write shows as the helper's failure below.
                let _ = go.write_all(b"1");
            }
            drop(go);
            let status = waitpid(child, None).map_err(sys("wait for the id-map helper"))?;
            unshared.map_err(sys("unshare the user and mount namespaces"))?;
            let range = format!("uid {uid}+{RANGE_SIZE}, gid {gid}+{RANGE_SIZE}");
            match status {
                WaitStatus::Exited(_, 0) => Ok(()),
                WaitStatus::Exited(_, 2) => {
                    Err(UsernsError::Helper("writing uid_map".into(), range))
                }
                WaitStatus::Exited(_, 3) => {
                    Err(UsernsError::Helper("writing gid_map".into(), range))
                }
                other => Err(UsernsError::Helper(format!("{other:?}"), range)),
            }
        }
    }
}

/// The helper's body: wait for the go byte, write the maps. Returns the exit code.
fn map_helper(go: OwnedFd, target: i32, uid: u32, gid: u32) -> i32 {
    let mut byte = [0u8; 1];
    if !matches!(std::fs::File::from(go).read(&mut byte), Ok(1)) {
        return 1; // xfn failed to unshare; nothing to map.
    }
    let uid_map = format!("0 {uid} {RANGE_SIZE}\n");
    if std::fs::write(format!("/proc/{target}/uid_map"), uid_map).is_err() {
        return 2;
    }
    let gid_map = format!("0 {gid} {RANGE_SIZE}\n");
    if std::fs::write(format!("/proc/{target}/gid_map"), gid_map).is_err() {
        return 3;
    }
    0
}

/// Whether `[start, start + RANGE_SIZE)` is wholly covered by one line of an
/// id map (`/proc/self/uid_map`): only ids mapped here can be mapped below.
fn range_is_mapped(map_file: &str, start: u32) -> bool {
    std::fs::read_to_string(map_file)
        .map(|text| map_covers(&text, start, RANGE_SIZE))
        .unwrap_or(false)
}

fn map_covers(map: &str, start: u32, count: u32) -> bool {
    let (start, count) = (u64::from(start), u64::from(count));
    map.lines().any(|line| {
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        // inside-id outside-id count: the ids usable here are the inside ones.
        matches!(fields[..], [inside, _, len] if inside <= start && start + count <= inside + len)
    })
}

fn write_file(path: &str, text: &str) -> Result<(), UsernsError> {
    std::fs::write(path, text).map_err(|source| UsernsError::Write {
        path: path.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_coverage() {
        let init = "         0          0 4294967295\n";
        assert!(map_covers(init, 100_000, RANGE_SIZE));
        let container = "0 1000 65536\n";
        assert!(!map_covers(container, 100_000, RANGE_SIZE));
        assert!(map_covers(container, 0, RANGE_SIZE));
        assert!(!map_covers(container, 1, RANGE_SIZE));
        let split = "0 1000 1\n1 200000 200000\n";
        assert!(map_covers(split, 100_000, RANGE_SIZE));
        assert!(!map_covers("", 0, 1));
    }
}
