//! xfn as PID 1 of its container (the sidecar in a pod, `podman run`).
//!
//! PID 1 has two duties no other process has. Orphans are reparented to
//! it, and only it can reap them: `crun create` exits and leaves its
//! container's init to PID 1 (the seccomp probe at start does that), a
//! `crun run` killed on a timeout leaves its container's processes, an
//! id-map helper or a render keeper whose parent went away. Unreaped, each
//! stays a zombie for the life of the pod, holding a pid of the container's
//! pids limit. And the kernel delivers to PID 1 only the signals it has a
//! handler for, even from outside its namespace.
//!
//! Choice: **when xfn starts as PID 1 it forks first thing; the parent
//! stays PID 1 as a tiny init, the child is xfn.** The init blocks the
//! signals it handles, forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1
//! and SIGUSR2 to xfn (so SIGTERM still reaches xfn's drain), reaps every
//! child with `waitpid(-1)` whenever SIGCHLD is pending, and exits with
//! xfn's status (128 + the signal when a signal ended it) as soon as xfn is
//! gone: PID 1 exiting makes the kernel kill whatever else is left in the
//! namespace.
//!
//! Why not reap everything in xfn itself (a SIGCHLD handler or a thread
//! calling `waitpid(-1)`): it would take the exit statuses of the children
//! xfn waits for by pid — crun's exit code, a `Command::status()` that then
//! fails with ECHILD. `xfn start` with warm containers is a child subreaper
//! (`lifecycle/pool.rs`), because it needs its created containers' exit
//! codes, and reaps only orphaned *container* inits, by pid; orphans below
//! it go to it, not to PID 1. The init takes the rest: orphans when xfn is
//! no subreaper (`--warm-pool 0`, copy mode, `xfn run`, `render`, `adapt`
//! as a Function's main process), and xfn itself. Why not tini or
//! dumb-init in the image: one more binary to pin, and an `ENTRYPOINT`
//! users override; this works under any runtime, with its `--init` or
//! without. Why first thing in `main`: the process is single-threaded then
//! (the child runs ordinary Rust code after the fork), and everything xfn
//! sets up afterwards — the gatekeeper, its user namespace, its runs —
//! belongs to the child. The init costs one sleeping process and nothing
//! per call. Outside PID 1, `xfn start` and `xfn adapt` make a PID
//! namespace of their own with this init as its PID 1 (`crate::pidns`);
//! `xfn run` and `render` are left as they are.
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, getpid, ForkResult, Pid};

/// What the init passes on to xfn.
const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Set once an init of this module supervises xfn: PID 1 of xfn's PID
/// namespace is then that init, and the namespace ends with xfn.
static UNDER_INIT: AtomicBool = AtomicBool::new(false);

/// When this process is PID 1, forks: returns in the child (xfn goes on),
/// while the parent becomes the init and never returns. Otherwise returns
/// at once. Must be called before any thread is started.
pub(crate) fn init_if_pid1() {
    if getpid().as_raw() != 1 {
        return;
    }
    match fork_under_supervisor() {
        Ok(()) => UNDER_INIT.store(true, Ordering::SeqCst),
        // xfn still works as PID 1 without an init; only orphans stay.
        Err(err) => {
            eprintln!("xfn: cannot fork an init as PID 1 ({err}); orphans will not be reaped")
        }
    }
}

/// Whether xfn runs under an init of this module ([`init_if_pid1`]).
pub(crate) fn under_init() -> bool {
    UNDER_INIT.load(Ordering::SeqCst)
}

/// Forks: returns in the child, while the parent becomes its supervisor
/// and never returns. The supervisor forwards [`FORWARDED`] signals to the
/// child, reaps every child of its own and exits with the child's status
/// (128 + the signal when a signal ended it) once the child is gone. It
/// keeps only stdin, stdout and stderr open: a listening socket xfn closes
/// to stop taking callers must not stay open in it. Must be called while
/// the process has a single thread.
pub(crate) fn fork_under_supervisor() -> nix::Result<()> {
    let mut handled = SigSet::empty();
    for signal in FORWARDED {
        handled.add(signal);
    }
    handled.add(Signal::SIGCHLD);
    // Blocked before the fork, so that no signal and no child's exit can
    // arrive between the fork and the supervisor's first wait.
    let previous = handled.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
    // The parent only waits from here on: the start-up's pages can go
    // (crate::resident). Before the fork, not after: under `xfn::pidns`
    // the child, PID 1 of a new namespace, mounts that namespace's `proc`
    // on the `/proc` the parent shares, and from then on the parent's
    // `/proc/self` names nobody, so a release after the fork read no
    // `smaps` whenever the child won the race (the supervisor then kept
    // ~10 MB of start-up pages for its whole life). The child faults back
    // what the rest of its start-up runs.
    crate::resident::release_file_pages();
    // SAFETY: callers run this while xfn has a single thread (first thing
    // in main, or before the async runtime starts), so the child may run
    // ordinary Rust code (no lock can be held by a thread that does not
    // exist in the child); the parent only closes descriptors, waits for
    // signals, reaps and forwards.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = previous.thread_set_mask();
            Ok(())
        }
        Ok(ForkResult::Parent { child }) => {
            close_all_but_stdio();
            std::process::exit(supervise(child, &handled))
        }
        Err(err) => {
            let _ = previous.thread_set_mask();
            Err(err)
        }
    }
}

/// Closes every descriptor above stderr (`close_range(2)`).
fn close_all_but_stdio() {
    // SAFETY: close_range takes plain integers and only closes descriptors
    // of this process; the supervisor owns no Rust object that uses them.
    unsafe { libc::close_range(3, libc::c_uint::MAX, 0) };
}

/// The init's loop: forwards signals to `xfn`, reaps every child, and
/// returns xfn's exit code once it is gone.
fn supervise(xfn: Pid, handled: &SigSet) -> i32 {
    loop {
        match handled.wait() {
            Ok(Signal::SIGCHLD) => {
                if let Some(code) = reap_all(xfn) {
                    return code;
                }
            }
            Ok(signal) => {
                let _ = kill(xfn, signal);
            }
            Err(_) => {}
        }
    }
}

/// Reaps every child that has exited (SIGCHLDs coalesce: one may stand for
/// many); xfn's exit code when xfn was one of them.
fn reap_all(xfn: Pid) -> Option<i32> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == xfn => return Some(code),
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == xfn => {
                return Some(128 + signal as i32)
            }
            Ok(WaitStatus::StillAlive) => return None,
            Ok(_) | Err(Errno::EINTR) => continue,
            // ECHILD: no children at all, so xfn is gone too.
            Err(Errno::ECHILD) => return Some(1),
            Err(_) => return None,
        }
    }
}
