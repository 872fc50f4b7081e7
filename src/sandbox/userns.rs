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
//!
//! Choice: **functions never run under xfn's host uid where the deployment
//! gives other ids.** The kernel counts some resources per host uid and
//! not per user namespace: epoll watches (`fs.epoll.max_user_watches`),
//! pipe buffer pages (`fs.pipe-user-pages-soft`), and, for a namespace's
//! ancestors, RLIMIT_NPROC. A function under xfn's uid that adds epoll
//! watches until `ENOSPC` leaves the gatekeeper unable to adopt a
//! connection: every new call fails. So xfn's namespace keeps id 0 for xfn
//! itself (its host uid, which owns the cache and the gatekeeper) and maps
//! other host ids at 1 and up, and each run maps its container ids
//! 0..count onto those, one to one (`user.rs`): a function's root is host
//! id `first + 1`, never xfn's. Two deployments give them:
//! - **a privileged range** ([`IdMapping::Range`]): CAP_SETUID/CAP_SETGID
//!   (root on a host, root in a pod with `hostUsers: false`) map the 65536
//!   ids from `--map-root-uid`; xfn becomes its first, functions get the
//!   65535 after it (container ids 0..65534);
//! - **subordinate ids** ([`IdMapping::Subordinate`], `subids.rs`): an
//!   unprivileged xfn whose user has 65536 ids in /etc/subuid and
//!   /etc/subgid maps them with `newuidmap`/`newgidmap` beside its own id,
//!   which stays its root (so the cache, the gatekeeper and the cgroup stay
//!   its own uid's, as without them).
//!
//! Without either ([`IdMapping::Own`]) functions run under xfn's uid as
//! before, and `xfn start` says so at start.
//!
//! Layers are extracted with their owners shifted alike (image uid `n` is
//! xfn's id `n + 1`: `image::store::owners`), so a function sees its image's
//! owners as the image gives them. What a shared overlay cannot give:
//! **a host uid per concurrent run**. The layers are shared by every run,
//! owned once on disk, so every run must map the same ids onto them; the
//! kernel's way around that, an idmapped mount per run, is refused for the
//! overlay (`mount_setattr(MOUNT_ATTR_IDMAP)`: EINVAL, overlayfs does not
//! support it, measured on 6.18) and, from a user namespace, for the host
//! filesystem under the layers (EPERM: it needs CAP_SYS_ADMIN where that
//! filesystem was mounted). Only a copy of the image per run could, which
//! costs a run what a pull costs. So concurrent functions share their host
//! ids with each other, not with xfn; what they share per uid is bounded
//! per run where the kernel counts it per namespace (`ucounts.rs`,
//! RLIMIT_NPROC in `spec.rs`).
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
use super::subids::{self, SubIds};
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
        "the id-map helper failed ({0}); are the ids ({1}) free and mapped in the parent namespace?"
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
    /// Without CAP_SETUID, map the subordinate ids of /etc/subuid and
    /// /etc/subgid when `newuidmap`/`newgidmap` can (`--subids`).
    pub subordinate_ids: bool,
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
    /// A range of [`RANGE_SIZE`] ids starting at these host ids (xfn is
    /// the first; functions get the rest).
    Range {
        /// Host uid of uid 0.
        uid: u32,
        /// Host gid of gid 0.
        gid: u32,
    },
    /// xfn's own ids at 0, and `count` subordinate ids from 1 (functions').
    Subordinate {
        /// Host uid of uid 0: xfn's own.
        uid: u32,
        /// Host gid of gid 0: xfn's own.
        gid: u32,
        /// Host uid of uid 1.
        sub_uid: u32,
        /// Host gid of gid 1.
        sub_gid: u32,
        /// How many subordinate ids.
        count: u32,
    },
}

/// The ids of xfn's namespace that functions run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionIds {
    /// Only xfn's own id (0): each run maps the image's user onto it.
    Own,
    /// Ids `1..=count`, none of them xfn's: each run maps container ids
    /// `0..count` onto them one to one.
    Spare {
        /// How many.
        count: u32,
    },
}

impl FunctionIds {
    /// The id of xfn's namespace that is a function's root (container id
    /// 0): xfn's own 0, or the first spare id, 1.
    pub fn root(&self) -> u32 {
        match self {
            FunctionIds::Own => 0,
            FunctionIds::Spare { .. } => 1,
        }
    }
}

