//! The `Development` runtime: a function server that is already running.
use prost::Message;
use tonic::transport::{Channel, Endpoint};

use super::{error_chain, grpc_error, MAX_MESSAGE_BYTES};
use crate::compose::v1::FunctionCaller;
use crate::compose::ComposeError;
use crate::proto::{v1, v1beta1};

/// A function server that is already running (`Development` runtime).
#[derive(Debug)]
pub struct Development {
    target: String,
    channel: tokio::sync::OnceCell<Channel>,
}

impl Development {
    /// A caller of the server at `target` (`host:port`).
    pub fn new(target: &str) -> Self {
        Self {
            target: target.to_string(),
            channel: tokio::sync::OnceCell::new(),
        }
    }

    async fn channel(&self) -> Result<Channel, ComposeError> {
        let unreachable = |e: String| {
            ComposeError::Call(format!(
                "cannot reach the function server at {}: {e}",
                self.target
            ))
        };
        self.channel
            .get_or_try_init(|| async {
                let uri = if self.target.contains("://") {
                    self.target.clone()
                } else {
                    format!("http://{}", self.target)
                };
                Endpoint::from_shared(uri)
                    .map_err(|e| unreachable(e.to_string()))?
                    .connect()
                    .await
                    .map_err(|e| unreachable(error_chain(&e)))
            })
            .await
            .cloned()
    }
}

#[async_trait::async_trait(?Send)]
impl FunctionCaller for Development {
    async fn run_function(
        &self,
        request: v1::RunFunctionRequest,
    ) -> Result<v1::RunFunctionResponse, ComposeError> {
        let channel = self.channel().await?;
        let mut client =
            v1::function_runner_service_client::FunctionRunnerServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES);
        match client.run_function(request.clone()).await {
            Ok(response) => Ok(response.into_inner()),
            // Functions built before v1 only serve v1beta1; the messages are
            // identical on the wire, so re-encode rather than map by hand.
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                let beta = v1beta1::RunFunctionRequest::decode(request.encode_to_vec().as_slice())
                    .map_err(|e| ComposeError::Protocol(e.to_string()))?;
                let mut client =
                    v1beta1::function_runner_service_client::FunctionRunnerServiceClient::new(
                        channel,
                    )
                    .max_decoding_message_size(MAX_MESSAGE_BYTES);
                let response = client
                    .run_function(beta)
                    .await
                    .map_err(|s| grpc_error(&self.target, &s))?
                    .into_inner();
                v1::RunFunctionResponse::decode(response.encode_to_vec().as_slice())
                    .map_err(|e| ComposeError::Protocol(e.to_string()))
            }
            Err(status) => Err(grpc_error(&self.target, &status)),
        }
    }
}
