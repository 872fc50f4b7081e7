//! The gRPC services: `apiextensions.fn.proto.v1.FunctionRunnerService` and
//! its `v1beta1` twin. The two packages define the same messages field for
//! field, so a beta call is re-decoded as v1 and answered by the same code.
use std::sync::Arc;

use prost::Message;
use tonic::{Request, Response, Status};

use super::Adaptor;
use crate::grpc::deadline::deadline_of;
use crate::proto::{v1, v1beta1};

/// The v1 service over an [`Adaptor`].
#[derive(Debug, Clone)]
pub(crate) struct V1Service(pub Arc<Adaptor>);

/// The v1beta1 service over an [`Adaptor`].
#[derive(Debug, Clone)]
pub(crate) struct V1beta1Service(pub Arc<Adaptor>);

#[async_trait::async_trait]
impl v1::function_runner_service_server::FunctionRunnerService for V1Service {
    async fn run_function(
        &self,
        request: Request<v1::RunFunctionRequest>,
    ) -> Result<Response<v1::RunFunctionResponse>, Status> {
        let deadline = deadline_of(&request);
        self.0
            .run_function(request.into_inner(), deadline)
            .await
            .map(Response::new)
    }
}

/// Re-decodes a message of one package as its twin in the other (v1 and
/// v1beta1 are the same messages; `xfn host` serves both the same way).
pub(crate) fn convert<A: Message, B: Message + Default>(message: &A) -> Result<B, Status> {
    B::decode(message.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("cannot convert between v1beta1 and v1: {e}")))
}

#[async_trait::async_trait]
impl v1beta1::function_runner_service_server::FunctionRunnerService for V1beta1Service {
    async fn run_function(
        &self,
        request: Request<v1beta1::RunFunctionRequest>,
    ) -> Result<Response<v1beta1::RunFunctionResponse>, Status> {
        let deadline = deadline_of(&request);
        // The two packages' messages are the same bytes on the wire.
        let wire = bytes::Bytes::from(request.into_inner().encode_to_vec());
        let response = self.0.run_encoded(wire, deadline).await?;
        convert(&response).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beta_and_v1_messages_convert_both_ways() {
        let beta = v1beta1::RunFunctionRequest {
            meta: Some(v1beta1::RequestMeta {
                tag: "t".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v1: v1::RunFunctionRequest = convert(&beta).unwrap();
        assert_eq!(v1.meta.unwrap().tag, "t");
        let response = v1::RunFunctionResponse {
            results: vec![v1::Result {
                message: "m".into(),
                severity: v1::Severity::Warning as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let beta: v1beta1::RunFunctionResponse = convert(&response).unwrap();
        assert_eq!(beta.results[0].message, "m");
        assert_eq!(beta.results[0].severity, v1beta1::Severity::Warning as i32);
    }
}
