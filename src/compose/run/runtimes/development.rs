//! The `Development` runtime: a function server that is already running.
use tonic::transport::{Channel, Endpoint};

use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError};
use crate::proto::v1;

/// A function server that is already running (`Development` runtime).
#[derive(Debug)]
pub(crate) struct Development {
    target: String,
    channel: tokio::sync::OnceCell<Channel>,
}

impl Development {
    /// A caller of the server at `target` (`host:port`).
    pub(crate) fn new(target: &str) -> Self {
        Self {
            target: target.to_string(),
            channel: tokio::sync::OnceCell::new(),
        }
    }

    async fn channel(&self) -> Result<Channel, ComposeError> {
        let unreachable = |e| ComposeError::Call {
            target: self.target.clone(),
            source: Box::new(CallError::Connect(e)),
        };
        self.channel
            .get_or_try_init(|| async {
                let uri = if self.target.contains("://") {
                    self.target.clone()
                } else {
                    format!("http://{}", self.target)
                };
                Endpoint::from_shared(uri)
                    .map_err(unreachable)?
                    .connect()
                    .await
                    .map_err(unreachable)
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
        super::grpc::run_function(channel, &self.target, request).await
    }
}
