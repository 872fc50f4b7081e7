//! No child process is forked while this process has a file that may be
//! executed open for writing.
//!
//! The race: copy mode writes each run's copy of its image (`rootfs::copy`)
//! while other calls spawn crun. A fork copies every descriptor, the
//! close-on-exec ones included, and the child holds them until its exec
//! closes them. If a run's copy of its function's executable is open for
//! writing at that moment, the forked child holds a writer too; should the
//! run get to exec that file before the child execs crun (on two busy
//! cores, easily), the kernel refuses the exec with `ETXTBSY` ("Text file
//! busy"). Seen with 20 concurrent runs in copy mode
//! (`tests/run_runner.rs`).
//!
//! Choice: **a process-wide read-write lock, as Go's `syscall.ForkLock`.**
//! A writer of a file that may be executed holds it shared from opening the
//! file until its last descriptor is closed ([`writing_executable`]); every
//! spawn holds it exclusively until the child has exec'd ([`spawn`],
//! [`spawn_async`]: std's spawn returns only then, its child reporting
//! exec through a close-on-exec pipe, or with `posix_spawn` the parent
//! waiting for it). So no child ever starts with such a descriptor, and
//! writers never wait for each other.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/fork_lock.rs`.
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static FORK_LOCK: RwLock<()> = RwLock::new(());

/// Held while a file that may be executed is open for writing: no child is
/// spawned meanwhile. Drop it after the file's last descriptor is closed.
#[derive(Debug)]
pub(crate) struct WritingExecutable {
    _shared: RwLockReadGuard<'static, ()>,
}

/// Takes the fork lock shared, for writing a file that may be executed.
pub(crate) fn writing_executable() -> WritingExecutable {
    WritingExecutable {
        // Poisoned only by a panic while it was held; the lock guards no
        // data, so it is as good as ever.
        _shared: FORK_LOCK.read().unwrap_or_else(|e| e.into_inner()),
    }
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    FORK_LOCK.write().unwrap_or_else(|e| e.into_inner())
}

/// `command.spawn()`, with no executable open for writing in this process.
pub(crate) fn spawn(command: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    let _exclusive = exclusive();
    command.spawn()
}

/// [`spawn`] for tokio's `Command`, whose `spawn` is std's underneath (it
/// returns once the child has exec'd, and never awaits).
pub(crate) fn spawn_async(
    command: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let _exclusive = exclusive();
    command.spawn()
}

/// Runs `child` in a child process that never execs, and waits for it:
/// its exit status is what `child` returns. The child shares this
/// process's memory (`CLONE_VM | CLONE_VFORK`: no page tables copied, the
/// calling thread suspended until it exits) while the other threads run
/// on, so `child` may only make system calls: no allocation, no locks, no
/// writes to memory. It has its own copy of the descriptor table and of
/// the filesystem context, so it may enter namespaces (`setns` of a user
/// namespace wants a caller alone in its thread group and its `fs`). The
/// lock is held until it is gone, as it holds copies of every descriptor.
pub(crate) fn run_forked<F: FnOnce() -> i32>(child: F) -> std::io::Result<i32> {
    use nix::sys::wait::{waitpid, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(clone_vforked(child)?);
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => return Ok(128 + signal as i32),
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// Starts `child` as [`run_forked`] does, and returns its pid once it has
/// exec'd or exited (`CLONE_VFORK`), unreaped: a spawn that does more
/// between fork and exec than std's `Command` can without copying this
/// process's page tables (`sandbox/nproc.rs`: a `setns`). The same rules
/// hold for `child`: system calls only.
pub(crate) fn clone_vforked<F: FnOnce() -> i32>(child: F) -> std::io::Result<i32> {
    extern "C" fn trampoline<F: FnOnce() -> i32>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `Option<F>` below, alive until `clone`
        // returns, which is after this child exits or execs (CLONE_VFORK).
        let child = unsafe { &mut *(arg as *mut Option<F>) };
        child.take().map_or(1, |child| child())
    }
    const STACK: usize = 64 << 10;
    let mut stack = vec![0u8; STACK];
    let mut child = Some(child);
    let _exclusive = exclusive();
    // SAFETY: the child runs `trampoline` on a stack of its own (the top of
    // `stack`, 16-byte aligned, valid until `clone` returns), touching only
    // `child`, which makes system calls; SIGCHLD makes it an ordinary child
    // to wait for.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(STACK) as usize & !15;
        libc::clone(
            trampoline::<F>,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut child as *mut Option<F>).cast(),
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid)
}

/// `command.status()` through [`spawn`] (stdio inherited unless set).
pub(crate) fn status(
    command: &mut std::process::Command,
) -> std::io::Result<std::process::ExitStatus> {
    spawn(command)?.wait()
}

/// `command.output()` through [`spawn`]: stdout and stderr captured, stdin
/// from /dev/null unless set.
pub(crate) fn output(command: &mut std::process::Command) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    spawn(command)?.wait_with_output()
}

/// [`output`] for tokio's `Command`.
pub(crate) async fn output_async(
    command: &mut tokio::process::Command,
) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    spawn_async(command)?.wait_with_output().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_spawn_while_an_executable_is_written_and_writers_share() {
        let writing = writing_executable();
        // A spawn's exclusive hold cannot be had while the file is open...
        assert!(matches!(
            FORK_LOCK.try_write(),
            Err(std::sync::TryLockError::WouldBlock)
        ));
        // ...while another writer goes ahead.
        let other = std::thread::spawn(|| FORK_LOCK.try_read().is_ok());
        assert!(other.join().unwrap());
        drop(writing);
        // Closed: spawns proceed.
        assert!(status(&mut std::process::Command::new("true"))
            .unwrap()
            .success());
    }
}
