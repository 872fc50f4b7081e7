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
//! gives other ids** (a privileged range, or subordinate ids).
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/sandbox/userns.rs`.
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
pub(crate) const RANGE_SIZE: u32 = 65536;

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
    /// `--map-root-uid/gid` name ids that are not mapped where xfn starts.
    #[error("{0}")]
    RangeNotMapped(String),
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
    /// The cache dir is not xfn's alone.
    #[error(transparent)]
    UnsafeCache(crate::image::store::trust::UnsafeCacheDir),
    /// The cache's layers could not be settled for this namespace's ids.
    #[error("cannot prepare the cache dir {path}")]
    CacheSettle {
        /// The dir.
        path: PathBuf,
        /// Why.
        source: crate::image::ImageError,
    },
    /// With a range mapped, the cache dir must be reachable by the mapped root.
    #[error("the cache dir {path} is not reachable by xfn's mapped root (host uid {uid}): every parent directory must be searchable by that uid; choose another --cache-dir (e.g. /var/cache/xfn) or make the parents world-searchable")]
    CacheUnreachable {
        /// The dir.
        path: PathBuf,
        /// The host uid of the namespace's root.
        uid: u32,
    },
    /// The map would map uid 0 of the namespace xfn starts in, which the
    /// kernel allows only with CAP_SETFCAP there.
    #[error(
        "xfn is uid 0 where it starts, and mapping that uid into its own user namespace takes \
         CAP_SETFCAP there (Linux 5.12+: so that no namespace can give file capabilities to its \
         parent's root), which xfn lacks: add SETFCAP to the container's capabilities (deploy/: \
         the pod's root with SETUID, SETGID and SETFCAP), or run xfn as another uid"
    )]
    NeedsSetfcap,
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
    /// The uid (of the namespace xfn starts in) that xfn's uid 0 maps to
    /// when a range may be mapped; `None`: chosen from what that namespace
    /// maps (`choose_start`).
    pub map_root_uid: Option<u32>,
    /// The gid that gid 0 maps to, alike.
    pub map_root_gid: Option<u32>,
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
    /// A range of [`RANGE_SIZE`] ids starting at these ids of the
    /// namespace xfn started in (the host's, or a pod's own: then 0): xfn
    /// is the first; functions get the rest.
    Range {
        /// Uid of uid 0 in the namespace xfn started in.
        uid: u32,
        /// Gid of gid 0 in the namespace xfn started in.
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
pub(crate) enum FunctionIds {
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
    pub(crate) fn root(&self) -> u32 {
        match self {
            FunctionIds::Own => 0,
            FunctionIds::Spare { .. } => 1,
        }
    }
}

impl IdMapping {
    /// The ids functions run under.
    pub(crate) fn function_ids(&self) -> FunctionIds {
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

    /// Whether the uid map maps uid 0 of the namespace xfn starts in: the
    /// kernel then wants CAP_SETFCAP there from whoever writes it
    /// (`verify_root_map`, Linux 5.12+), besides CAP_SETUID for a range.
    /// `newuidmap` has it (setuid root); xfn as the root of a pod's own user
    /// namespace (`hostUsers: false`) must be given it.
    fn maps_outer_root(&self) -> bool {
        match *self {
            IdMapping::Own { uid, .. } | IdMapping::Range { uid, .. } => uid == 0,
            IdMapping::Subordinate { .. } => false,
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
    /// The uid map of the namespace xfn started in (its /proc/self/uid_map
    /// before entering): how the ids of [`IdMapping`] show one level up.
    outer_uid_map: String,
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
    pub(crate) fn function_ids(&self) -> FunctionIds {
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

    /// A uid of `IdMapping` (of the namespace xfn started in) as the
    /// namespace above that one sees it: the node's, for xfn in a pod with
    /// `hostUsers: false`; itself on a host. `None` if unmapped there.
    pub fn outer_uid(&self, uid: u32) -> Option<u32> {
        map_outward(&self.outer_uid_map, uid)
    }
}

/// Whether this process entered already (the one process-wide fact).
static ENTERED: AtomicBool = AtomicBool::new(false);

/// Whether this process may map a range: CAP_SETUID and CAP_SETGID in
/// effect (root has them, unless its container dropped them: then it can
/// write no map of more than its own id either).
fn can_map_range() -> bool {
    has_effective(caps::Capability::CAP_SETUID) && has_effective(caps::Capability::CAP_SETGID)
}

fn has_effective(cap: caps::Capability) -> bool {
    caps::has_cap(None, caps::CapSet::Effective, cap).unwrap_or(false)
}

/// Where a privileged range starts on a host when `--map-root-uid/gid` are
/// not given: the host's own users' ids are below it.
pub(crate) const HOST_RANGE_START: u32 = 100_000;

/// Why no range is mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NoRange {
    /// No CAP_SETUID/CAP_SETGID: subordinate ids may still serve.
    Unprivileged,
    /// None that the namespace xfn starts in maps: functions share xfn's uid.
    Unmapped(String),
    /// `--map-root-uid/gid` name ids not mapped here: xfn refuses to start
    /// rather than run functions under its own uid against the flags.
    Refused(String),
}

/// Uids or gids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ids {
    Uids,
    Gids,
}

impl Ids {
    fn name(self) -> &'static str {
        match self {
            Ids::Uids => "uid",
            Ids::Gids => "gid",
        }
    }

    fn map_file(self) -> &'static str {
        match self {
            Ids::Uids => "/proc/self/uid_map",
            Ids::Gids => "/proc/self/gid_map",
        }
    }
}

impl UsernsOptions {
    /// The range (`IdMapping::Range`) this process would map: the first
    /// uid and gid, or `None` where it maps none.
    pub fn range(&self) -> Option<(u32, u32)> {
        choose_range(self).ok()
    }
}

/// The range to map, from the flags and what this process may map.
fn choose_range(options: &UsernsOptions) -> Result<(u32, u32), NoRange> {
    if !can_map_range() {
        return Err(NoRange::Unprivileged);
    }
    let start = |ids: Ids, own: u32, explicit: Option<u32>| {
        let map = std::fs::read_to_string(ids.map_file()).unwrap_or_default();
        choose_start(&map, own, explicit, ids).map_err(|why| match explicit {
            Some(_) => NoRange::Refused(why),
            None => NoRange::Unmapped(why),
        })
    };
    let uid = start(Ids::Uids, geteuid().as_raw(), options.map_root_uid);
    let gid = start(Ids::Gids, getegid().as_raw(), options.map_root_gid);
    match (uid, gid) {
        (Ok(uid), Ok(gid)) => Ok((uid, gid)),
        // A refusal wins: the flags asked for what cannot be.
        (Err(e @ NoRange::Refused(_)), _) | (_, Err(e @ NoRange::Refused(_))) => Err(e),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// The first of the [`RANGE_SIZE`] uids (or gids) to map, given the id map
/// of the namespace xfn starts in (`map`, as /proc/self/uid_map reads), xfn's
/// own id there, and the flag: the flag's start where those ids are all
/// mapped; without it, [`HOST_RANGE_START`] where mapped (a host), else 0
/// where xfn is 0 and 0..65535 are mapped (the root of a container's own
/// user namespace: a pod with `hostUsers: false`, which has exactly those);
/// else why none can be.
fn choose_start(map: &str, own: u32, explicit: Option<u32>, ids: Ids) -> Result<u32, String> {
    let name = ids.name();
    let span = |start: u32| {
        format!(
            "{name}s {start}-{}",
            u64::from(start) + u64::from(RANGE_SIZE) - 1
        )
    };
    let shown = format!("{}: {}", ids.map_file(), show_map(map));
    match explicit {
        Some(start) if map_covers(map, start, RANGE_SIZE) => Ok(start),
        Some(start) => Err(format!(
            "--map-root-{name} {start}: {} are not all mapped in the user namespace xfn starts in \
             ({shown}); give a start whose 65536 {name}s are, or leave the flag out to have xfn \
             choose",
            span(start)
        )),
        None if map_covers(map, HOST_RANGE_START, RANGE_SIZE) => Ok(HOST_RANGE_START),
        None if own == 0 && map_covers(map, 0, RANGE_SIZE) => Ok(0),
        None if map_covers(map, 0, RANGE_SIZE) => Err(format!(
            "{} are not mapped here ({shown}), and {} are, but xfn is {name} {own} there, not \
             0: it must be their first, as the owner of the cache and the gatekeeper (in a pod \
             with hostUsers: false, run it as the pod's root: runAsUser: 0, runAsGroup: 0)",
            span(HOST_RANGE_START),
            span(0)
        )),
        None => Err(format!(
            "neither {} (a host's) nor {} with xfn as 0 (a pod's with hostUsers: false) are \
             mapped in the user namespace xfn starts in ({shown})",
            span(HOST_RANGE_START),
            span(0)
        )),
    }
}

/// An id map on one line, for messages: `0 1000 65536; 65536 300000 1`.
fn show_map(map: &str) -> String {
    let lines: Vec<String> = map
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect();
    match lines.is_empty() {
        true => "empty".into(),
        false => lines.join("; "),
    }
}

/// `id` (an inside id of `map`) as the namespace above sees it.
fn map_outward(map: &str, id: u32) -> Option<u32> {
    let id = u64::from(id);
    map_extents(map)
        .find(|&(inside, _, len)| inside <= id && id < inside + len)
        .and_then(|(inside, outside, _)| u32::try_from(outside + id - inside).ok())
}

/// Enters a new user and mount namespace. Must be called while the process
/// is single-threaded. The namespace it returns is what `Runner::new` needs.
pub fn enter(options: &UsernsOptions) -> Result<Namespace, UsernsError> {
    if ENTERED.swap(true, Ordering::SeqCst) {
        return Err(UsernsError::AlreadyEntered);
    }
    let cgroups = CgroupSupport::detect();
    let outer_uid_map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let (own_uid, own_gid) = (geteuid().as_raw(), getegid().as_raw());
    let own = IdMapping::Own {
        uid: own_uid,
        gid: own_gid,
    };
    let (mapping, shared_uid, helpers) = match choose_range(options) {
        Ok((uid, gid)) => (IdMapping::Range { uid, gid }, None, None),
        Err(NoRange::Refused(why)) => return Err(UsernsError::RangeNotMapped(why)),
        Err(NoRange::Unmapped(why)) => {
            // E.g. root in a container whose own namespace maps fewer ids.
            tracing::warn!(%why, "xfn may map an id range, but none is mapped here: mapping only xfn's own ids");
            (own, Some(why), None)
        }
        Err(NoRange::Unprivileged) if !options.subordinate_ids => {
            (own, Some("--subids=off".to_string()), None)
        }
        Err(NoRange::Unprivileged) => match subids::detect(own_uid) {
            Ok(sub) => (
                IdMapping::Subordinate {
                    uid: own_uid,
                    gid: own_gid,
                    sub_uid: sub.uid,
                    sub_gid: sub.gid,
                    count: sub.count,
                },
                None,
                Some(sub),
            ),
            Err(why) => (own, Some(why), None),
        },
    };

    if mapping.maps_outer_root() && !has_effective(caps::Capability::CAP_SETFCAP) {
        return Err(UsernsError::NeedsSetfcap);
    }
    // From outside: inside, host root and other uids are both unmapped.
    let trusted = crate::image::store::trust::Trusted {
        own: own_uid,
        also: match mapping {
            IdMapping::Range { uid, .. } => Some(uid),
            _ => None,
        },
        unmapped: crate::image::store::trust::unmapped_owner(),
    };
    crate::image::store::trust::check_before_entering(&options.cache_dir, &trusted)
        .map_err(UsernsError::UnsafeCache)?;
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
            // Leaving host root made the kernel mark xfn not dumpable, so
            // the /proc files of the processes sharing its memory (each
            // run's own namespace maker, `nproc.rs`) belong to host root,
            // out of xfn's reach. xfn holds nothing of root's: it is as if
            // started as its host uid, which no function has.
            nix::sys::prctl::set_dumpable(true)
                .map_err(sys("stay dumpable as the range's root"))?;
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
        |source| UsernsError::CacheSettle {
            path: options.cache_dir.clone(),
            source,
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
        outer_uid_map,
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

/// Whether `[start, start + count)` is wholly covered by one line of an id
/// map (`/proc/self/uid_map`): only ids mapped here can be mapped below.
fn map_covers(map: &str, start: u32, count: u32) -> bool {
    let (start, count) = (u64::from(start), u64::from(count));
    // The ids usable here are the inside ones.
    map_extents(map).any(|(inside, _, len)| inside <= start && start + count <= inside + len)
}

/// The lines of an id map (`/proc/self/uid_map`): inside id, outside id,
/// count; malformed lines left out.
fn map_extents(map: &str) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    map.lines().filter_map(|line| {
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        match fields[..] {
            [inside, outside, len] => Some((inside, outside, len)),
            _ => None,
        }
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
    fn a_cache_that_cannot_be_settled_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let cache = file.join("cache");
        let err = crate::image::store::owners::settle(&cache, 1)
            .map_err(|source| UsernsError::CacheSettle {
                path: cache.clone(),
                source,
            })
            .unwrap_err();
        let text = crate::chain::one_line(&err);
        assert!(text.starts_with("cannot prepare the cache dir"), "{text}");
        assert!(text.contains("Not a directory"), "{text}");
    }

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

    const HOST: &str = "         0          0 4294967295\n";
    /// A pod with `hostUsers: false`: 65536 ids from an unprivileged base.
    const POD: &str = "         0  833617920      65536\n";

    #[test]
    fn without_flags_a_host_maps_the_range_above_its_users() {
        assert_eq!(choose_start(HOST, 0, None, Ids::Uids), Ok(HOST_RANGE_START));
        // Root or not: any process with CAP_SETUID on a host.
        assert_eq!(
            choose_start(HOST, 4321, None, Ids::Gids),
            Ok(HOST_RANGE_START)
        );
    }

    #[test]
    fn without_flags_the_root_of_a_pods_user_namespace_maps_all_of_the_pods_ids() {
        assert_eq!(choose_start(POD, 0, None, Ids::Uids), Ok(0));
        // The kernel maps a line of a child's map within one line of its
        // parent's: ids split over two lines cannot be mapped as one range.
        let split = "0 833617920 1\n1 833617921 65535\n";
        assert!(choose_start(split, 0, None, Ids::Gids).is_err());
    }

    #[test]
    fn without_flags_a_pods_non_root_user_is_told_to_run_as_the_pods_root() {
        let why = choose_start(POD, 65532, None, Ids::Uids).unwrap_err();
        assert!(
            why.contains("uids 100000-165535 are not mapped here"),
            "{why}"
        );
        assert!(
            why.contains("/proc/self/uid_map: 0 833617920 65536"),
            "{why}"
        );
        assert!(why.contains("xfn is uid 65532 there, not 0"), "{why}");
        assert!(why.contains("runAsUser: 0"), "{why}");
    }

    #[test]
    fn without_flags_a_namespace_of_fewer_ids_says_it_has_no_range() {
        for map in ["0 1000 1\n", "0 1000 65535\n", ""] {
            let why = choose_start(map, 0, None, Ids::Gids).unwrap_err();
            assert!(
                why.starts_with("neither gids 100000-165535 (a host's) nor gids 0-65535"),
                "{why}"
            );
            assert!(why.contains("/proc/self/gid_map: "), "{why}");
        }
        let why = choose_start("", 0, None, Ids::Gids).unwrap_err();
        assert!(why.ends_with("(/proc/self/gid_map: empty)"), "{why}");
    }

    #[test]
    fn a_flag_is_taken_where_its_range_is_mapped_and_refused_where_not() {
        assert_eq!(choose_start(HOST, 0, Some(200_000), Ids::Uids), Ok(200_000));
        assert_eq!(choose_start(POD, 0, Some(0), Ids::Uids), Ok(0));
        let why = choose_start(POD, 0, Some(100_000), Ids::Uids).unwrap_err();
        assert!(
            why.starts_with("--map-root-uid 100000: uids 100000-165535 are not all mapped"),
            "{why}"
        );
        assert!(
            why.contains("(/proc/self/uid_map: 0 833617920 65536)"),
            "{why}"
        );
        // The last id must exist too.
        let why = choose_start(HOST, 0, Some(u32::MAX - 10), Ids::Gids).unwrap_err();
        assert!(
            why.contains("gids 4294967285-4295032820 are not all"),
            "{why}"
        );
    }

    #[test]
    fn ids_are_seen_one_level_up_through_the_map() {
        assert_eq!(map_outward(POD, 0), Some(833_617_920));
        assert_eq!(map_outward(POD, 65535), Some(833_683_455));
        assert_eq!(map_outward(POD, 65536), None);
        assert_eq!(map_outward(HOST, 100_001), Some(100_001));
        assert_eq!(map_outward("0 1000 1\n1 200000 10\n", 3), Some(200_002));
        assert_eq!(map_outward("0 4294967290 10\n", 9), None, "past u32");
    }
}
