//! The `Development` runtime: a function server that is already running,
//! or still starting: the first connect is retried for up to a short wait
//! (`--development-wait`), since a function started just before the render
//! (a script's `python fn.py &`) is often not listening yet; a refusal past
//! it says how long render waited and what to check.
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError};
use crate::proto::v1;

/// A function server that is already running (`Development` runtime).
#[derive(Debug)]
pub(crate) struct Development {
    target: String,
    wait: Duration,
    channel: tokio::sync::OnceCell<Channel>,
}

/// How often a connect is tried again while the server may be starting.
const RETRY_EVERY: Duration = Duration::from_millis(50);

impl Development {
    /// A caller of the server at `target` (`host:port`), waiting up to
    /// `wait` for it to accept a connection.
    pub(crate) fn new(target: &str, wait: Duration) -> Self {
        Self {
            target: target.to_string(),
            wait,
            channel: tokio::sync::OnceCell::new(),
        }
    }

    async fn channel(&self) -> Result<Channel, ComposeError> {
        let unreachable = |waited, source| ComposeError::Call {
            target: self.target.clone(),
            source: Box::new(CallError::Connect { waited, source }),
        };
        self.channel
            .get_or_try_init(|| async {
                let uri = if self.target.contains("://") {
                    self.target.clone()
                } else {
                    format!("http://{}", self.target)
                };
                let endpoint =
                    Endpoint::from_shared(uri).map_err(|e| unreachable(Duration::ZERO, e))?;
                let started = Instant::now();
                loop {
                    match endpoint.connect().await {
                        Ok(channel) => return Ok(channel),
                        Err(e) if started.elapsed() >= self.wait => {
                            return Err(unreachable(started.elapsed(), e))
                        }
                        Err(_) => tokio::time::sleep(RETRY_EVERY).await,
                    }
                }
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
