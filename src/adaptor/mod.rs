//! The adaptor: any container that reads a JSON `RunFunctionRequest` on
//! stdin and writes a JSON `RunFunctionResponse` on stdout, served as a
//! modern Crossplane Function (`FunctionRunnerService`, v1 and v1beta1).
//!
//! ```text
//! gRPC call ─► response cache? ─► run slot ─► Runner::run(image, request JSON)
//!           ─► RunFunctionResponse from stdout ─► meta.tag ─► cache (meta.ttl)
//! ```
//!
//! The image is imported or pulled once at start; a call only prepares a
//! rootfs and runs crun.
pub mod cache;
pub mod serve;
pub mod service;
pub mod wrap;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tonic::Status;

use crate::compose::json::{request_to_json, response_from_json};
use crate::proto::v1 as pb;
use crate::runner::{RunConfig, Runner};
use crate::server::metrics::Metrics;
use crate::server::service::outcome_label;
use crate::server::status_of;
use cache::{ttl_of, CacheKey, ResponseCache};

/// Errors of setting the adaptor up.
#[derive(Debug, thiserror::Error)]
pub enum AdaptorError {
    /// The TLS files could not be read.
    #[error("cannot read {path}")]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error(transparent)]
    Serve(#[from] crate::server::serve::ServeError),
}

/// How the adaptor runs calls.
#[derive(Debug, Clone)]
pub struct AdaptorOptions {
    /// How errors name the function: the image reference, or the file it
    /// was loaded from.
    pub name: String,
    /// The run configuration of every call (timeout, pull policy, limits).
    pub run: RunConfig,
    /// Runs at once; later calls wait.
    pub max_concurrent_runs: usize,
    /// Responses kept for their `meta.ttl`, or `None` for no cache.
    pub response_cache_size: Option<usize>,
}

/// The adaptor for one image (share it in an `Arc`).
#[derive(Debug)]
pub struct Adaptor {
    runner: Arc<Runner>,
    image: String,
    options: AdaptorOptions,
    slots: Semaphore,
    cache: Option<ResponseCache>,
    metrics: Arc<Metrics>,
}

/// Counts one in a gauge while alive: a call whose future is dropped (the
/// client went away) still leaves the gauge right.
struct Counted<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Counted<'a> {
    fn new(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The tail of a function's stderr as text for an error message.
fn stderr_text(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim();
    if text.is_empty() {
        "(no stderr)".to_string()
    } else {
        text.to_string()
    }
}

impl Adaptor {
    /// An adaptor running `image` (already in the runner's store) per call.
    pub fn new(
        runner: Arc<Runner>,
        image: String,
        options: AdaptorOptions,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            slots: Semaphore::new(options.max_concurrent_runs.max(1)),
            cache: options.response_cache_size.map(ResponseCache::new),
            runner,
            image,
            options,
            metrics,
        }
    }

    /// The image every call runs.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// Answers one call: from the cache, or by running the container.
    pub async fn run_function(
        &self,
        request: pb::RunFunctionRequest,
    ) -> Result<pb::RunFunctionResponse, Status> {
        let started = Instant::now();
        let result = self.answer(request, started).await;
        match &result {
            Ok((_, true)) => self.metrics.record_run("cache_hit", started.elapsed()),
            Ok((_, false)) => self.metrics.record_run("ok", started.elapsed()),
            Err(status) => self
                .metrics
                .record_run(outcome_label(status.code()), started.elapsed()),
        }
        result.map(|(response, _)| response)
    }

    /// The response and whether it came from the cache.
    async fn answer(
        &self,
        request: pb::RunFunctionRequest,
        started: Instant,
    ) -> Result<(pb::RunFunctionResponse, bool), Status> {
        let input = request_to_json(&request)
            .map_err(|e| Status::internal(format!("cannot encode the request as JSON: {e}")))?;
        let key = self.cache.as_ref().map(|_| CacheKey::of(&request, &input));
        if let (Some(cache), Some(key)) = (&self.cache, &key) {
            if let Some(response) = cache.get(key, started) {
                tracing::debug!(?key, "answered from the response cache");
                return Ok((response, true));
            }
        }
        let output = {
            let closed = |_| Status::unavailable("the adaptor is shutting down");
            // Calls that really wait are counted as queued (as `xfn start` does).
            let _slot = match self.slots.try_acquire() {
                Ok(slot) => slot,
                Err(tokio::sync::TryAcquireError::Closed) => return Err(closed(())),
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    let _queued = Counted::new(self.metrics.queued());
                    self.slots.acquire().await.map_err(|_| closed(()))?
                }
            };
            let _in_flight = Counted::new(self.metrics.in_flight());
            self.runner
                .run(&self.image, &input, &self.options.run)
                .await
        };
        let output = output.map_err(|err| {
            let status = status_of(&err);
            tracing::info!(function = %self.options.name, %err, "call failed");
            Status::new(
                status.code(),
                format!("function {}: {}", self.options.name, status.message()),
            )
        })?;
        let mut response = response_from_json(&output.stdout).map_err(|e| {
            Status::internal(format!(
                "function {} wrote something that is not a RunFunctionResponse to stdout ({e}); its stderr: {}",
                self.options.name,
                stderr_text(&output.stderr_tail)
            ))
        })?;
        let tag = request.meta.map(|m| m.tag).unwrap_or_default();
        let meta = response.meta.get_or_insert_with(Default::default);
        if meta.tag.is_empty() {
            meta.tag = tag;
        }
        if let (Some(cache), Some(key), Some(ttl)) = (&self.cache, key, ttl_of(&response)) {
            cache.insert(key, response.clone(), ttl, Instant::now());
        }
        Ok((response, false))
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.options.run.timeout
    }
}