impl IdMapping {
    /// The ids functions run under.
    pub fn function_ids(&self) -> FunctionIds {
        match *self {
            IdMapping::Own { .. } => FunctionIds::Own,
            IdMapping::Range { .. } => FunctionIds::Spare {
                count: RANGE_SIZE - 1,
            },
            IdMapping::Subordinate { count, .. } => FunctionIds::Spare { count },
        }
    }

    /// The host uids functions run under, first and last (the image's root
    /// is the first).
    pub fn function_host_uids(&self) -> (u32, u32) {
        match *self {
            IdMapping::Own { uid, .. } => (uid, uid),
            IdMapping::Range { uid, .. } => (uid + 1, uid + RANGE_SIZE - 1),
            IdMapping::Subordinate { sub_uid, count, .. } => (sub_uid, sub_uid + count - 1),
        }
    }

    /// What image ids are shifted by in extracted layers (`image::store::owners`).
    pub fn owner_shift(&self) -> u32 {
        self.function_ids().root()
    }

    /// The host uid xfn runs as in its namespace (its id 0).
    pub fn own_host_uid(&self) -> u32 {
        match *self {
            IdMapping::Own { uid, .. }
            | IdMapping::Range { uid, .. }
            | IdMapping::Subordinate { uid, .. } => uid,
        }
    }
}

/// The namespace xfn entered: what the runner needs to know about it, and
/// the proof that the process is in it (only [`enter`] makes one).
#[derive(Debug, Clone)]
pub struct Namespace {
    mapping: IdMapping,
    cgroups: CgroupSupport,
    ucounts: UcountLimits,
    /// Why functions share xfn's host uid, when they do.
    shared_uid: Option<String>,
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

    /// The ids functions run under.
    pub fn function_ids(&self) -> FunctionIds {
        self.mapping.function_ids()
    }

    /// What image ids are shifted by in extracted layers: 1 where
    /// functions have ids of their own from 1 (`image::store::owners`).
    pub fn owner_shift(&self) -> u32 {
        self.mapping.owner_shift()
    }

    /// Why functions run under xfn's own host uid, when they do: for
    /// `xfn start` to say at start.
    pub fn why_shared_uid(&self) -> Option<&str> {
        self.shared_uid.as_deref()
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
    let (own_uid, own_gid) = (geteuid().as_raw(), getegid().as_raw());
    let subordinate = match () {
        _ if can_map_range() => Err("xfn may map a range, but it is not mapped here".to_string()),
        _ if !options.subordinate_ids => Err("--subids=off".to_string()),
        _ => subids::detect(own_uid),
    };
    let helpers = subordinate.as_ref().ok().cloned();
    let (mapping, shared_uid) = match subordinate {
        _ if can_map_range() && range_available => (
            IdMapping::Range {
                uid: options.map_root_uid,
                gid: options.map_root_gid,
            },
            None,
        ),
        Ok(sub) => (
            IdMapping::Subordinate {
                uid: own_uid,
                gid: own_gid,
                sub_uid: sub.uid,
                sub_gid: sub.gid,
                count: sub.count,
            },
            None,
        ),
        Err(why) => (
            IdMapping::Own {
                uid: own_uid,
                gid: own_gid,
            },
            Some(why),
        ),
    };

    if let IdMapping::Range { uid, gid } = mapping {
        own_cache_dir(&options.cache_dir, uid, gid)?;
    }
    // The namespace's root must own a delegated cgroup to create run cgroups.
    let cgroups = match mapping {
        IdMapping::Range { uid, gid } => cgroups.hand_to(uid, gid),
        IdMapping::Own { .. } | IdMapping::Subordinate { .. } => cgroups,
    };
    match mapping {
        IdMapping::Own { uid, gid } => {
            unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
                .map_err(sys("unshare the user and mount namespaces"))?;
            write_file("/proc/self/setgroups", "deny")?;
            write_file("/proc/self/uid_map", &format!("0 {uid} 1\n"))?;
            write_file("/proc/self/gid_map", &format!("0 {gid} 1\n"))?;
        }
        IdMapping::Subordinate { .. } => {
            let sub = helpers.ok_or_else(|| {
                UsernsError::Helper("no helpers".into(), "subordinate ids".into())
            })?;
            let ids = format!(
                "uid {}+{n}, gid {}+{n} with {} and {}",
                sub.uid,
                sub.gid,
                sub.newuidmap.display(),
                sub.newgidmap.display(),
                n = sub.count
            );
            enter_mapped_by(&ids, move |target| {
                subordinate_helper(target, own_uid, own_gid, &sub)
            })?;
        }
        IdMapping::Range { uid, gid } => {
            let range = format!("uid {uid}+{RANGE_SIZE}, gid {gid}+{RANGE_SIZE}");
            enter_mapped_by(&range, move |target| map_helper(target, uid, gid))?;
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
    // Layers must be extracted for the ids this namespace's runs map.
    crate::image::store::owners::settle(&options.cache_dir, mapping.owner_shift()).map_err(
        |e| UsernsError::CacheDir {
            path: options.cache_dir.clone(),
            source: std::io::Error::other(e.to_string()),
        },
    )?;
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
        shared_uid,
    })
}

/// With a range mapped, ids outside it (host root included) are unmapped
/// inside: files they own look owned by `nobody`, and even namespace root
/// cannot write them. The cache dir must therefore be owned by the mapped
/// root before entering. An existing cache owned by someone else is handed
/// over recursively, once (its layers then set aside: `owners`).
fn own_cache_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), UsernsError> {
    use std::os::unix::fs::MetadataExt;
    let err = |source| UsernsError::CacheDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let meta = std::fs::metadata(dir).map_err(err)?;
    // Its group may be the functions' (`image::store::owners`): the owner
    // says whose the cache is.
    if meta.uid() == uid {
        return Ok(());
    }
    chown_tree(dir, uid, gid).map_err(err)?;
    // Its layers are all the mapped root's now, whatever their image says:
    // no longer what the owners record says (`image::store::owners`).
    match std::fs::remove_file(dir.join("owners")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(e)),
        _ => Ok(()),
    }
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

