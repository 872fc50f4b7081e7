//! Admission control: at most N runs at once; callers beyond them wait, in
//! the order they came, for as long as their own deadline allows.
//!
//! Why wait rather than refuse: Crossplane calls from many reconcilers at
//! once and treats every error as a failed reconcile, retried with backoff.
//! Work the daemon can finish before the caller gives up is work it should
//! take, so the queue is bounded by what actually limits it:
//! - the caller's deadline (`grpc-timeout`): a call still queued when it
//!   passes is answered `DEADLINE_EXCEEDED` and never runs; the time spent
//!   waiting counts against it, so the run gets only what is left;
//! - memory: the queue holds each waiting call's input, so it is capped in
//!   calls and in input bytes, large enough never to bind under Crossplane's
//!   load (its inputs are kilobytes) and small enough that a flood cannot
//!   exhaust the sidecar's memory. Past either cap: `RESOURCE_EXHAUSTED`;
//! - the caller going away: its future is dropped and it leaves the queue.
//!
//! A call whose deadline the queue ahead of it cannot clear in time is
//! refused at once (`RESOURCE_EXHAUSTED`, see [`super::wait`] and the rule
//! in [`crate::grpc`]) rather than queued to time out.
//!
//! The queue is FIFO: tokio's semaphore hands permits out in request order.
//! **One queue for every kind of call**: one waiting for a run slot or for
//! a [`Lane`]'s (room on an `xfn host` function's servers) counts against
//! the same caps, so nothing a caller sends waits outside them.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::wait::{least_wait, RunTimes};

/// Calls allowed to wait by default: more than Crossplane's reconcilers
/// call at once on a busy control plane (each composite resource kind
/// reconciles up to `--max-reconcile-rate`, 10 by default, at a time).
pub(crate) const DEFAULT_MAX_QUEUED_RUNS: usize = 1024;

/// Input bytes allowed to wait by default: the queue's memory, a fraction
/// of the 2 GiB a Crossplane sidecar is given.
pub(crate) const DEFAULT_MAX_QUEUED_BYTES: usize = 256 << 20;

/// Why a call was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum AdmissionError {
    /// Every run slot is busy and the queue is at one of its caps.
    #[error(
        "{running} runs in flight and the queue is full ({queued} calls, {queued_bytes} input bytes waiting; caps --max-queued-runs {max_queued}, --max-queued-bytes {max_queued_bytes}); try again later"
    )]
    QueueFull {
        /// Runs allowed at once.
        running: usize,
        /// Calls waiting.
        queued: usize,
        /// Their input bytes.
        queued_bytes: usize,
        /// The cap on waiting calls.
        max_queued: usize,
        /// The cap on their input bytes.
        max_queued_bytes: usize,
    },
    /// The queue ahead cannot clear before the caller's deadline.
    #[error(
        "{queued} calls are queued for {running} run slots and a run takes about {}ms lately, so this call would wait at least {}ms, past its deadline in {}ms; refused now rather than left to time out (try again later, or with a longer deadline)",
        typical.as_millis(),
        least_wait.as_millis(),
        deadline_in.as_millis()
    )]
    WouldMissDeadline {
        /// Calls queued ahead of this one.
        queued: usize,
        /// Runs allowed at once.
        running: usize,
        /// The median time recent runs held their slot.
        typical: Duration,
        /// The least wait that predicts.
        least_wait: Duration,
        /// Time left before the caller's deadline.
        deadline_in: Duration,
    },
    /// The caller's deadline passed before a run slot freed.
    #[error("the caller's deadline passed after {waited:?} waiting for a run slot ({running} runs in flight); the function did not run")]
    DeadlinePassed {
        /// How long the call waited.
        waited: Duration,
        /// Runs allowed at once.
        running: usize,
    },
    /// The lane it waited for was closed (its function unhosted, or xfn
    /// shutting down).
    #[error("the function's servers were stopped while the call waited (unhosted, or xfn is shutting down); the function did not run")]
    Closed,
}

/// Slots of their own that calls wait for in the one queue (one hosted
/// function's room on its servers): see the module's header. A clone is
/// the same lane.
#[derive(Debug, Clone)]
pub(crate) struct Lane {
    slots: Arc<Semaphore>,
    size: usize,
}

