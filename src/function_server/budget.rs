//! What a function server's answers may hold of xfn's memory: one answer
//! at most [`MAX_RESPONSE`]; all answers at once at most the
//! [`ResponseBudget`] (`--response-budget`), each function at most its
//! [`ResponseShare`] of it, so one whose answers stall leaves the others
//! room; and an answer holding room must keep coming ([`Pace`]: at least
//! [`MIN_PER_WINDOW`] bytes per [`STALL_WINDOW`]) or it is given up. Room
//! is held from an answer's declared length on until its bytes are dropped
//! ([`Room::held_by`]), never for more than that length.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// The largest response read from a function server: far above what a
/// RunFunctionResponse of a real Function holds, and a bound on what a
/// function can make xfn hold per call (the bytes are passed on as they
/// are; decoded, a response of tiny values would take ~16 times as much).
pub(crate) const MAX_RESPONSE: usize = 64 << 20;

/// While an answer holds room in the budget, each window of this long
/// must bring [`MIN_PER_WINDOW`] bytes of it (or the rest of it, or its
/// trailers), else it is given up: a function's server writes an answer
/// it has made at memory speed, one that trickles holds room for nothing.
pub(super) const STALL_WINDOW: Duration = Duration::from_secs(2);
/// See [`STALL_WINDOW`]: 512 KiB/s, a thousandth of what loopback carries.
const MIN_PER_WINDOW: usize = 1 << 20;

/// The bytes of function servers' responses xfn holds at once, over all
/// calls (`--response-budget`): each [`MAX_RESPONSE`] alone bounds one
/// call, this bounds their sum whatever a function answers.
#[derive(Debug)]
pub(crate) struct ResponseBudget {
    /// One permit per KiB.
    room: Arc<Semaphore>,
    kib: usize,
}

impl ResponseBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        let kib = bytes.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS);
        Self {
            room: Arc::new(Semaphore::new(kib)),
            kib,
        }
    }

    /// A budget of room for one largest answer, and its one share: for a
    /// caller whose answers are decoded at once (`xfn render`'s servers).
    pub(crate) fn one_answer() -> ResponseShare {
        Arc::new(Self::new(MAX_RESPONSE + PREFIX)).share()
    }

    /// One function's share: a quarter of the budget, but room for one
    /// answer of [`MAX_RESPONSE`] when the budget has it, so one function
    /// whose answers stall or crawl leaves the others three quarters.
    pub(crate) fn share(self: &Arc<Self>) -> ResponseShare {
        let largest = (MAX_RESPONSE + PREFIX).div_ceil(1024);
        let kib = (self.kib / 4).max(largest).min(self.kib);
        ResponseShare {
            budget: Arc::clone(self),
            room: Arc::new(Semaphore::new(kib)),
            kib,
            held: Arc::default(),
        }
    }
}

/// One function's share of the [`ResponseBudget`]: what its answers hold
/// at once, all its servers together.
#[derive(Debug)]
pub(crate) struct ResponseShare {
    budget: Arc<ResponseBudget>,
    /// One permit per KiB.
    pub(super) room: Arc<Semaphore>,
    pub(super) kib: usize,
    /// KiB its answers hold now ([`Room`]s given and not dropped).
    held: Arc<AtomicUsize>,
}

impl ResponseShare {
    /// The bytes its answers hold now (each its declared length, rounded
    /// up to KiB), not counting room an answer still waits for.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed).saturating_mul(1024)
    }

    /// Room for `bytes` in the share and then in the budget (always in
    /// that order, so no two answers wait on each other), waited for in
    /// arrival order; `None` when it can never fit.
    pub(super) async fn hold(&self, bytes: usize) -> Option<Room> {
        let kib = bytes.div_ceil(1024).max(1);
        if kib > self.kib {
            return None;
        }
        let kib = u32::try_from(kib).ok()?;
        let share = Arc::clone(&self.room).acquire_many_owned(kib).await.ok()?;
        let budget = Arc::clone(&self.budget.room)
            .acquire_many_owned(kib)
            .await
            .ok()?;
        self.held.fetch_add(share.num_permits(), Ordering::Relaxed);
        Some(Room {
            share,
            _budget: budget,
            held: Arc::clone(&self.held),
        })
    }
}

/// Room an answer holds in its function's share and in the budget.
pub(super) struct Room {
    share: OwnedSemaphorePermit,
    _budget: OwnedSemaphorePermit,
    held: Arc<AtomicUsize>,
}