/// Unshares and has a forked helper, still in the parent namespace, write
/// xfn's id maps with `write_maps(xfn's pid)` (which returns the helper's
/// exit code: 0, or 2/3 for the uid/gid map). `what` names the ids, for errors.
fn enter_mapped_by(what: &str, write_maps: impl FnOnce(i32) -> i32) -> Result<(), UsernsError> {
    let (go_read, go_write) = pipe().map_err(sys("create a pipe"))?;
    let target = getpid();
    // SAFETY: the process is single-threaded (documented precondition of
    // `enter`, and main calls it before any thread exists), so the child may
    // run ordinary Rust code; it only writes two maps and exits with `_exit`.
    match unsafe { fork() }.map_err(sys("fork the id-map helper"))? {
        ForkResult::Child => {
            drop(go_write);
            let code = if wait_for_go(go_read) {
                write_maps(target.as_raw())
            } else {
                1 // xfn failed to unshare; nothing to map.
            };
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
            match status {
                WaitStatus::Exited(_, 0) => Ok(()),
                WaitStatus::Exited(_, 2) => {
                    Err(UsernsError::Helper("writing uid_map".into(), what.into()))
                }
                WaitStatus::Exited(_, 3) => {
                    Err(UsernsError::Helper("writing gid_map".into(), what.into()))
                }
                other => Err(UsernsError::Helper(format!("{other:?}"), what.into())),
            }
        }
    }
}

fn wait_for_go(go: OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    matches!(std::fs::File::from(go).read(&mut byte), Ok(1))
}

/// The privileged helper's maps: the range, written directly. Returns the
/// exit code.
fn map_helper(target: i32, uid: u32, gid: u32) -> i32 {
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

/// The unprivileged helper's maps: xfn's own ids at 0 and the subordinate
/// ones from 1, through `newuidmap`/`newgidmap`. Returns the exit code.
fn subordinate_helper(target: i32, uid: u32, gid: u32, sub: &SubIds) -> i32 {
    let run = |helper: &Path, own: u32, first: u32| {
        std::process::Command::new(helper)
            .arg(target.to_string())
            .args(["0", &own.to_string(), "1"])
            .args(["1", &first.to_string(), &sub.count.to_string()])
            .stdin(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if !run(&sub.newuidmap, uid, sub.uid) {
        return 2;
    }
    if !run(&sub.newgidmap, gid, sub.gid) {
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