impl Lane {
    /// `size` calls at once (at least 1).
    pub(crate) fn new(size: usize) -> Self {
        let size = size.max(1);
        Self {
            slots: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// Refuses every call waiting or to come ([`AdmissionError::Closed`]).
    pub(crate) fn close(&self) {
        self.slots.close();
    }
}

/// How much may run and wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Runs at once (at least 1).
    pub max_running: usize,
    /// Calls waiting for a run slot.
    pub max_queued: usize,
    /// Input bytes of the waiting calls.
    pub max_queued_bytes: usize,
}

impl AdmissionLimits {
    /// `max_running` runs at once and the default queue caps.
    pub fn with_runs(max_running: usize) -> Self {
        Self {
            max_running,
            max_queued: DEFAULT_MAX_QUEUED_RUNS,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
        }
    }
}

/// Run slots and the queue in front of them.
#[derive(Debug)]
pub(crate) struct Admission {
    slots: Arc<Semaphore>,
    limits: AdmissionLimits,
    waiting: AtomicUsize,
    waiting_bytes: AtomicUsize,
    /// Mirrors `waiting` for the metrics endpoint.
    waiting_gauge: Gauge,
    /// How long recent runs held their slot.
    run_times: Arc<RunTimes>,
}

/// A held run slot; the slot frees when it drops, and how long it was held
/// goes into the run times the wait estimate reads.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    taken: Instant,
    run_times: Arc<RunTimes>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.run_times.record(self.taken.elapsed());
    }
}

/// One call's place in the queue: counted while alive, however the wait
/// ends (admitted, refused, deadline, or the caller's future dropped).
struct Waiting<'a> {
    admission: &'a Admission,
    bytes: usize,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.admission.waiting.fetch_sub(1, Ordering::SeqCst);
        self.admission
            .waiting_bytes
            .fetch_sub(self.bytes, Ordering::SeqCst);
        self.admission.waiting_gauge.dec();
    }
}

