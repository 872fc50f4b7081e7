//! The call seam: the one request-level [`FunctionRunner`] of every front
//! end (`xfn start`, `adapt`, `host`; `render`, `test` by their runtimes),
//! and its layers, a file each, stacked in one place per front end (its
//! `stack`), read top to bottom as a call meets them:
//!
//! ```text
//! record::Recorded    outcome, duration and usage in the metrics; the call's log lines
//! cache::Cached       an answer held for its `meta.ttl` (the adaptor's response cache)
//! admit::Admitted     the daemon's one queue (grpc::Calls): a run slot or a lane's
//! deadline::WithinDeadline   the run's timeout cut to what is left of the caller's deadline
//! backend             a container per call (container.rs, the engine and its pool),
//!                     a function server kept running (host::servers), a render's runtime
//! ```
//!
//! Why one seam: a layer written once holds for every front end (every
//! call of every daemon is counted by `Calls::activity`, waits in the one
//! queue under one `--max-queued-runs`), and a front end is a translation
//! of its protocol onto a [`Request`] plus a stack. As Crossplane's
//! `internal/xfn` wraps its `FunctionRunner.RunFunction(ctx, name, req)`.
//!
//! Invariants: a request is bytes (the function's input: JSON on stdin, or
//! protobuf for a server), handed down without a copy; dropping a call's
//! future stops its run and cleans up after it (a cancelled gRPC call drops
//! it); errors are gRPC statuses, mapped once (`grpc::status`).
pub(crate) mod admit;
pub(crate) mod cache;
pub(crate) mod container;
pub(crate) mod deadline;
pub(crate) mod record;

use bytes::Bytes;
use tokio::time::Instant;
use tonic::Status;

use crate::grpc::Subject;
use crate::runner::{RunConfig, RunUsage};

/// The function a call is for.
#[derive(Debug, Clone)]
pub(crate) struct Function {
    /// Its name (the adaptor's, the host's, render's), or `None` for a
    /// function named by its image (a sidecar call).
    pub(crate) name: Option<String>,
    /// The image it runs.
    pub(crate) image: String,
    /// How its containers run (its timeout is the run's before the
    /// caller's deadline cuts it).
    pub(crate) config: RunConfig,
}

impl Function {
    /// What the call's log lines name: the function, else its image.
    pub(crate) fn subject(&self) -> Subject<'_> {
        match &self.name {
            Some(name) => Subject::Function(name),
            None => Subject::Image(&self.image),
        }
    }
}

/// One call's request.
#[derive(Debug)]
pub(crate) struct Request {
    /// The function's input: what its container reads on stdin, or what
    /// its server is called with.
    pub(crate) input: Bytes,
    /// The instant the caller's deadline passes, if it set one.
    pub(crate) deadline: Option<Instant>,
}

/// One call's answer.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// The function's output: its stdout, or its server's answer.
    pub(crate) output: Bytes,
    /// The tail of what it wrote to stderr (a container's).
    pub(crate) stderr_tail: Vec<u8>,
    /// CPU time and peak memory, where the run had a cgroup of its own.
    pub(crate) usage: Option<RunUsage>,
    /// How it was answered, the `outcome` label it is recorded under:
    /// `ok`, or `cache_hit`.
    pub(crate) outcome: &'static str,
}

impl Response {
    /// An answer of `output` that ran (outcome `ok`).
    pub(crate) fn ran(output: Bytes) -> Self {
        Self {
            output,
            stderr_tail: Vec::new(),
            usage: None,
            outcome: "ok",
        }
    }
}

/// Calls a function: the one method of the seam.
#[async_trait::async_trait]
pub(crate) trait FunctionRunner: Send + Sync {
    /// Answers `request` to `function`. Dropping the returned future must
    /// stop what it started and clean up after it.
    async fn run_function(&self, function: &Function, request: Request)
        -> Result<Response, Status>;
}

/// A shared runner is its runner: its call's future is the runner's own,
/// not one more boxed around it.
impl<R: FunctionRunner + ?Sized> FunctionRunner for std::sync::Arc<R> {
    fn run_function<'a, 'b, 'f>(
        &'a self,
        function: &'b Function,
        request: Request,
    ) -> futures::future::BoxFuture<'f, Result<Response, Status>>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        (**self).run_function(function, request)
    }
}
