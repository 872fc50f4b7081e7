//! Being told when a process exits: its pidfd turns readable at its exit,
//! and the async runtime wakes whoever waits on it (no polling, no timer).
//! A watch is a duplicate of the pidfd, so it can be waited on apart from
//! whoever holds (and reaps) the process: a watch never reaps.
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Wakes its waiters once the process of a pidfd has exited. Cheap to
/// clone: clones share one registration.
#[derive(Debug, Clone)]
pub(crate) struct ExitWatch(Arc<AsyncFd<OwnedFd>>);

impl ExitWatch {
    /// A watch on the process of `pidfd` (duplicated: the caller keeps
    /// its own). Needs a tokio runtime.
    pub(crate) fn new(pidfd: BorrowedFd<'_>) -> io::Result<Self> {
        let owned = pidfd.try_clone_to_owned()?;
        // SAFETY: `owned` is an open descriptor the AsyncFd takes ownership
        // of: it stays open, naming the same pidfd, until the AsyncFd drops
        // it, and `as_raw_fd` on an `OwnedFd` always returns that one.
        let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self(Arc::new(fd)))
    }

    /// Returns once the process has exited (at once if it had).
    pub(crate) async fn exited(&self) -> io::Result<()> {
        loop {
            let mut ready = self.0.readable().await?;
            if self.has_exited()? {
                return Ok(());
            }
            // Readiness the runtime reported for nothing: wait for the next.
            ready.clear_ready();
        }
    }

    /// Whether the process has exited, now (a poll that does not wait).
    pub(crate) fn has_exited(&self) -> io::Result<bool> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::from_borrowed_fd(
            self.0.get_ref().as_fd(),
            PollFlags::IN,
        )];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        poll(&mut fds, Some(&zero))?;
        Ok(fds[0].revents().contains(PollFlags::IN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[tokio::test]
    async fn a_watch_wakes_when_its_process_exits_and_not_before() {
        let mut child = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let watch = ExitWatch::new(pidfd.as_fd()).unwrap();
        let mut exited = Box::pin(watch.exited());
        // `cat` waits on its stdin: the watch has nothing to tell.
        assert!(futures::poll!(&mut exited).is_pending());
        assert!(!watch.clone().has_exited().unwrap());
        // Its stdin closed, it exits, and the watch is woken by the pidfd
        // (a bound on the wait only so that a broken watch fails the test
        // rather than hanging it).
        drop(child.stdin.take());
        tokio::time::timeout(std::time::Duration::from_secs(60), exited)
            .await
            .expect("the watch was never woken")
            .unwrap();
        assert!(watch.has_exited().unwrap());
        // A watch never reaps: the exit code is still the owner's to take.
        assert!(child.wait().unwrap().success());
    }
}
