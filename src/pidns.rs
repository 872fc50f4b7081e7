//! A PID namespace of xfn's own, so that the kernel ends every container
//! of an xfn that dies, however it dies.
//!
//! The problem: `xfn start` keeps warm containers (`lifecycle/pool.rs`),
//! each an init that `crun create` left blocked on crun's `exec.fifo` until
//! a call starts it, and every xfn server has cold runs (`crun run` and
//! its container) in flight. A SIGTERM removes them all, but nothing runs
//! in a SIGKILLed xfn (the kubelet after its grace, the OOM killer, a CI
//! timeout, `kill -9`): in a pod the pod ends with it, but on a laptop, in
//! CI or under a systemd unit its waiting containers stayed blocked for
//! ever, and its cold runs' functions ran on with no timeout, until another
//! xfn on the same cache swept them, if one ever started.
//!
//! Choice: **outside PID 1, `xfn start` and `xfn adapt` make themselves a
//! pod: a new PID namespace whose PID 1 is `pid1`'s init, with xfn as its
//! child**, entered right after the user and mount namespace (the PID
//! namespace must belong to xfn's user namespace for xfn to mount its
//! `proc`) and before the async runtime starts threads. When PID 1 of a
//! namespace exits, the kernel kills every process in it and in the
//! namespaces below it, the containers' own included; and the init exits
//! as soon as xfn does. Three processes, two of them tiny and asleep:
//!
//! - the one that was started (the pid a supervisor, a test or a shell
//!   knows) stays outside as a supervisor: it passes signals on, and exits
//!   with xfn's status;
//! - the init, PID 1 inside, reaps orphans as in a pod; it dies with the
//!   supervisor (a parent-death SIGKILL, which the kernel delivers to a
//!   namespace's init from the namespace above), so killing the process
//!   that was started ends everything;
//! - xfn, with a `proc` of the namespace mounted on `/proc` in its own mount
//!   namespace: crun, which runs there too, writes container pids as the
//!   namespace numbers them and reads `/proc/<pid>` with them, and xfn's
//!   pidfds, pid files and `/proc/self` reads must agree with it.
//!
//! The gatekeeper (`server::gate`) is forked earlier and stays in the
//! host's namespaces: it still sees callers' real uids and pids, and
//! functions, now two PID namespaces below it, still as containers. As PID
//! 1 already (a container's main process, `pid1`), nothing is done: the
//! container's own namespace ends with xfn's init.
//!
//! Why not the alternatives. A parent-death signal on each container's
//! init: crun offers none, and its parent (`crun create`) exits at once.
//! Keeping xfn outside with only its children inside (`unshare(CLONE_NEWPID)`
//! and forking a sentinel PID 1): orphaned container inits would go to the
//! sentinel, not to xfn, which reaps them for their exit codes, and pids
//! would differ between xfn and crun. xfn itself as PID 1 of the namespace
//! (two processes, not three): PID 1 never dies of a signal it has no
//! handler for, so a SIGTERM before tokio's handler is installed would be
//! lost, and it would inherit every orphan, the very duties `pid1` keeps
//! out of xfn. A cgroup to kill: nothing is left to kill it once xfn is
//! dead, and most hosts give xfn no cgroup of its own.
use std::os::fd::OwnedFd;

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;

/// Errors of entering xfn's own PID namespace.
#[derive(Debug, thiserror::Error)]
pub enum PidnsError {
    /// The kernel refused a new PID namespace: nothing changed, xfn can go
    /// on as before (its containers then outlive a SIGKILL).
    #[error("cannot create a PID namespace")]
    Unavailable(#[source] nix::Error),
    /// A step after the namespace was created failed.
    #[error("cannot {what} for xfn's PID namespace")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The errno.
        source: nix::Error,
    },
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> PidnsError {
    move |source| PidnsError::Sys { what, source }
}

/// What [`enter`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    /// xfn now runs under an init of its own namespace.
    Own,
    /// xfn was PID 1 of its container already: its namespace ends with it.
    AlreadyPid1,
}

/// Moves xfn under PID 1 of a new PID namespace (see the module doc).
/// Returns in xfn; the process that called it stays behind as xfn's
/// supervisor and never returns. Must be called after entering the user
/// and mount namespace, while the process has a single thread.
pub fn enter() -> Result<Entered, PidnsError> {
    if crate::pid1::under_init() || nix::unistd::getpid().as_raw() == 1 {
        return Ok(Entered::AlreadyPid1);
    }
    // Opened before the fork: the init must find out whether the supervisor
    // died before its parent-death signal was armed.
    let supervisor = rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|e| sys("open a pidfd of xfn")(nix::Error::from_raw(e.raw_os_error())))?;
    unshare(CloneFlags::CLONE_NEWPID).map_err(PidnsError::Unavailable)?;
    // The first child is PID 1 of the new namespace. From here on this
    // process may fork nothing else: it becomes the supervisor.
    crate::pid1::fork_under_supervisor().map_err(sys("fork PID 1"))?;
    become_init(supervisor)?;
    // PID 1 (the init) forks xfn and stays behind.
    crate::pid1::init_if_pid1();
    Ok(Entered::Own)
}

/// In PID 1 of the new namespace, before it forks xfn: dies with the
/// supervisor, and mounts the namespace's `proc`.
fn become_init(supervisor: OwnedFd) -> Result<(), PidnsError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys("arm the parent-death signal"))?;
    if exited(&supervisor) {
        // Killed before the signal was armed: nobody is left to serve.
        std::process::exit(1);
    }
    drop(supervisor);
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(sys("mount /proc"))
}

/// Whether the process of `pidfd` has exited (a pidfd polls readable then).
fn exited(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    // A zero timeout: a look, never a wait.
    poll(&mut fds, Some(&Timespec::default())).is_ok_and(|ready| ready > 0)
}
