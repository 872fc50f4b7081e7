//! One call through the layer, whichever front end took it: wait for a run
//! slot (admission), run under it with what is left of the caller's
//! deadline, end with the drain's grace period, and record the outcome.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::admission::{Admission, AdmissionError, AdmissionLimits, Lane};
use super::metrics::Metrics;
use super::serve::Drain;
use super::status::{admission_status, outcome_label};
use crate::echo::Echo;

/// The run slots, their queue and the metrics every call goes through
/// (share it in an `Arc` between the service and [`Calls::drain`]).
#[derive(Debug)]
pub struct Calls {
    admission: Admission,
    metrics: Arc<Metrics>,
    /// Cancelled when the grace period after SIGTERM is over: every call
    /// still queued or running then ends (dropping its run, which kills it).
    abort: CancellationToken,
    /// Calls begun so far (admitted or not): what an idle daemon's page
    /// release watches (`crate::resident`).
    begun: std::sync::atomic::AtomicU64,
}

/// Keeps a gauge raised while alive: a call whose future is dropped (the
/// client went away) still leaves the gauge right.
struct Raised<'a>(&'a Gauge);

impl<'a> Raised<'a> {
    fn new(gauge: &'a Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What a call is about, as its log lines name it: the image a sidecar
/// call runs (`image=`), or the function an adaptor or host call reaches
/// (`function=`, the field an operator filters one function's lines by).
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// An image reference.
    Image(&'a str),
    /// A function's name.
    Function(&'a str),
}

/// Logs an event about a call at `$level`, its subject as its own field.
macro_rules! call_event {
    ($level:ident, $subject:expr, $($rest:tt)*) => {
        match $subject {
            Subject::Image(image) => tracing::$level!(image = %Echo(image), $($rest)*),
            Subject::Function(function) => tracing::$level!(function = %Echo(function), $($rest)*),
        }
    };
}

/// Records a call whose future was dropped before it answered: the caller
/// cancelled (or its connection went away), and the run was dropped with it.
struct CancelRecord<'a> {
    metrics: &'a Metrics,
    subject: Subject<'a>,
    started: std::time::Instant,
    finished: bool,
}

impl Drop for CancelRecord<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let elapsed = self.started.elapsed();
            self.metrics.record_run("cancelled", elapsed);
            call_event!(
                info,
                self.subject,
                ?elapsed,
                "call cancelled by the caller; run stopped"
            );
        }
    }
}

