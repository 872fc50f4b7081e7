//! The warm pool's teardowns (a used or unwanted container's crun state,
//! bundle and cgroup, its rootfs's unmount and removal) on a thread of their
//! own at the lowest CPU priority, `SCHED_IDLE`: they run when a CPU has
//! nothing better to do, not in the middle of the next call.
//!
//! # Why only the teardown
//! The other background work of the pool, `crun create`, cannot be given
//! a lower priority: a scheduling policy and a nice value are inherited by
//! child processes, the container's init is `crun create`'s child and
//! becomes the function, and an unprivileged process cannot undo either
//! (leaving `SCHED_IDLE` or lowering nice needs `RLIMIT_NICE`, 0 by
//! default, or `CAP_SYS_NICE` in the initial user namespace; checked here:
//! `chrt -o -p 0` from `SCHED_IDLE` as uid 65532 fails with EPERM, and so
//! it does inside a container). Nor can the session's autogroup nice be
//! raised and reset per container: without `CAP_SYS_ADMIN` the kernel takes
//! one autogroup change per 100 ms. The teardown, by contrast, is xfn's own
//! thread's work; `sched_setscheduler(0, …)` applies to the calling thread
//! alone, so the async threads and everything they spawn keep their policy.
//! What this thread spawns itself inherits `SCHED_IDLE`: only `crun kill`
//! and `crun delete` on a failure path, never a function.
//!
//! # Bounded
//! `SCHED_IDLE` runs only on an otherwise idle CPU, so on a saturated
//! machine it may wait long. At most [`MAX_QUEUED`] teardowns wait for the
//! thread; past that one runs on tokio's blocking threads at normal
//! priority, as before, so a busy daemon never piles up mounts and state.
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Teardowns waiting for the idle thread at most; more run at normal
/// priority.
pub(super) const MAX_QUEUED: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// The idle-priority teardown thread, started with the pool. It ends when
/// this is dropped, after the teardowns queued.
#[derive(Debug)]
pub(super) struct Teardown {
    sender: Option<Mutex<mpsc::Sender<Job>>>,
    queued: Arc<AtomicUsize>,
}

impl Teardown {
    /// Starts the thread; without one (the spawn failed) every teardown
    /// runs on the blocking threads.
    pub(super) fn start() -> Self {
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
    pub(super) fn inline() -> Self {
        Self {
            sender: None,
            queued: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Drops `remains` off the async threads, on the idle thread unless
    /// [`MAX_QUEUED`] already wait there; the future resolves once it is
    /// dropped (or the thread is gone).
    pub(super) fn drop_later<T: Send + 'static>(
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
