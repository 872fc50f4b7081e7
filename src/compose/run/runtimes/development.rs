//! The `Development` runtime: a function server that is already running,
//! or still starting: the first connect is retried for up to a short wait
//! (`--development-wait`), since a function started just before the render
//! (a script's `python fn.py &`) is often not listening yet; a refusal past
//! it says how long render waited and what to check.
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError};
use crate::function_server::{Client, Dial, ResponseBudget};
use crate::proto::v1;

/// A function server that is already running (`Development` runtime).
#[derive(Debug)]
pub(crate) struct Development {
    target: String,
    wait: Duration,
    client: Client,
    /// Set once the first connect succeeded.
    connected: tokio::sync::OnceCell<()>,
}

/// How often a connect is tried again while the server may be starting.
const RETRY_EVERY: Duration = Duration::from_millis(50);

impl Development {
    /// A caller of the server at `target` (`host:port`), waiting up to
    /// `wait` for it to accept a connection.
    pub(crate) fn new(target: &str, wait: Duration) -> Self {
        let budget = Arc::new(ResponseBudget::one_answer());
        Self {
            target: target.to_string(),
            wait,
            client: Client::new(target, Dial::Tcp(target.to_string()), 1, budget),
            connected: tokio::sync::OnceCell::new(),
        }
    }

    /// Connects, trying again for up to the wait.
    async fn connected(&self) -> Result<(), ComposeError> {
        self.connected
            .get_or_try_init(|| async {
                let started = Instant::now();
                loop {
                    match self.client.connect().await {
                        Ok(()) => return Ok(()),
                        Err(source) if started.elapsed() >= self.wait => {
                            return Err(ComposeError::Call {
                                target: self.target.clone(),
                                source: Box::new(CallError::Connect {
                                    waited: started.elapsed(),
                                    source,
                                }),
                            })
                        }
                        Err(_) => tokio::time::sleep(RETRY_EVERY).await,
                    }
                }
            })
            .await
            .copied()
    }
}

#[async_trait::async_trait(?Send)]
impl FunctionCaller for Development {
    async fn run_function(
        &self,
        request: v1::RunFunctionRequest,
    ) -> Result<v1::RunFunctionResponse, ComposeError> {
        self.connected().await?;
        super::grpc::call(&self.client, &self.target, request).await
    }
}
