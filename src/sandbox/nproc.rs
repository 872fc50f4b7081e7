//! A level of the kernel's process count that holds one run alone, for
//! `RLIMIT_NPROC` where no cgroup enforces `pids.max`.
//!
//! The kernel (5.14+, `kernel/ucount.c`) charges a task to its (user
//! namespace, uid) and to every ancestor namespace, each under the uid that
//! created the namespace below, and a fork fails (`EAGAIN`) past any level's
//! bound: its own level against the task's `RLIMIT_NPROC`, each higher one
//! against the `RLIMIT_NPROC` the namespace below was created with. crun
//! applies the spec's rlimits before it creates the run's namespace (it
//! must: only the initial namespace may raise a hard limit), so with crun
//! in xfn's namespace every run's tasks, whatever their uid, were charged
//! to (xfn's namespace, xfn's uid) against the run's 1024: one count shared
//! by all functions, which one fork bomb filled for all (issue 31).
//!
//! Choice: **crun runs in a user namespace of the run's own.** Before `crun
//! create`, xfn makes a namespace under its own (mapping every id it has
//! onto itself, created with xfn's limit) and crun joins it, so the run's
//! tasks are charged to (that namespace, xfn's id) against the spec's
//! limit: all of the run, every uid it switches to, and nothing of its
//! neighbours'; to xfn's level against xfn's own limit. The function's own
//! uid level still stops each of its uids at the limit. Where a cgroup
//! enforces `pids.max` the spec sets no `RLIMIT_NPROC` and nothing is made.
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// Errors of making a run's own level.
#[derive(Debug, thiserror::Error)]
pub enum NprocError {
    /// xfn's own id maps could not be read.
    #[error("cannot read {path}")]
    ReadMap {
        /// The map file.
        path: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// A step of making the namespace failed.
    #[error("cannot {what} for the run's own process count")]
    Sys {
        /// The step.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// The id maps of each run's own level: every id of xfn's namespace mapped
/// onto itself, read once at start.
#[derive(Debug, Clone)]
pub(crate) struct OwnIds {
    uid_map: String,
    gid_map: String,
}

impl OwnIds {
    /// The identity maps of what this process's user namespace maps.
    pub(crate) fn read() -> Result<Self, NprocError> {
        let read = |path: &'static str| {
            std::fs::read_to_string(path)
                .map(|map| identity(&map))
                .map_err(|source| NprocError::ReadMap { path, source })
        };
        Ok(Self {
            uid_map: read("/proc/self/uid_map")?,
            gid_map: read("/proc/self/gid_map")?,
        })
    }
}

/// Each line of an id map (`inside outside count`) as `inside inside
/// count`: the same ids, each mapped onto itself.
fn identity(map: &str) -> String {
    map.lines()
        .filter_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [inside, _, count] => Some(format!("{inside} {inside} {count}\n")),
                _ => None,
            },
        )
        .collect()
}

