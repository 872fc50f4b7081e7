//! The `ContainerizedFunctionRunnerService` implementation: validate, then
//! hand the call to the gRPC layer (admission, deadline, drain, metrics)
//! to run the image under.
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::validate::{checked, InvalidRequest};
use crate::chain::Chain;
use crate::grpc::deadline::{deadline_of, effective_timeout};
use crate::grpc::serve::ServiceSet;
use crate::grpc::{status_of, Calls, FunctionRunner, Subject};
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

/// The runner service over any [`FunctionRunner`].
#[derive(Debug)]
pub(crate) struct SidecarService<R> {
    runner: Arc<R>,
    options: ServiceOptions,
    calls: Arc<Calls>,
}

impl<R: FunctionRunner> SidecarService<R> {
    /// A service running functions on `runner`, its calls going through
    /// `calls`.
    pub(crate) fn new(runner: Arc<R>, options: ServiceOptions, calls: Arc<Calls>) -> Self {
        calls
            .metrics()
            .set_limits_enforced(runner.limits_enforced());
        Self {
            runner,
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

    async fn run_checked(
        &self,
        request: Request<pb::RunFunctionRequest>,
    ) -> Result<(Vec<u8>, &'static str), Status> {
        let deadline = deadline_of(&request);
        let (request, mut config) = checked(
            request.into_inner(),
            self.options.default_timeout,
            self.options.max_input_bytes,
        )
        .await
        .map_err(|e| invalid_request_status(&e))?;
        let output = self
            .calls
            .admit(request.input.len(), deadline, |caller_left| async move {
                config.timeout = effective_timeout(config.timeout, caller_left);
                self.runner
                    .run(&request.image, &request.input, &config)
                    .await
                    .map_err(|err| status_of(&err))
            })
            .await?;
        if let Some(usage) = &output.usage {
            self.calls.metrics().record_usage(usage);
        }
        Ok((output.stdout, "ok"))
    }
}

#[tonic::async_trait]
impl<R: FunctionRunner> ContainerizedFunctionRunnerService for SidecarService<R> {
    async fn run_function(
        &self,
        request: Request<pb::RunFunctionRequest>,
    ) -> Result<Response<pb::RunFunctionResponse>, Status> {
        let image = request.get_ref().image.clone();
        let output = self
            .calls
            .answer(Subject::Image(&image), self.run_checked(request))
            .await?;
        Ok(Response::new(pb::RunFunctionResponse { output }))
    }
}

#[cfg(test)]
mod tests;
