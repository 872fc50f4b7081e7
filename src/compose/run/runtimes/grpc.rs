//! Calling a function server over gRPC: v1 first, v1beta1 when the server
//! answers Unimplemented (Functions built before v1), as Crossplane does.
use prost::Message;
use tonic::transport::Channel;

use super::{grpc_error, MAX_MESSAGE_BYTES};
use crate::compose::ComposeError;
use crate::proto::{v1, v1beta1};
use crate::proto_json::ProtocolError;

/// Runs the function served on `channel`; `target` names it in errors.
pub(super) async fn run_function(
    channel: Channel,
    target: &str,
    request: v1::RunFunctionRequest,
) -> Result<v1::RunFunctionResponse, ComposeError> {
    let mut client =
        v1::function_runner_service_client::FunctionRunnerServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
    match client.run_function(request.clone()).await {
        Ok(response) => Ok(response.into_inner()),
        // The messages are identical on the wire, so re-encode rather than
        // map field by field.
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            let beta = v1beta1::RunFunctionRequest::decode(request.encode_to_vec().as_slice())
                .map_err(|source| ProtocolError::Decode {
                    what: "v1beta1 RunFunctionRequest",
                    source,
                })?;
            let mut client =
                v1beta1::function_runner_service_client::FunctionRunnerServiceClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES);
            let response = client
                .run_function(beta)
                .await
                .map_err(|s| grpc_error(target, s))?
                .into_inner();
            v1::RunFunctionResponse::decode(response.encode_to_vec().as_slice()).map_err(|source| {
                ProtocolError::Decode {
                    what: "v1 RunFunctionResponse",
                    source,
                }
                .into()
            })
        }
        Err(status) => Err(grpc_error(target, status)),
    }
}