/// A new user namespace under this process's, mapping `ids`, created with
/// this process's `RLIMIT_NPROC`: a descriptor of it, for `setns`.
pub(crate) fn run_level(ids: &OwnIds) -> Result<OwnedFd, NprocError> {
    let sys = |what| move |source| NprocError::Sys { what, source };
    extern "C" fn wait_for_kill(_: *mut libc::c_void) -> libc::c_int {
        // Killed below, the only way it ends.
        loop {
            // SAFETY: a system call, touching no memory.
            unsafe { libc::pause() };
        }
    }
    const STACK: usize = 16 << 10;
    let mut stack = vec![0u8; STACK];
    // SAFETY: the child runs `wait_for_kill` on a stack of its own (the top
    // of `stack`, 16-byte aligned, alive until the child is reaped below,
    // on every path) and touches no other memory. CLONE_FILES: it holds no
    // copy of any descriptor (so no fork lock is needed); CLONE_VM: no page
    // tables copied. SIGCHLD makes it an ordinary child to wait for.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(STACK) as usize & !15;
        libc::clone(
            wait_for_kill,
            top as *mut libc::c_void,
            libc::CLONE_NEWUSER | libc::CLONE_VM | libc::CLONE_FILES | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    if pid < 0 {
        return Err(sys("create a user namespace")(
            std::io::Error::last_os_error(),
        ));
    }
    let made = (|| {
        let proc = format!("/proc/{pid}");
        std::fs::write(format!("{proc}/uid_map"), &ids.uid_map)
            .map_err(sys("write its uid map"))?;
        std::fs::write(format!("{proc}/gid_map"), &ids.gid_map)
            .map_err(sys("write its gid map"))?;
        let path = CString::new(format!("{proc}/ns/user"))
            .map_err(|e| sys("name its namespace")(std::io::Error::other(e)))?;
        // SAFETY: a C string that outlives the call.
        let fd: RawFd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(sys("open its namespace")(std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })();
    let child = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    while let Err(nix::Error::EINTR) = nix::sys::wait::waitpid(child, None) {}
    drop(stack);
    made
}

/// Starts `program` with `args` in the user namespace `level` (a
/// [`run_level`]), its stdin, stdout and stderr being `stdio`, with this
/// process's environment: a pidfd of it, unreaped. std's `Command` could
/// `setns` only in a `pre_exec`, which makes it fork, copying this
/// process's page tables: measured here from a process with a 16 MiB heap
/// and 4 threads, 3.6 to 7 ms a spawn where `posix_spawn` took 0.9 ms;
/// this child shares the memory instead (`clone_vforked`), 0.8 ms. Making
/// the level ([`run_level`]) took 0.18 to 0.23 ms.
pub(crate) fn spawn_in(
    level: BorrowedFd<'_>,
    program: &Path,
    args: &[&OsStr],
    stdio: [OwnedFd; 3],
) -> std::io::Result<OwnedFd> {
    let c = |bytes: &[u8]| CString::new(bytes).map_err(std::io::Error::other);
    let program = c(program.as_os_str().as_bytes())?;
    let argv: Vec<CString> = std::iter::once(Ok(program.clone()))
        .chain(args.iter().map(|arg| c(arg.as_bytes())))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = std::env::vars_os()
        .map(|(key, value)| c(&[key.as_bytes(), b"=", value.as_bytes()].concat()))
        .collect::<Result<_, _>>()?;
    let pointers = |strings: &[CString]| {
        let mut pointers: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        pointers
    };
    let (argv_p, envp_p) = (pointers(&argv), pointers(&envp));
    let fds = stdio.each_ref().map(|fd| fd.as_raw_fd());
    let level = level.as_raw_fd();
    let failure = AtomicI32::new(0);
    let pid = crate::fork_lock::clone_vforked(|| {
        let fail = || {
            failure.store(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
                Ordering::Relaxed,
            );
            127
        };
        // SAFETY: system calls on descriptors and C strings the caller
        // keeps alive until this child has exec'd (CLONE_VFORK); the
        // signal set lives on this child's stack.
        unsafe {
            if libc::setns(level, libc::CLONE_NEWUSER) != 0 {
                return fail();
            }
            // As std's spawn leaves them: no signal blocked, SIGPIPE (which
            // Rust ignores) back to its default.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            for (target, fd) in (0..).zip(fds) {
                let done = if fd == target {
                    libc::fcntl(fd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, target)
                };
                if done < 0 {
                    return fail();
                }
            }
            libc::execve(argv_p[0], argv_p.as_ptr(), envp_p.as_ptr());
        }
        fail()
    })?;
    drop(stdio);
    let errno = failure.load(Ordering::Relaxed);
    if errno != 0 {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    // Unreaped, so the pid still names it, whether or not it has exited.
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| std::io::Error::other("clone returned no pid"))?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::identity;

    #[test]
    fn each_run_level_maps_every_id_of_xfns_namespace_onto_itself() {
        assert_eq!(
            identity("         0     100000      65536\n"),
            "0 0 65536\n"
        );
        assert_eq!(
            identity("         0      65532          1\n         1    2000000      65536\n"),
            "0 0 1\n1 1 65536\n"
        );
        assert_eq!(identity(""), "");
    }
}
