//! The adaptor: any container that reads a JSON `RunFunctionRequest` on
//! stdin and writes a JSON `RunFunctionResponse` on stdout, served as a
//! modern Crossplane Function (`FunctionRunnerService`, v1 and v1beta1,
//! served raw: a request's bytes on the wire are what it is given).
//!
//! Its call, as [`stack`] stacks it (`crate::call`'s layers):
//!
//! ```text
//! gRPC call ─► Recorded (metrics, log lines) ─► Json (request as JSON; stdout as the response, meta.tag)
//!           ─► Cached (the response cache, when on) ─► Admitted (grpc::Calls: run slot, drain)
//!           ─► WithinDeadline (run timeout) ─► Runner (a container per call)
//! ```
//!
//! A held answer is given before the call waits for a run slot; a queued
//! call holds only the JSON its admission counts, never the decoded
//! request. Listening, draining and status mapping are the gRPC layer's
//! ([`crate::grpc`]), shared with `xfn start` and `xfn host` (whose
//! stdin/stdout functions are adaptors).
//!
//! The image is imported or pulled once at start; a call only prepares a
//! rootfs and runs crun.
pub(crate) mod json;
pub(crate) mod service;
pub(crate) mod transport;
pub(crate) mod wrap;

use std::sync::Arc;

use bytes::Bytes;
use tonic::Status;

use crate::call::admit::Admitted;
use crate::call::cache::Cached;
use crate::call::deadline::WithinDeadline;
use crate::call::record::Recorded;
use crate::call::{Function, FunctionRunner, Request};
use crate::grpc::Calls;
use crate::runner::{RunConfig, Runner};
use json::Json;

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

/// The adaptor's call, top to bottom: see the module's header (`xfn
/// host`'s stdin/stdout functions too, without the cache).
pub(crate) fn stack(
    runner: Arc<Runner>,
    calls: &Arc<Calls>,
    response_cache_size: Option<usize>,
) -> Box<dyn FunctionRunner> {
    let admitted = Admitted::new(calls, WithinDeadline(runner));
    match response_cache_size {
        Some(capacity) => Box::new(Recorded::new(calls, Json(Cached::new(capacity, admitted)))),
        None => Box::new(Recorded::new(calls, Json(admitted))),
    }
}

/// The adaptor for one image (share it in an `Arc`).
pub(crate) struct Adaptor {
    function: Function,
    stack: Box<dyn FunctionRunner>,
}

impl std::fmt::Debug for Adaptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adaptor")
            .field("function", &self.function)
            .finish_non_exhaustive()
    }
}

impl Adaptor {
    /// An adaptor running `image` (already in the runner's store) per call
    /// on `runner`, its calls going through `calls`.
    pub(crate) fn new(
        runner: Arc<Runner>,
        image: String,
        options: AdaptorOptions,
        calls: &Arc<Calls>,
    ) -> Self {
        Self {
            stack: stack(runner, calls, options.response_cache_size),
            function: Function {
                name: Some(options.name),
                image,
                config: options.run,
            },
        }
    }

    /// Answers one call due by `deadline`: a `RunFunctionRequest` as it
    /// came on the wire (v1 or v1beta1: the same bytes), answered with a
    /// `RunFunctionResponse` as it goes on the wire.
    pub(crate) async fn call(
        &self,
        request: Bytes,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Bytes, Status> {
        let request = Request {
            input: request,
            deadline,
        };
        let response = self.stack.run_function(&self.function, request).await?;
        Ok(response.output)
    }
}
