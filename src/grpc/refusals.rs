//! Callers refused before any gRPC byte, counted where they are refused
//! and exported here as `xfn_callers_refused_total`.
//!
//! The gRPC layer owns this type so that it reports what a front end
//! refused without importing the front end: `xfn start`'s gatekeeper
//! ([`crate::sidecar::gate`], a process of its own) adds to it, the metrics
//! read it. One page of memory shared by the two processes (mapped
//! `MAP_SHARED` before the fork, so both see the same atomics): a channel
//! message per refusal would cost the flood path a system call; this costs
//! an atomic add.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a caller was refused: the `reason` label of the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalReason {
    /// Its uid is not allowed.
    Uid,
    /// It runs in a container (a function).
    Container,
    /// Its credentials could not be read.
    Credentials,
}

/// The refusal counts, one per reason.
#[derive(Debug, Default)]
#[repr(C)]
struct Counts {
    uid: AtomicU64,
    container: AtomicU64,
    credentials: AtomicU64,
}

/// Refusal counters shared with a child process (clone it before the
/// fork: both ends see the same page).
#[derive(Debug, Clone)]
pub struct RefusalCounters(std::sync::Arc<SharedPage>);

/// The shared mapping of [`Counts`]; unmapped (in this process) on drop.
#[derive(Debug)]
struct SharedPage(std::ptr::NonNull<Counts>);

// SAFETY: the mapping holds only atomics, which any thread may access
// through a shared reference; it stays mapped until the page is dropped.
unsafe impl Send for SharedPage {}
// SAFETY: as above.
unsafe impl Sync for SharedPage {}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: the pointer and size are those `mmap` returned and took;
        // no reference into the page outlives `self`.
        unsafe {
            libc::munmap(self.0.as_ptr().cast(), std::mem::size_of::<Counts>());
        }
    }
}

impl RefusalCounters {
    /// Fresh counters (all zero) on a page a forked child shares.
    pub(crate) fn new() -> Result<Self, nix::Error> {
        // SAFETY: an anonymous shared mapping of a fresh page: no file, no
        // address hint; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Counts>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(nix::Error::last());
        }
        // A fresh anonymous mapping is zero-filled and page-aligned: valid
        // (zeroed) atomics.
        let page = std::ptr::NonNull::new(ptr.cast::<Counts>()).ok_or(nix::Error::EINVAL)?;
        Ok(Self(std::sync::Arc::new(SharedPage(page))))
    }

    fn counts(&self) -> &Counts {
        // SAFETY: the page is mapped and initialised for as long as `self`
        // (which holds it) lives; only atomics are accessed through it.
        unsafe { self.0 .0.as_ref() }
    }

    /// Counts one refusal.
    pub(crate) fn add(&self, reason: RefusalReason) {
        let counts = self.counts();
        let counter = match reason {
            RefusalReason::Uid => &counts.uid,
            RefusalReason::Container => &counts.container,
            RefusalReason::Credentials => &counts.credentials,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// Refusals so far, by reason label.
    pub(crate) fn refused(&self) -> [(&'static str, u64); 3] {
        let c = self.counts();
        [
            ("uid", c.uid.load(Relaxed)),
            ("container", c.container.load(Relaxed)),
            ("credentials", c.credentials.load(Relaxed)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counted_in_a_forked_child_is_read_in_the_parent() {
        let counters = RefusalCounters::new().unwrap();
        // A child process (not a thread) adds: the page is shared across
        // the fork, as the gatekeeper's is.
        // SAFETY: the child only adds to an atomic and exits without
        // returning into the test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                counters.add(RefusalReason::Container);
                counters.add(RefusalReason::Container);
                counters.add(RefusalReason::Uid);
                // SAFETY: `_exit` skips the parent's atexit handlers.
                unsafe { libc::_exit(0) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                nix::sys::wait::waitpid(child, None).unwrap();
            }
        }
        assert_eq!(
            counters.refused(),
            [("uid", 1), ("container", 2), ("credentials", 0)]
        );
    }
}
