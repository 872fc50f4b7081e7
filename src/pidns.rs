//! A PID namespace of xfn's own, so that the kernel ends every container
//! of an xfn that dies, however it dies.
//!
//! Choice: **outside PID 1, `xfn start` and `xfn adapt` make themselves a
//! pod: a new PID namespace whose PID 1 is `pid1`'s init, with xfn as its
//! child**, entered right after the user and mount namespace (the PID
//! namespace must belong to xfn's user namespace for xfn to mount its
//! `proc`) and before the async runtime starts threads. When PID 1 of a
//! namespace exits, the kernel kills every process in it and in the
//! namespaces below it, the containers' own included; and the init exits
//! as soon as xfn does.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/pidns.rs`.
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
