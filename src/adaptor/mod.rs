//! The adaptor: any container that reads a JSON `RunFunctionRequest` on
//! stdin and writes a JSON `RunFunctionResponse` on stdout, served as a
//! modern Crossplane Function (`FunctionRunnerService`, v1 and v1beta1).
//!
//! ```text
//! gRPC call ─► request JSON ─► held by the cache layer? ─► grpc::Calls (run slot, deadline, drain)
//!           ─► FunctionRunner::run(image, request JSON): [CachedRunner ─►] Runner
//!           ─► RunFunctionResponse from stdout ─► meta.tag
//! ```
//!
//! The response cache is a layer over the runner ([`cache::CachedRunner`]);
//! a held answer is given before the call waits for a run slot.
//!
//! Listening, admission, draining, metrics and status mapping are the
//! gRPC layer's ([`crate::grpc`]), shared with `xfn start`.
//!
//! The image is imported or pulled once at start; a call only prepares a
//! rootfs and runs crun.
pub(crate) mod cache;
pub(crate) mod service;
pub(crate) mod transport;
pub(crate) mod wrap;

use std::sync::Arc;

use prost::Message;
use tonic::Status;

use crate::chain::Chain;
use crate::grpc::deadline::effective_timeout;
use crate::grpc::{status_of, Calls, FunctionRunner, Subject};
use crate::proto::v1 as pb;
use crate::proto_json::{request_json_from_wire, response_from_json};
use crate::runner::RunConfig;
use cache::CachedRunner;

/// Errors of setting the adaptor up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdaptorError {
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
pub(crate) struct AdaptorOptions {
    /// How errors name the function: the image reference, or the file it
    /// was loaded from.
    pub(crate) name: String,
    /// The run configuration of every call (timeout, pull policy, limits).
    pub(crate) run: RunConfig,
    /// Responses kept for their `meta.ttl`, or `None` for no cache.
    pub(crate) response_cache_size: Option<usize>,
}

/// The adaptor for one image (share it in an `Arc`).
pub(crate) struct Adaptor {
    /// The engine, behind the response cache when there is one.
    runner: Arc<dyn FunctionRunner>,
    image: String,
    options: AdaptorOptions,
    calls: Arc<Calls>,
}

impl std::fmt::Debug for Adaptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adaptor")
            .field("image", &self.image)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Adaptor {
    /// An adaptor running `image` (already in the runner's store) per call
    /// on `runner` (wrapped in the response cache the options ask for),
    /// its calls going through `calls`.
    pub(crate) fn new(
        runner: Arc<dyn FunctionRunner>,
        image: String,
        options: AdaptorOptions,
        calls: Arc<Calls>,
    ) -> Self {
        calls
            .metrics()
            .set_limits_enforced(runner.limits_enforced());
        let runner = match options.response_cache_size {
            Some(capacity) => Arc::new(CachedRunner::new(runner, capacity)),
            None => runner,
        };
        Self {
            runner,
            image,
            options,
            calls,
        }
    }

    /// Answers one call due by `deadline`: from the cache, or by running the
    /// container.
    pub(crate) async fn run_function(
        &self,
        request: pb::RunFunctionRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<pb::RunFunctionResponse, Status> {
        let wire = bytes::Bytes::from(request.encode_to_vec());
        drop(request);
        self.run_encoded(wire, deadline).await
    }

    /// [`Self::run_function`] of a request as it came on the wire (v1 or
    /// v1beta1), never decoded into a message tree (`xfn host`).
    pub(crate) async fn run_encoded(
        &self,
        request: bytes::Bytes,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<pb::RunFunctionResponse, Status> {
        let call = Call::from_wire(&request)?;
        drop(request);
        self.calls
            .answer(
                Subject::Function(&self.options.name),
                self.answer(call, deadline),
            )
            .await
    }

    /// The response and its outcome label (`ok` or `cache_hit`).
    async fn answer(
        &self,
        call: Call,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(pb::RunFunctionResponse, &'static str), Status> {
        let Call { input, tag } = call;
        if let Some(output) = self.runner.held(&self.image, &input) {
            tracing::debug!(function = %self.options.name, "answered from the response cache");
            return Ok((self.response(&tag, &output)?, "cache_hit"));
        }
        let output = self
            .calls
            .admit(input.len(), deadline, |caller_left| {
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
        Ok((self.response(&tag, &output)?, "ok"))
    }

    /// The response a run wrote, its `meta.tag` the request's unless it
    /// set its own.
    fn response(
        &self,
        tag: &str,
        output: &crate::runner::RunOutput,
    ) -> Result<pb::RunFunctionResponse, Status> {
        let mut response = response_from_json(&output.stdout).map_err(|e| {
            Status::internal(format!(
                "function {}: {} (on its stdout); its stderr: {}",
                self.options.name,
                Chain(&e),
                crate::runner::stderr_tail_text(&output.stderr_tail)
            ))
        })?;
        let meta = response.meta.get_or_insert_with(Default::default);
        if meta.tag.is_empty() {
            meta.tag = tag.to_string();
        }
        Ok(response)
    }
}

/// A call as its run takes it: the request as JSON and the tag its
/// response carries. Made before the call waits for a run slot, so a
/// queued call holds only what admission counts (the JSON), never the
/// decoded request: 4 MiB of empty values decode to ~76 MiB of tree.
struct Call {
    input: Vec<u8>,
    tag: String,
}

impl Call {
    fn from_wire(wire: &[u8]) -> Result<Self, Status> {
        let (input, tag) =
            request_json_from_wire(wire).map_err(|e| Status::internal(Chain(&e).to_string()))?;
        Ok(Self { input, tag })
    }
}
