//! The gRPC service: `apiextensions.fn.proto.v1.FunctionRunnerService` and
//! its `v1beta1` twin, served raw ([`crate::grpc::raw`]): the two
//! packages' messages are the same bytes on the wire, so both hand the
//! request's bytes to the one [`Adaptor`] and answer with its bytes.
use std::sync::Arc;

use bytes::Bytes;
use tonic::{Request, Status};

use super::Adaptor;
use crate::grpc::deadline::deadline_of;
use crate::grpc::raw::RunFunction;

/// The function service (v1 and v1beta1 alike) over an [`Adaptor`].
#[derive(Debug)]
pub(crate) struct AdaptorService(pub Arc<Adaptor>);

impl RunFunction for AdaptorService {
    async fn run_function(&self, request: Request<Bytes>) -> Result<Bytes, Status> {
        let deadline = deadline_of(&request);
        self.0.call(request.into_inner(), deadline).await
    }
}