impl Drop for Room {
    fn drop(&mut self) {
        self.held
            .fetch_sub(self.share.num_permits(), Ordering::Relaxed);
    }
}

impl Room {
    /// `bytes`, holding this room until their last copy is dropped.
    pub(super) fn held_by(self, bytes: Bytes) -> Bytes {
        Bytes::from_owner(HeldAnswer { bytes, _room: self })
    }
}

/// A response's bytes with the budget they hold, given back when the
/// last copy of the bytes is dropped.
struct HeldAnswer {
    bytes: Bytes,
    _room: Room,
}

impl AsRef<[u8]> for HeldAnswer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

pub(super) use crate::grpc::raw::PREFIX;

/// How fast an answer holding room arrives: each [`STALL_WINDOW`] must
/// bring [`MIN_PER_WINDOW`] bytes, or all that was left of it.
pub(super) struct Pace<'a> {
    function: &'a str,
    /// Bytes of the message still to come.
    left: usize,
    window_end: tokio::time::Instant,
    /// Bytes the current window must bring, and has brought.
    due: usize,
    brought: usize,
}

impl<'a> Pace<'a> {
    pub(super) fn new(function: &'a str) -> Self {
        Self {
            function,
            left: 0,
            window_end: tokio::time::Instant::now(),
            due: 0,
            brought: 0,
        }
    }

    /// Paced from now, with `left` bytes to come.
    pub(super) fn start(&mut self, left: usize) {
        self.left = left;
        self.window();
    }

    fn window(&mut self) {
        self.window_end = tokio::time::Instant::now() + STALL_WINDOW;
        self.due = self.left.min(MIN_PER_WINDOW);
        self.brought = 0;
    }

    /// What `next` reads of the body next, or the answer given up as
    /// stalled.
    pub(super) async fn next<T, F: std::future::Future<Output = T>>(
        &mut self,
        mut next: impl FnMut() -> F,
    ) -> Result<T, Status> {
        loop {
            // Cancel-safe: a chunk not yet taken stays in the stream.
            match tokio::time::timeout_at(self.window_end, next()).await {
                Ok(next) => return Ok(next),
                Err(_) => self.roll()?,
            }
        }
    }

    /// `bytes` of the message arrived.
    pub(super) fn arrived(&mut self, bytes: usize) -> Result<(), Status> {
        self.left = self.left.saturating_sub(bytes);
        self.brought += bytes;
        match tokio::time::Instant::now() >= self.window_end {
            true => self.roll(),
            false => Ok(()),
        }
    }

    /// Ends a window: stalled unless it brought what was due.
    fn roll(&mut self) -> Result<(), Status> {
        if self.brought < self.due {
            return Err(self.stalled());
        }
        self.window();
        Ok(())
    }

    pub(super) fn stalled(&self) -> Status {
        Status::resource_exhausted(format!(
            "function {}: its server's answer stalled ({} of {} bytes due in {}s, {} bytes still to come) while holding room in --response-budget: given up",
            self.function,
            self.brought,
            self.due,
            STALL_WINDOW.as_secs(),
            self.left,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_functions_answers_hold_at_most_its_share_of_the_budget() {
        let budget = Arc::new(ResponseBudget::new(1 << 30));
        let share = budget.share();
        assert_eq!(share.kib, (1 << 30) / 1024 / 4);
        // Never less than one largest answer, never more than the budget.
        let small = Arc::new(ResponseBudget::new(100 << 20)).share();
        assert_eq!(small.kib, (MAX_RESPONSE + PREFIX).div_ceil(1024));
        assert_eq!(Arc::new(ResponseBudget::new(4096)).share().kib, 4);
        // Held in the share and in the budget.
        let room = share.hold(100 << 20).await.unwrap();
        assert_eq!(budget.room.available_permits(), (1 << 20) - (100 << 10));
        drop(room);
        assert_eq!(budget.room.available_permits(), 1 << 20);
    }

    #[tokio::test]
    async fn what_a_share_holds_counts_rooms_given_not_room_waited_for() {
        let share = Arc::new(ResponseBudget::new(4 << 20)).share();
        let first = share.hold(3 << 20).await.unwrap();
        assert_eq!(share.held(), 3 << 20);
        // A second answer waits, holding a part of what it waits for in
        // the semaphore: not counted.
        let mut second = Box::pin(share.hold(2 << 20));
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert_eq!(share.held(), 3 << 20);
        drop(first);
        let second = second.await.unwrap();
        assert_eq!(share.held(), 2 << 20);
        drop(second);
        assert_eq!(share.held(), 0);
    }
}
