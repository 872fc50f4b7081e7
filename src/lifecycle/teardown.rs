//! Teardown: what is left of a container (its held namespaces, crun's
//! state, cgroup and bundle: [`Finished`]; then its rootfs and its image's
//! pin: [`Remains`](super::seam::Remains)) is removed in that order, off
//! the async threads, one way for every path: [`Teardown::drop_later`].
//! A call awaits its own teardown on the blocking threads
//! ([`Teardown::inline`]); the pool's run
//! on a thread of their own at `SCHED_IDLE`, when a CPU has nothing better
//! to do, not in the middle of the next call ([`Teardown::start`]).
//!
//! Only the teardown runs at idle priority: a policy is inherited by child
//! processes, `crun create`'s child becomes the function, and an
//! unprivileged process cannot leave `SCHED_IDLE` (docs/design.md, "Warm
//! containers"). `sched_setscheduler(0, …)` applies to the calling thread
//! alone, so the async threads keep their policy.
//!
//! # Bounded
//! At most [`MAX_QUEUED`] teardowns wait for the idle thread (which, on a
//! saturated machine, may wait long); past that one runs on tokio's
//! blocking threads at normal priority, so a busy daemon never piles up
//! mounts and state.
use std::future::Future;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use super::Parts;
use crate::sandbox::bundle::Bundle;
use crate::sandbox::cgroup::run::RunCgroup;
use crate::sandbox::Crun;

/// Teardowns waiting for the idle thread at most; more run at normal
/// priority.
pub(crate) const MAX_QUEUED: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// The idle-priority teardown thread, started with the pool. It ends when
/// this is dropped, after the teardowns queued.
#[derive(Debug)]
pub(crate) struct Teardown {
    sender: Option<Mutex<mpsc::Sender<Job>>>,
    queued: Arc<AtomicUsize>,
}

impl Teardown {
    /// Starts the thread; without one (the spawn failed) every teardown
    /// runs on the blocking threads.
    pub(crate) fn start() -> Self {
        let (sender, receiver) = mpsc::channel::<Job>();
        let queued = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&queued);
        let spawned = std::thread::Builder::new()
            .name("xfn-teardown".into())
            .spawn(move || {
                if let Err(err) = lower_own_priority() {
                    tracing::debug!(%err, "teardowns run at normal priority");
                }
                for job in receiver {
                    // Counted while it waits, not while it runs.
                    counted.fetch_sub(1, Ordering::AcqRel);
                    job();
                }
            });
        if let Err(err) = &spawned {
            tracing::warn!(%err, "no teardown thread: teardowns run at normal priority");
        }
        Self {
            sender: spawned.is_ok().then(|| Mutex::new(sender)),
            queued,
        }
    }

    /// No thread: every teardown runs on tokio's blocking threads at
    /// normal priority (a call that awaits its own teardown).
    pub(crate) fn inline() -> Self {
        Self {
            sender: None,
            queued: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Drops `remains` off the async threads, on the idle thread unless
    /// [`MAX_QUEUED`] already wait there; the future resolves once it is
    /// dropped (or the thread is gone).
    pub(crate) fn drop_later<T: Send + 'static>(
        &self,
        remains: T,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let job: Job = Box::new(move || {
            drop(remains);
            let _ = done.send(());
        });
        let job = match &self.sender {
            Some(sender) if self.queued.fetch_add(1, Ordering::AcqRel) < MAX_QUEUED => {
                let sender = sender.lock().unwrap_or_else(|e| e.into_inner());
                match sender.send(job) {
                    Ok(()) => None,
                    Err(mpsc::SendError(job)) => {
                        self.queued.fetch_sub(1, Ordering::AcqRel);
                        Some(job)
                    }
                }
            }
            Some(_) => {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                Some(job)
            }
            None => Some(job),
        };
        if let Some(job) = job {
            tokio::task::spawn_blocking(job);
        }
        async move {
            let _ = finished.await;
        }
    }
}

/// What is left of a container once it ran: its crun state, cgroup and
/// bundle, removed when dropped (blocking: drop it off the async threads).
#[derive(Debug)]
pub(crate) struct Finished {
    namespaces: HeldNamespaces,
    crun: Crun,
    id: String,
    run_cgroup: Option<RunCgroup>,
    _bundle: Bundle,
}

