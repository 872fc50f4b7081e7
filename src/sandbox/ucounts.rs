//! Bounding the kernel's per-uid counts that functions share.
//!
//! Choice: **two levels.** At entry xfn bounds its own namespace to half of
//! each host limit, so all functions together leave the other half to the
//! host's processes of that uid (the gatekeeper, the supervisor). Each run
//! has a user namespace of its own, and xfn bounds it to an eighth of the
//! host limit right after `crun create`, before the function execs, so one
//! function leaves the rest to its neighbours. crun cannot do it (it
//! refuses `user.*` in the spec's `sysctl`: "not namespaced"), and xfn's
//! threads cannot enter the run's namespace (`setns` of a user namespace
//! wants a single-threaded caller), so a child that never execs
//! (`fork_lock::run_forked`: it shares xfn's memory, so it costs tens of
//! microseconds where a fork of the daemon took a millisecond or more)
//! enters it and writes the limits, as owner of that namespace (crun made
//! it as xfn's uid), with every capability in it. (`setns` must be in the
//! runner's seccomp profile for this: seccomp/runner.json allows it.)
//!
//! Epoll watches are counted per host uid, not per namespace: this cannot
//! bound them.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/sandbox/ucounts.rs`.
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Each count bounded: its name under `/proc/sys/user/`, and the host
/// sysctl that bounds it per host uid.
const COUNTS: [(&str, &str); 4] = [
    (
        "max_inotify_instances",
        "/proc/sys/fs/inotify/max_user_instances",
    ),
    (
        "max_inotify_watches",
        "/proc/sys/fs/inotify/max_user_watches",
    ),
    (
        "max_fanotify_groups",
        "/proc/sys/fs/fanotify/max_user_groups",
    ),
    ("max_fanotify_marks", "/proc/sys/fs/fanotify/max_user_marks"),
];

/// All functions together: this share of each host limit.
const OWN_SHARE: u64 = 2;
/// One run: this share of each host limit.
const RUN_SHARE: u64 = 8;

/// The limits set, read from the host's at entry.
#[derive(Debug, Clone, Default)]
pub(crate) struct UcountLimits {
    /// `(path under /proc/sys/user, value)` for xfn's namespace.
    own: Vec<(CString, CString)>,
    /// The same for each run's.
    run: Vec<(CString, CString)>,
}

impl UcountLimits {
    /// Reads the host's per-uid limits (any namespace sees them) and
    /// derives xfn's and each run's; a count the kernel lacks is left out.
    pub(crate) fn from_host() -> Self {
        let mut limits = Self::default();
        for (name, host) in COUNTS {
            let Some(host) = std::fs::read_to_string(host)
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
            else {
                continue;
            };
            let path = format!("/proc/sys/user/{name}");
            let entry = |share: u64| {
                let value = (host / share).max(1).to_string();
                // Neither holds a NUL: a fixed path and digits.
                CString::new(path.clone())
                    .ok()
                    .zip(CString::new(value).ok())
            };
            limits.own.extend(entry(OWN_SHARE));
            limits.run.extend(entry(RUN_SHARE));
        }
        limits
    }

    /// Bounds the namespace this process is in (xfn's, just entered: it
    /// holds every capability there). Returns the counts it could not
    /// bound, with why.
    pub(crate) fn bound_own(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for (path, value) in &self.own {
            if let Err(err) = std::fs::write(path.to_string_lossy().as_ref(), value.as_bytes()) {
                failed.push(format!("{}: {err}", path.to_string_lossy()));
            }
        }
        failed
    }

    /// Bounds the user namespace of the process behind `pidfd` (a created
    /// container's init, blocked before the function's exec).
    pub(crate) fn bound_run(&self, pidfd: BorrowedFd<'_>) -> std::io::Result<()> {
        if self.run.is_empty() {
            return Ok(());
        }
        let fd = pidfd.as_raw_fd();
        let run = &self.run;
        let code = crate::fork_lock::run_forked(|| {
            // SAFETY: system calls on a descriptor and C strings that
            // outlive the child; nothing allocates.
            unsafe {
                if libc::setns(fd, libc::CLONE_NEWUSER) != 0 {
                    return 1;
                }
                for (path, value) in run {
                    let file = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if file < 0 {
                        return 2;
                    }
                    let bytes = value.as_bytes();
                    let written = libc::write(file, bytes.as_ptr().cast(), bytes.len());
                    libc::close(file);
                    if written != bytes.len() as isize {
                        return 3;
                    }
                }
            }
            0
        })?;
        match code {
            0 => Ok(()),
            1 => Err(std::io::Error::other(
                "cannot enter the run's user namespace",
            )),
            _ => Err(std::io::Error::other(
                "cannot write the run's /proc/sys/user limits",
            )),
        }
    }
}
