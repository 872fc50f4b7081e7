//! The adaptor: any container that reads a JSON `RunFunctionRequest` on
//! stdin and writes a JSON `RunFunctionResponse` on stdout, served as a
//! modern Crossplane Function (`FunctionRunnerService`, v1 and v1beta1).
//!
//! ```text
//! gRPC call ─► response cache? ─► serving::Calls (run slot, deadline, drain)
//!           ─► Runner::run(image, request JSON)
//!           ─► RunFunctionResponse from stdout ─► meta.tag ─► cache (meta.ttl)
//! ```
//!
//! Listening, admission, draining, metrics and status mapping are the
//! serving layer's ([`crate::grpc`]), shared with `xfn start`.
//!
//! The image is imported or pulled once at start; a call only prepares a
//! rootfs and runs crun.
pub mod cache;
pub mod service;
pub mod transport;
pub mod wrap;

use std::sync::Arc;
use std::time::Instant;

use tonic::Status;

use crate::chain::Chain;
use crate::grpc::deadline::effective_timeout;
use crate::grpc::{status_of, Calls};
use crate::proto::v1 as pb;
use crate::proto_json::{request_to_json, response_from_json};
use crate::runner::{RunConfig, Runner};
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
}

/// How the adaptor runs calls.
#[derive(Debug, Clone)]
pub struct AdaptorOptions {
    /// How errors name the function: the image reference, or the file it
    /// was loaded from.
    pub name: String,
    /// The run configuration of every call (timeout, pull policy, limits).
    pub run: RunConfig,
    /// Responses kept for their `meta.ttl`, or `None` for no cache.
    pub response_cache_size: Option<usize>,
}

/// The adaptor for one image (share it in an `Arc`).
#[derive(Debug)]
pub struct Adaptor {
    runner: Arc<Runner>,
    image: String,
    options: AdaptorOptions,
    cache: Option<ResponseCache>,
    calls: Arc<Calls>,
}

impl Adaptor {
    /// An adaptor running `image` (already in the runner's store) per call,
    /// its calls going through `calls`.
    pub fn new(
        runner: Arc<Runner>,
        image: String,
        options: AdaptorOptions,
        calls: Arc<Calls>,
    ) -> Self {
        calls
            .metrics()
            .set_limits_enforced(runner.limits_unavailable().is_none());
        Self {
            cache: options.response_cache_size.map(ResponseCache::new),
            runner,
            image,
            options,
            calls,
        }
    }

    /// Answers one call due by `deadline`: from the cache, or by running the
    /// container.
    pub async fn run_function(
        &self,
        request: pb::RunFunctionRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<pb::RunFunctionResponse, Status> {
        self.calls
            .answer(&self.options.name, self.answer(request, deadline))
            .await
    }

    /// The response and its outcome label (`ok` or `cache_hit`).
    async fn answer(
        &self,
        request: pb::RunFunctionRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(pb::RunFunctionResponse, &'static str), Status> {
        let input =
            request_to_json(&request).map_err(|e| Status::internal(Chain(&e).to_string()))?;
        let key = self.cache.as_ref().map(|_| CacheKey::of(&request, &input));
        if let (Some(cache), Some(key)) = (&self.cache, &key) {
            if let Some(response) = cache.get(key, Instant::now()) {
                tracing::debug!(?key, "answered from the response cache");
                return Ok((response, "cache_hit"));
            }
        }
        let output = self
            .calls
            .run(input.len(), deadline, |caller_left| {
                let config = RunConfig {
                    timeout: effective_timeout(self.options.run.timeout, caller_left),
                    ..self.options.run.clone()
                };
                let input = &input;
                async move {
                    self.runner
                        .run(&self.image, input, &config)
                        .await
                        .map_err(|err| {
                            let status = status_of(&err);
                            Status::new(
                                status.code(),
                                format!("function {}: {}", self.options.name, status.message()),
                            )
                        })
                }
            })
            .await?;
        if let Some(usage) = &output.usage {
            self.calls.metrics().record_usage(usage);
        }
        let mut response = response_from_json(&output.stdout).map_err(|e| {
            Status::internal(format!(
                "function {}: {} (on its stdout); its stderr: {}",
                self.options.name,
                Chain(&e),
                crate::runner::stderr_tail_text(&output.stderr_tail)
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
        Ok((response, "ok"))
    }
}
