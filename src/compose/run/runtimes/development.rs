//! The `Development` runtime: a function server that is already running,
//! or still starting: the first call retries its connect for up to a short
//! wait (`--development-wait`), since a function started just before the
//! render (a script's `python fn.py &`) is often not listening yet; a
//! refusal past it says how long render waited and what to check, and the
//! step that called.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::Status;

use super::runtime::{served, Runtime};
use crate::call::{self, FunctionRunner};
use crate::chain::Chain;
use crate::compose::read::model::Function;
use crate::compose::CallError;
use crate::function_server::{Client, Dial, ResponseBudget};
use crate::runner::RunConfig;

/// A function server that is already running (`Development` runtime).
#[derive(Debug)]
pub(crate) struct Development {
    function: call::Function,
    target: String,
    wait: Duration,
    client: Client,
    /// Set once the first connect succeeded.
    connected: tokio::sync::OnceCell<()>,
}

/// How often a connect is tried again while the server may be starting.
const RETRY_EVERY: Duration = Duration::from_millis(50);

impl Development {
    /// The runtime of `function`, served at `target` (`host:port`), waiting
    /// up to `wait` for it to accept a connection.
    pub(crate) fn new(function: &Function, target: &str, wait: Duration) -> Self {
        let budget = Arc::new(ResponseBudget::one_answer());
        Self {
            function: call::Function {
                name: Some(function.name.clone()),
                image: function.image().to_string(),
                config: RunConfig::default(),
            },
            target: target.to_string(),
            wait,
            client: Client::new(target, Dial::Tcp(target.to_string()), 1, budget),
            connected: tokio::sync::OnceCell::new(),
        }
    }

    /// Connects, trying again for up to the wait.
    async fn connected(&self) -> Result<(), Status> {
        self.connected
            .get_or_try_init(|| async {
                let started = Instant::now();
                loop {
                    match self.client.connect().await {
                        Ok(()) => return Ok(()),
                        Err(source) if started.elapsed() >= self.wait => {
                            let refused = CallError::Connect {
                                waited: started.elapsed(),
                                source,
                            };
                            return Err(Status::unavailable(Chain(&refused).to_string()));
                        }
                        Err(_) => tokio::time::sleep(RETRY_EVERY).await,
                    }
                }
            })
            .await
            .copied()
    }
}

#[async_trait::async_trait]
impl Runtime for Development {
    fn function(&self) -> &call::Function {
        &self.function
    }

    fn target(&self) -> &str {
        &self.target
    }
}

/// The backend of a running function server: the request on its client.
#[async_trait::async_trait]
impl FunctionRunner for Development {
    async fn run_function(
        &self,
        _function: &call::Function,
        request: call::Request,
    ) -> Result<call::Response, Status> {
        self.connected().await?;
        served(&self.client, request).await
    }
}