impl Drop for Finished {
    fn drop(&mut self) {
        // The namespaces first: their mounts go before the rootfs under
        // them is unmounted on xfn's side.
        drop(std::mem::take(&mut self.namespaces));
        self.crun.forget(&self.id);
        // Then the cgroup (it waits for killed processes to leave) and the
        // bundle, in field order.
        drop(self.run_cgroup.take());
    }
}

impl Parts {
    /// The init is reaped (or killed and reaped here): what is left is
    /// crun's state, the cgroup and the bundle, for the caller to drop off
    /// the reply path.
    pub(crate) fn finish(self) -> Finished {
        let Self {
            init,
            namespaces,
            mut guard,
            run_cgroup,
            bundle,
            ..
        } = self;
        drop(init);
        guard.armed = false;
        Finished {
            namespaces,
            crun: guard.crun.clone(),
            id: guard.id.clone(),
            run_cgroup,
            _bundle: bundle,
        }
    }
}

/// The namespaces of a container whose exit would tear them down on a
/// call's path, held open until its teardown (docs/design.md, "Container lifecycle").
#[derive(Debug, Default)]
pub(super) struct HeldNamespaces {
    _fds: Vec<OwnedFd>,
}

impl HeldNamespaces {
    /// The namespaces held: those whose last process's exit does work the
    /// reply would wait for or share its CPUs with.
    const KINDS: [&'static str; 3] = ["mnt", "ipc", "net"];

    /// Opens the namespaces of the process `pid` (an unreaped child of
    /// this process, in this process's `/proc`); those that do not open
    /// are left to end with it.
    pub(super) fn of(pid: i32) -> Self {
        let mut held = Vec::with_capacity(Self::KINDS.len());
        for kind in Self::KINDS {
            match std::fs::File::open(format!("/proc/{pid}/ns/{kind}")) {
                Ok(file) => held.push(OwnedFd::from(file)),
                Err(err) => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        tracing::warn!(%err, kind, "cannot hold a container's namespace: calls wait for its teardown");
                    });
                }
            }
        }
        Self { _fds: held }
    }
}

/// Puts the calling thread (only it) under `SCHED_IDLE`.
fn lower_own_priority() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0
    // names the calling thread, whose policy alone changes.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy.
    fn own_policy() -> i32 {
        // SAFETY: sched_getscheduler(0) only reads the calling thread's policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[tokio::test]
    async fn teardowns_run_at_idle_priority_and_the_caller_keeps_its_own() {
        let before = own_policy();
        let teardown = Teardown::start();
        let (seen, policy) = std::sync::mpsc::channel();
        struct Probe(std::sync::mpsc::Sender<(i32, Option<String>)>);
        impl Drop for Probe {
            fn drop(&mut self) {
                let name = std::thread::current().name().map(str::to_string);
                let _ = self.0.send((own_policy(), name));
            }
        }
        teardown.drop_later(Probe(seen)).await;
        assert_eq!(
            policy.recv().unwrap(),
            (libc::SCHED_IDLE, Some("xfn-teardown".to_string()))
        );
        assert_eq!(own_policy(), before);
        assert_eq!(teardown.queued.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn past_the_bound_teardowns_run_at_normal_priority() {
        let teardown = Teardown::start();
        // Hold the idle thread on one teardown, then fill its queue.
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let (running, started) = std::sync::mpsc::channel::<()>();
        struct Blocker(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>);
        impl Drop for Blocker {
            fn drop(&mut self) {
                let _ = self.0.send(());
                let _ = self.1.recv();
            }
        }
        let mut waiting = vec![tokio::spawn(teardown.drop_later(Blocker(running, hold)))];
        started.recv().unwrap();
        for _ in 0..MAX_QUEUED {
            waiting.push(tokio::spawn(teardown.drop_later(())));
        }
        let (seen, policy) = std::sync::mpsc::channel();
        struct Probe(std::sync::mpsc::Sender<i32>);
        impl Drop for Probe {
            fn drop(&mut self) {
                let _ = self.0.send(own_policy());
            }
        }
        // One more runs at once, elsewhere, while the queue is stuck.
        teardown.drop_later(Probe(seen)).await;
        assert_ne!(policy.recv().unwrap(), libc::SCHED_IDLE);
        release.send(()).unwrap();
        for done in waiting {
            done.await.unwrap();
        }
        assert_eq!(teardown.queued.load(Ordering::Acquire), 0);
    }
}
