//! The `ContainerizedFunctionRunnerService` implementation: validate, admit,
//! run under the caller's deadline, map the outcome to a status, record it.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use super::admission::{Admission, AdmissionError, AdmissionLimits};
use super::deadline::{deadline_of, effective_timeout};
use super::metrics::Metrics;
use super::status::status_of;
use super::validate::run_config_of;
use super::FunctionRunner;
use crate::proto::v1alpha1 as pb;
use crate::proto::v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerService;

/// Tunables of the service.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Run timeout when the request names none (Crossplane's runner: 25 s).
    pub default_timeout: Duration,
    /// Largest accepted input.
    pub max_input_bytes: usize,
    /// Runs at once and the queue in front of them.
    pub admission: AdmissionLimits,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(25),
            max_input_bytes: 4 << 20,
            admission: AdmissionLimits::with_runs(1),
        }
    }
}

/// The runner service over any [`FunctionRunner`].
#[derive(Debug)]
pub struct RunnerService<R> {
    runner: Arc<R>,
    options: ServiceOptions,
    admission: Admission,
    metrics: Arc<Metrics>,
    /// Cancelled when the grace period after SIGTERM is over: every call
    /// still running then ends (dropping its run, which kills it).
    abort: CancellationToken,
}

/// Keeps a gauge raised while alive.
struct Raised<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Raised<'a> {
    fn new(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl<R: FunctionRunner> RunnerService<R> {
    /// A service running functions on `runner`.
    pub fn new(
        runner: Arc<R>,
        options: ServiceOptions,
        metrics: Arc<Metrics>,
        abort: CancellationToken,
    ) -> Self {
        metrics.set_limits_enforced(runner.limits_enforced());
        let admission = Admission::new(options.admission, metrics.queued().clone());
        Self {
            runner,
            options,
            admission,
            metrics,
            abort,
        }
    }

    /// The service's options.
    pub fn options(&self) -> &ServiceOptions {
        &self.options
    }

    async fn run_checked(
        &self,
        request: Request<pb::RunFunctionRequest>,
    ) -> Result<Vec<u8>, Status> {
        let deadline = deadline_of(&request);
        let request = request.into_inner();
        let mut config = run_config_of(
            &request,
            self.options.default_timeout,
            self.options.max_input_bytes,
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;

        let slot = self
            .admission
            .admit(request.input.len(), deadline)
            .await
            .map_err(|e| admission_status(&e))?;
        // Time spent queued counts against the caller's deadline.
        let caller_left =
            match deadline {
                Some(deadline) => {
                    match deadline.checked_duration_since(tokio::time::Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => {
                        return Err(Status::deadline_exceeded(
                            "the caller's deadline passed as the call got its run slot; the function did not run",
                        ))
                    }
                }
                }
                None => None,
            };
        config.timeout = effective_timeout(config.timeout, caller_left);

        let _in_flight = Raised::new(self.metrics.in_flight());
        let result = tokio::select! {
            result = self.runner.run(&request.image, &request.input, &config) => result,
            () = self.abort.cancelled() => {
                return Err(Status::unavailable(
                    "xfn is shutting down: the run was cancelled at the end of the grace period",
                ));
            }
        };
        drop(slot);
        match result {
            Ok(output) => {
                if let Some(usage) = &output.usage {
                    self.metrics.record_usage(usage);
                }
                Ok(output.stdout)
            }
            Err(err) => Err(status_of(&err)),
        }
    }
}

#[tonic::async_trait]
impl<R: FunctionRunner> ContainerizedFunctionRunnerService for RunnerService<R> {
    async fn run_function(
        &self,
        request: Request<pb::RunFunctionRequest>,
    ) -> Result<Response<pb::RunFunctionResponse>, Status> {
        let started = Instant::now();
        let image = request.get_ref().image.clone();
        let mut record = CancelRecord {
            metrics: &self.metrics,
            image: &image,
            started,
            finished: false,
        };
        let result = self.run_checked(request).await;
        record.finished = true;
        let elapsed = started.elapsed();
        match &result {
            Ok(output) => {
                self.metrics.record_run("ok", elapsed);
                tracing::debug!(%image, ?elapsed, output_bytes = output.len(), "function ran");
            }
            Err(status) => {
                self.metrics
                    .record_run(outcome_label(status.code()), elapsed);
                tracing::warn!(%image, ?elapsed, code = ?status.code(), message = status.message(), "function call failed");
            }
        }
        result.map(|output| Response::new(pb::RunFunctionResponse { output }))
    }
}

/// The status of a call that was not admitted.
pub fn admission_status(err: &AdmissionError) -> Status {
    match err {
        AdmissionError::QueueFull { .. } => Status::resource_exhausted(err.to_string()),
        AdmissionError::DeadlinePassed { .. } => Status::deadline_exceeded(err.to_string()),
    }
}

/// Records a call whose future was dropped before it answered: the caller
/// cancelled (or its connection went away), and the run was dropped with it.
struct CancelRecord<'a> {
    metrics: &'a Metrics,
    image: &'a str,
    started: Instant,
    finished: bool,
}

impl Drop for CancelRecord<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let elapsed = self.started.elapsed();
            self.metrics.record_run("cancelled", elapsed);
            tracing::info!(image = %self.image, ?elapsed, "call cancelled by the caller; run stopped");
        }
    }
}

/// A metric label for a status code.
pub fn outcome_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests;
