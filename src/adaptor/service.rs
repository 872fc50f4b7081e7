//! The gRPC services: `apiextensions.fn.proto.v1.FunctionRunnerService` and
//! its `v1beta1` twin, served raw ([`crate::proto::raw`]): the two
//! packages' messages are the same bytes on the wire, so both hand the
//! request's bytes to the one [`Adaptor`] and answer with its bytes.
use std::sync::Arc;

use bytes::Bytes;
use tonic::{Request, Response, Status};

use super::Adaptor;
use crate::grpc::deadline::deadline_of;
use crate::proto::raw::{v1, v1beta1};

/// The v1 service over an [`Adaptor`].
#[derive(Debug, Clone)]
pub(crate) struct V1Service(pub Arc<Adaptor>);

/// The v1beta1 service over an [`Adaptor`].
#[derive(Debug, Clone)]
pub(crate) struct V1beta1Service(pub Arc<Adaptor>);

/// Answers one call of either version.
async fn answer(adaptor: &Adaptor, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
    let deadline = deadline_of(&request);
    adaptor
        .call(request.into_inner(), deadline)
        .await
        .map(Response::new)
}

#[async_trait::async_trait]
impl v1::function_runner_service_server::FunctionRunnerService for V1Service {
    async fn run_function(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        answer(&self.0, request).await
    }
}

#[async_trait::async_trait]
impl v1beta1::function_runner_service_server::FunctionRunnerService for V1beta1Service {
    async fn run_function(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        answer(&self.0, request).await
    }
}
