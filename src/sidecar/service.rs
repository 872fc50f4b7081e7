//! The `ContainerizedFunctionRunnerService` implementation: validate, then
//! hand the call to its stack ([`crate::call`]'s layers: metrics,
//! admission, deadline) over the engine.
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::validate::{checked, InvalidRequest};
use crate::call::admit::Admitted;
use crate::call::deadline::WithinDeadline;
use crate::call::record::Recorded;
use crate::call::{self, Function, FunctionRunner};
use crate::chain::Chain;
use crate::grpc::deadline::deadline_of;
use crate::grpc::serve::ServiceSet;
use crate::grpc::{Calls, Subject};
use crate::proto::v1alpha1 as pb;
use crate::proto::v1alpha1::containerized_function_runner_service_server::{
    ContainerizedFunctionRunnerService, ContainerizedFunctionRunnerServiceServer,
};

/// Tunables of the service.
#[derive(Debug, Clone)]
pub(crate) struct ServiceOptions {
    /// Run timeout when the request names none (Crossplane's runner: 25 s).
    pub(crate) default_timeout: Duration,
    /// Largest accepted input.
    pub(crate) max_input_bytes: usize,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(25),
            max_input_bytes: 4 << 20,
        }
    }
}

/// The status of a request refused before it ran (InvalidArgument), with
/// its chain: the field, then what is wrong with it.
pub(super) fn invalid_request_status(err: &InvalidRequest) -> Status {
    Status::invalid_argument(Chain(err).to_string())
}

/// Room for the protobuf framing around an input at the size limit, so an
/// input just over it gets our InvalidArgument rather than tonic's
/// message-size error.
const DECODE_SLACK: usize = 1 << 20;

/// The sidecar's call, top to bottom: recorded (metrics, `image=` log
/// lines), admitted (the daemon's one queue), its run's timeout within the
/// caller's deadline, on `backend` (the engine: a container per call).
type Stack<R> = Recorded<Admitted<WithinDeadline<Arc<R>>>>;

fn stack<R>(backend: Arc<R>, calls: &Arc<Calls>) -> Stack<R> {
    Recorded::new(calls, Admitted::new(calls, WithinDeadline(backend)))
}

/// The runner service over any [`FunctionRunner`].
#[derive(Debug)]
pub(crate) struct SidecarService<R> {
    stack: Stack<R>,
    options: ServiceOptions,
    calls: Arc<Calls>,
}

impl<R: FunctionRunner + 'static> SidecarService<R> {
    /// A service running functions on `backend`, its calls going through
    /// `calls`.
    pub(crate) fn new(backend: Arc<R>, options: ServiceOptions, calls: Arc<Calls>) -> Self {
        Self {
            stack: stack(backend, &calls),
            options,
            calls,
        }
    }

    /// The service as the gRPC layer serves it, with its message limits.
    pub(crate) fn into_service_set(self) -> ServiceSet {
        let max_decode = self.options.max_input_bytes.saturating_add(DECODE_SLACK);
        ServiceSet::new().with_service(
            ContainerizedFunctionRunnerServiceServer::new(self)
                .max_decoding_message_size(max_decode)
                .max_encoding_message_size(usize::MAX),
        )
    }
}

#[tonic::async_trait]
impl<R: FunctionRunner + 'static> ContainerizedFunctionRunnerService for SidecarService<R> {
    async fn run_function(
        &self,
        request: Request<pb::RunFunctionRequest>,
    ) -> Result<Response<pb::RunFunctionResponse>, Status> {
        let deadline = deadline_of(&request);
        let image = request.get_ref().image.clone();
        let checked = checked(
            request.into_inner(),
            self.options.default_timeout,
            self.options.max_input_bytes,
        )
        .await;
        let (request, config) = match checked {
            Ok(checked) => checked,
            // Refused before it ran, and recorded as every answer is.
            Err(e) => {
                let refused = async { Err(invalid_request_status(&e)) };
                return self.calls.answer(Subject::Image(&image), refused).await;
            }
        };
        let function = Function {
            name: None,
            image: request.image,
            config,
        };
        let request = call::Request {
            input: request.input.into(),
            deadline,
        };
        let response = self.stack.run_function(&function, request).await?;
        Ok(Response::new(pb::RunFunctionResponse {
            output: response.output.into(),
        }))
    }
}

#[cfg(test)]
mod tests;
