//! A render's call of a function server: the request encoded, sent on the
//! one client of function servers ([`crate::function_server::Client`]: v1
//! first, v1beta1 when the server answers Unimplemented), the answer
//! decoded.
use bytes::Bytes;
use prost::Message;

use super::grpc_error;
use crate::compose::ComposeError;
use crate::function_server::Client;
use crate::proto::v1;
use crate::proto_json::ProtocolError;

/// Calls the function served behind `client`; `target` names it in errors.
pub(super) async fn call(
    client: &Client,
    target: &str,
    request: v1::RunFunctionRequest,
) -> Result<v1::RunFunctionResponse, ComposeError> {
    let request = Bytes::from(request.encode_to_vec());
    let response = client
        .call(&request, None)
        .await
        .map_err(|status| grpc_error(target, status))?;
    v1::RunFunctionResponse::decode(response).map_err(|source| {
        ProtocolError::Decode {
            what: "v1 RunFunctionResponse",
            source,
        }
        .into()
    })
}