impl Calls {
    /// Slots and queue under `limits`, recorded in `metrics`.
    pub(crate) fn new(limits: AdmissionLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            admission: Admission::new(limits, metrics.queued().clone()),
            metrics,
            abort: CancellationToken::new(),
            begun: Default::default(),
        }
    }

    /// Calls begun so far, and whether any is queued or running now.
    pub fn activity(&self) -> (u64, bool) {
        let begun = self.begun.load(std::sync::atomic::Ordering::Relaxed);
        let busy = self.metrics.in_flight().get() > 0 || self.queued() > 0;
        (begun, busy)
    }

    /// The limits in force.
    pub fn limits(&self) -> AdmissionLimits {
        self.admission.limits()
    }

    /// Calls waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.admission.queued()
    }

    /// The metrics calls are recorded in.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// How the server stops: runs get `grace_period` after the signal, then
    /// every call still here is cancelled.
    pub(crate) fn drain(&self, grace_period: Duration) -> Drain {
        Drain {
            grace_period,
            abort: self.abort.clone(),
        }
    }

    /// Waits for a run slot for a call carrying `input_bytes`, due by
    /// `deadline`, then runs `run(time left before the deadline)` holding
    /// it. A refused call, a deadline passed in the queue and the end of the
    /// grace period come back as their statuses; `run` is not called then.
    pub async fn admit<T, F, Fut>(
        &self,
        input_bytes: usize,
        deadline: Option<Instant>,
        run: F,
    ) -> Result<T, Status>
    where
        F: FnOnce(Option<Duration>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let admitted = self.admission.admit(input_bytes, deadline);
        self.admit_with(admitted, deadline, run).await
    }

    /// As [`Calls::admit`], the call waiting in the same queue for a slot
    /// of `lane` instead of a run slot (`xfn host`: room on a function's
    /// servers).
    pub(crate) async fn admit_to<T, F, Fut>(
        &self,
        lane: &Lane,
        input_bytes: usize,
        deadline: Option<Instant>,
        run: F,
    ) -> Result<T, Status>
    where
        F: FnOnce(Option<Duration>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let admitted = self.admission.admit_to(lane, input_bytes, deadline);
        self.admit_with(admitted, deadline, run).await
    }

    async fn admit_with<S, T, F, Fut>(
        &self,
        admitted: impl Future<Output = Result<S, AdmissionError>>,
        deadline: Option<Instant>,
        run: F,
    ) -> Result<T, Status>
    where
        F: FnOnce(Option<Duration>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.begun
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Biased to the abort: a slot freed by the abort itself must not
        // start a run.
        let slot = tokio::select! {
            biased;
            () = self.abort.cancelled() => {
                return Err(Status::unavailable(
                    "xfn is shutting down: the call was still queued at the end of the grace period; the function did not run",
                ));
            }
            admitted = admitted => {
                admitted.map_err(|e| admission_status(&e))?
            }
        };
        // Time spent queued counts against the caller's deadline.
        let caller_left = match deadline {
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => {
                    return Err(Status::deadline_exceeded(
                        "the caller's deadline passed as the call got its run slot; the function did not run",
                    ))
                }
            },
            None => None,
        };
        let _in_flight = Raised::new(self.metrics.in_flight());
        let result = tokio::select! {
            result = run(caller_left) => result,
            () = self.abort.cancelled() => Err(Status::unavailable(
                "xfn is shutting down: the run was cancelled at the end of the grace period",
            )),
        };
        drop(slot);
        result
    }

    /// Answers one call about `subject` through
    /// `call`, which gives the answer and its outcome label (`ok`, or e.g.
    /// `cache_hit`); records the outcome and duration, and a call dropped
    /// before it answered as `cancelled`.
    pub async fn answer<T>(
        &self,
        subject: Subject<'_>,
        call: impl Future<Output = Result<(T, &'static str), Status>>,
    ) -> Result<T, Status> {
        let started = std::time::Instant::now();
        let mut record = CancelRecord {
            metrics: &self.metrics,
            subject,
            started,
            finished: false,
        };
        let result = call.await;
        record.finished = true;
        let elapsed = started.elapsed();
        match &result {
            Ok((_, outcome)) => {
                self.metrics.record_run(outcome, elapsed);
                call_event!(debug, subject, ?elapsed, outcome, "call answered");
            }
            Err(status) => {
                self.metrics
                    .record_run(outcome_label(status.code()), elapsed);
                // `error`, not `message`: that is the event's own key, and JSON
                // lines would carry it twice.
                call_event!(warn, subject, ?elapsed, code = ?status.code(), error = status.message(), "call failed");
            }
        }
        result.map(|(answer, _)| answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn calls(max_running: usize) -> Arc<Calls> {
        let limits = AdmissionLimits::with_runs(max_running);
        Arc::new(Calls::new(limits, Arc::new(Metrics::new())))
    }

    async fn until_queued(calls: &Calls, n: usize) {
        while calls.queued() != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn the_end_of_the_grace_period_ends_runs_and_queued_calls() {
        let calls = calls(1);
        let drain = calls.drain(Duration::ZERO);
        let spawn = |calls: Arc<Calls>| {
            tokio::spawn(async move {
                calls
                    .admit(0, None, |_| std::future::pending::<Result<(), Status>>())
                    .await
            })
        };
        let running = spawn(calls.clone());
        while calls.metrics.in_flight().get() != 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let queued = spawn(calls.clone());
        until_queued(&calls, 1).await;
        drain.abort.cancel();
        for (call, what) in [(running, "run was cancelled"), (queued, "still queued")] {
            let status = call.await.unwrap().unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert!(status.message().contains(what), "{status:?}");
        }
        assert_eq!(calls.queued(), 0);
        assert_eq!(calls.metrics.in_flight().get(), 0);
    }

    #[tokio::test]
    async fn the_run_gets_what_is_left_of_the_deadline() {
        let calls = calls(1);
        let deadline = Instant::now() + Duration::from_secs(5);
        let left = calls
            .admit(
                0,
                Some(deadline),
                |left| async move { Ok::<_, Status>(left) },
            )
            .await
            .unwrap()
            .unwrap();
        assert!(
            left <= Duration::from_secs(5) && !left.is_zero(),
            "{left:?}"
        );
        let left = calls.admit(0, None, |left| async move { Ok::<_, Status>(left) });
        assert_eq!(left.await.unwrap(), None);
    }

    #[tokio::test]
    async fn answers_are_recorded_by_outcome_and_dropped_calls_as_cancelled() {
        let calls = calls(1);
        calls
            .answer(Subject::Function("fn"), async { Ok(((), "ok")) })
            .await
            .unwrap();
        calls
            .answer(Subject::Function("fn"), async { Ok(((), "cache_hit")) })
            .await
            .unwrap();
        let failed = calls
            .answer::<()>(Subject::Function("fn"), async {
                Err(Status::not_found("no such image"))
            })
            .await;
        assert_eq!(failed.unwrap_err().code(), Code::NotFound);
        let dropped = calls.answer::<()>(Subject::Function("fn"), std::future::pending());
        assert!(tokio::time::timeout(Duration::from_millis(1), dropped)
            .await
            .is_err());
        let text = calls.metrics.render();
        for outcome in ["ok", "cache_hit", "not_found", "cancelled"] {
            assert!(
                text.contains(&format!("xfn_runs_total{{outcome=\"{outcome}\"}} 1")),
                "{outcome}: {text}"
            );
        }
    }
}