impl Admission {
    /// Slots and queue under `limits`; `waiting_gauge` follows the number of
    /// waiting calls.
    pub(crate) fn new(limits: AdmissionLimits, waiting_gauge: Gauge) -> Self {
        let limits = AdmissionLimits {
            max_running: limits.max_running.max(1),
            ..limits
        };
        Self {
            slots: Arc::new(Semaphore::new(limits.max_running)),
            limits,
            waiting: AtomicUsize::new(0),
            waiting_bytes: AtomicUsize::new(0),
            waiting_gauge,
            run_times: Arc::default(),
        }
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            _permit: permit,
            taken: Instant::now(),
            run_times: self.run_times.clone(),
        }
    }

    /// The limits in force.
    pub(crate) fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Calls waiting for a slot now.
    pub(crate) fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Takes a slot for a call holding `bytes` of input, waiting in FIFO
    /// order when none is free, until `deadline` at the latest. Refuses at
    /// once when the queue is at a cap or cannot clear before `deadline`.
    /// Cancel-safe: dropping the future leaves the queue.
    pub(crate) async fn admit(
        &self,
        bytes: usize,
        deadline: Option<Instant>,
    ) -> Result<Slot, AdmissionError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(self.slot(permit));
        }
        if let Some(deadline) = deadline {
            self.check_reachable(deadline.saturating_duration_since(Instant::now()))?;
        }
        let running = self.limits.max_running;
        // The run slots are never closed.
        self.wait(&self.slots, running, bytes, deadline)
            .await
            .map(|permit| self.slot(permit))
    }

    /// Takes a slot of `lane` for a call holding `bytes` of input, waiting
    /// in the one queue (its caps, FIFO within the lane) until `deadline`
    /// at the latest. Cancel-safe.
    pub(crate) async fn admit_to(
        &self,
        lane: &Lane,
        bytes: usize,
        deadline: Option<Instant>,
    ) -> Result<OwnedSemaphorePermit, AdmissionError> {
        match lane.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(tokio::sync::TryAcquireError::Closed) => Err(AdmissionError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                self.wait(&lane.slots, lane.size, bytes, deadline).await
            }
        }
    }

    /// Waits in the queue for a permit of `slots` (`running` of them).
    async fn wait(
        &self,
        slots: &Arc<Semaphore>,
        running: usize,
        bytes: usize,
        deadline: Option<Instant>,
    ) -> Result<OwnedSemaphorePermit, AdmissionError> {
        let started = Instant::now();
        let place = self.enqueue(bytes, running)?;
        let acquire = slots.clone().acquire_owned();
        let permit = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, acquire).await {
                Ok(permit) => permit,
                Err(_elapsed) => {
                    return Err(AdmissionError::DeadlinePassed {
                        waited: started.elapsed(),
                        running,
                    })
                }
            },
            None => acquire.await,
        };
        drop(place);
        permit.map_err(|_closed| AdmissionError::Closed)
    }

    /// Refuses a call that would have to wait longer than `deadline_in`
    /// behind the calls queued now, as recent runs predict.
    fn check_reachable(&self, deadline_in: Duration) -> Result<(), AdmissionError> {
        let Some(typical) = self.run_times.typical() else {
            return Ok(());
        };
        let queued = self.queued();
        let least_wait = least_wait(queued, self.limits.max_running, typical);
        if least_wait > deadline_in {
            return Err(AdmissionError::WouldMissDeadline {
                queued,
                running: self.limits.max_running,
                typical,
                least_wait,
                deadline_in,
            });
        }
        Ok(())
    }

    /// Takes a place in the queue, or says which cap is reached.
    fn enqueue(&self, bytes: usize, running: usize) -> Result<Waiting<'_>, AdmissionError> {
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        let bytes_before = self.waiting_bytes.fetch_add(bytes, Ordering::SeqCst);
        self.waiting_gauge.inc();
        let place = Waiting {
            admission: self,
            bytes,
        };
        let over_bytes = bytes_before.saturating_add(bytes) > self.limits.max_queued_bytes;
        if before >= self.limits.max_queued || over_bytes {
            let err = AdmissionError::QueueFull {
                running,
                queued: before,
                queued_bytes: bytes_before,
                max_queued: self.limits.max_queued,
                max_queued_bytes: self.limits.max_queued_bytes,
            };
            drop(place);
            return Err(err);
        }
        Ok(place)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_running: usize, max_queued: usize) -> AdmissionLimits {
        AdmissionLimits {
            max_running,
            max_queued,
            max_queued_bytes: 1 << 20,
        }
    }

    async fn until_queued(admission: &Admission, n: usize) {
        while admission.queued() != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn queues_then_refuses() {
        let gauge = Gauge::default();
        let admission = Arc::new(Admission::new(limits(1, 1), gauge.clone()));
        let first = admission.admit(10, None).await.unwrap();
        let queued = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit(10, None).await.map(|_| ()) })
        };
        until_queued(&admission, 1).await;
        assert!(matches!(
            admission.admit(10, None).await,
            Err(AdmissionError::QueueFull {
                running: 1,
                queued: 1,
                ..
            })
        ));
        assert_eq!(admission.queued(), 1);
        assert_eq!(gauge.get(), 1);
        drop(first);
        queued.await.unwrap().unwrap();
        assert_eq!(admission.queued(), 0);
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn the_byte_cap_refuses_a_call_whose_input_would_not_fit() {
        let admission = Admission::new(
            AdmissionLimits {
                max_running: 1,
                max_queued: 100,
                max_queued_bytes: 100,
            },
            Gauge::default(),
        );
        let _first = admission.admit(1000, None).await.unwrap();
        let err = admission.admit(101, None).await.unwrap_err();
        assert!(matches!(err, AdmissionError::QueueFull { .. }), "{err}");
        assert!(err.to_string().contains("--max-queued-bytes"), "{err}");
        assert_eq!(admission.queued(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let admission = Admission::new(limits(1, 1), Gauge::default());
        let _first = admission.admit(0, None).await.unwrap();
        let waiter = admission.admit(0, None);
        let timed_out = tokio::time::timeout(Duration::from_millis(10), waiter).await;
        assert!(timed_out.is_err());
        assert_eq!(admission.queued(), 0);
        // The queue has room again: this one waits rather than being refused.
        let again = tokio::time::timeout(Duration::from_millis(10), admission.admit(0, None)).await;
        assert!(again.is_err(), "still waiting, not refused");
    }

    #[tokio::test]
    async fn a_waiter_whose_deadline_passes_is_told_so_and_leaves_the_queue() {
        let admission = Admission::new(limits(1, 4), Gauge::default());
        let _first = admission.admit(0, None).await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(100);
        let err = admission.admit(0, Some(deadline)).await.unwrap_err();
        assert!(
            matches!(err, AdmissionError::DeadlinePassed { waited, .. } if waited >= Duration::from_millis(100)),
            "{err}"
        );
        assert_eq!(admission.queued(), 0);
    }

    #[tokio::test]
    async fn waiters_are_served_in_the_order_they_came() {
        let admission = Arc::new(Admission::new(limits(1, 8), Gauge::default()));
        let first = admission.admit(0, None).await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (waiter, order) = (admission.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _slot = waiter.admit(0, None).await.unwrap();
                order.lock().unwrap().push(i);
            }));
            until_queued(&admission, i + 1).await;
        }
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    }

    #[tokio::test]
    async fn zero_queue_refuses_when_busy() {
        let admission = Admission::new(limits(1, 0), Gauge::default());
        let _first = admission.admit(0, None).await.unwrap();
        assert!(admission.admit(0, None).await.is_err());
    }

    /// Gives the estimate `MIN_RUNS` runs that held their slot `each`.
    fn seen_runs(admission: &Admission, each: Duration) {
        for _ in 0..crate::grpc::wait::MIN_RUNS {
            admission.run_times.record(each);
        }
    }

    /// Spawns `n` callers without deadline that queue behind a held slot.
    async fn queue_behind(
        admission: &Arc<Admission>,
        n: usize,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut waiters = Vec::new();
        for i in 0..n {
            let waiter = admission.clone();
            waiters.push(tokio::spawn(async move {
                let _slot = waiter.admit(0, None).await.unwrap();
            }));
            until_queued(admission, i + 1).await;
        }
        waiters
    }

    #[tokio::test]
    async fn a_deadline_the_queue_cannot_meet_is_refused_at_once_naming_why() {
        let admission = Arc::new(Admission::new(limits(1, 16), Gauge::default()));
        seen_runs(&admission, Duration::from_millis(100));
        let first = admission.admit(0, None).await.unwrap();
        let _waiters = queue_behind(&admission, 3).await;

        let deadline = Instant::now() + Duration::from_millis(250);
        let err = admission.admit(0, Some(deadline)).await.unwrap_err();
        let AdmissionError::WouldMissDeadline {
            queued: 3,
            running: 1,
            typical,
            least_wait,
            deadline_in,
        } = err
        else {
            panic!("{err}");
        };
        assert_eq!(typical, Duration::from_millis(100));
        assert_eq!(least_wait, Duration::from_millis(300));
        assert!(deadline_in <= Duration::from_millis(250), "{deadline_in:?}");
        let text = err.to_string();
        for part in [
            "3 calls are queued",
            "1 run slots",
            "100ms",
            "300ms",
            "past its deadline in",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        // It never took a place in the queue.
        assert_eq!(admission.queued(), 3);
        drop(first);
    }

    #[tokio::test]
    async fn a_deadline_the_queue_can_meet_waits_its_turn() {
        let admission = Arc::new(Admission::new(limits(1, 16), Gauge::default()));
        seen_runs(&admission, Duration::from_millis(100));
        let first = admission.admit(0, None).await.unwrap();
        let waiters = queue_behind(&admission, 3).await;
        // 300ms of whole runs ahead, 5s left: it waits.
        let deadline = Instant::now() + Duration::from_secs(5);
        let last = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit(0, Some(deadline)).await.map(|_| ()) })
        };
        until_queued(&admission, 4).await;
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        last.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn nothing_is_refused_for_its_deadline_before_enough_runs_or_without_one() {
        let admission = Arc::new(Admission::new(limits(1, 16), Gauge::default()));
        let first = admission.admit(0, None).await.unwrap();
        let _waiters = queue_behind(&admission, 3).await;
        // No runs seen yet: a tiny deadline waits (and passes in the queue).
        let soon = Instant::now() + Duration::from_millis(1);
        let err = admission.admit(0, Some(soon)).await.unwrap_err();
        assert!(
            matches!(err, AdmissionError::DeadlinePassed { .. }),
            "{err}"
        );
        drop(first);

        let admission = Arc::new(Admission::new(limits(1, 16), Gauge::default()));
        seen_runs(&admission, Duration::from_secs(10));
        let _first = admission.admit(0, None).await.unwrap();
        let _waiters = queue_behind(&admission, 3).await;
        // No deadline: it waits however long the queue is.
        let waiter = admission.admit(0, None);
        let waited = tokio::time::timeout(Duration::from_millis(10), waiter).await;
        assert!(waited.is_err(), "still waiting, not refused");
    }

    #[tokio::test]
    async fn calls_waiting_for_a_lane_count_against_the_same_caps_as_runs() {
        let admission = Arc::new(Admission::new(
            AdmissionLimits {
                max_running: 1,
                max_queued: 100,
                max_queued_bytes: 100,
            },
            Gauge::default(),
        ));
        let lane = Arc::new(Lane::new(1));
        let _busy = admission.admit_to(&lane, 1000, None).await.unwrap();
        let _run = admission.admit(0, None).await.unwrap();
        // 60 bytes wait for the lane...
        let waiting = {
            let (admission, lane) = (admission.clone(), lane.clone());
            tokio::spawn(async move { admission.admit_to(&lane, 60, None).await.map(|_| ()) })
        };
        until_queued(&admission, 1).await;
        // ...so 60 more, for a run, do not fit the same 100-byte cap.
        let err = admission.admit(60, None).await.unwrap_err();
        assert!(err.to_string().contains("--max-queued-bytes"), "{err}");
        let err = admission.admit_to(&lane, 60, None).await.unwrap_err();
        assert!(
            matches!(
                err,
                AdmissionError::QueueFull {
                    running: 1,
                    queued: 1,
                    ..
                }
            ),
            "{err}"
        );
        // A closed lane ends its waiters.
        lane.close();
        assert_eq!(waiting.await.unwrap(), Err(AdmissionError::Closed));
        assert_eq!(admission.queued(), 0);
    }
}
