//! The `Docker` runtime, without Docker: every Function built with
//! Crossplane's SDKs is a gRPC server, so its image runs rootless through the
//! runner as a server for the length of the render, started as `crossplane
//! render` starts it ([`crate::function_server::start`]).
//!
//! By default the server has egress, as upstream's (which joins a Docker
//! bridge network): it shares the host's network and listens on a loopback
//! port xfn picks, never 9443 of the host, so ports never clash. With
//! `runtime-docker-network: none` nothing is published at all: the server
//! listens in the container's own, empty network namespace and xfn connects
//! from inside that namespace (see [`crate::sandbox::netns`]), so no other
//! process on the machine can call it.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError, StartError};
use crate::function_server::{self, Client, ResponseBudget, Server};
use crate::proto::v1;
use crate::runner::{RunConfig, Runner};

/// The longest a server may take to listen once its container runs. SDK
/// servers listen within milliseconds (Go) to a second or two (Python); a
/// server that does not is reported by name long before a render's timeout.
pub(super) const MAX_SERVER_START: Duration = Duration::from_secs(30);

/// A Function whose image runs as a gRPC server (`Docker` runtime).
#[derive(Debug)]
pub(crate) struct Docker {
    /// The Function's name, for errors.
    pub(super) function: String,
    /// The in-process runner.
    pub(super) runner: Arc<Runner>,
    /// The image to serve.
    pub(super) image: String,
    /// Pull policy, credentials, and the start timeout.
    pub(super) config: RunConfig,
    /// `runtime-docker-env`.
    pub(super) env: Vec<String>,
    /// Egress (any `runtime-docker-network` but `none`).
    pub(super) host_network: bool,
    /// The running server, once started.
    pub(super) started: tokio::sync::OnceCell<StartedServer>,
}

/// A started server and the client of it.
#[derive(Debug)]
pub(super) struct StartedServer {
    client: Client,
    /// Taken by [`FunctionCaller::stop`].
    server: Mutex<Option<Server>>,
}

impl Docker {
    async fn started(&self) -> Result<&StartedServer, ComposeError> {
        self.started.get_or_try_init(|| self.start_server()).await
    }

    async fn start_server(&self) -> Result<StartedServer, ComposeError> {
        let started = Instant::now();
        let server = start(
            &self.function,
            &self.runner,
            &self.image,
            &self.config,
            &self.env,
            self.host_network,
        )
        .await?;
        let client = server.client(&self.function, 1, Arc::new(ResponseBudget::one_answer()));
        tracing::debug!(
            function = %self.function,
            image = %self.image,
            elapsed = ?started.elapsed(),
            "function server started"
        );
        Ok(StartedServer {
            client,
            server: Mutex::new(Some(server)),
        })
    }
}

/// Starts `function`'s server as `crossplane render` starts it and waits
/// until it listens, within half the render's time (at most
/// [`MAX_SERVER_START`]), so that a server that never listens is named in
/// the error before the whole render times out.
pub(super) async fn start(
    function: &str,
    runner: &Runner,
    image: &str,
    config: &RunConfig,
    env: &[String],
    host_network: bool,
) -> Result<Server, ComposeError> {
    let config = RunConfig {
        timeout: (config.timeout / 2).min(MAX_SERVER_START),
        ..config.clone()
    };
    function_server::start(runner, image, &config, env, host_network, None)
        .await
        .map_err(|source| ComposeError::FunctionStart {
            function: function.to_string(),
            image: image.to_string(),
            source: Box::new(StartError::Server(source)),
        })
}

#[async_trait::async_trait(?Send)]
impl FunctionCaller for Docker {
    async fn start(&self) -> Result<(), ComposeError> {
        self.started().await.map(|_| ())
    }

    async fn run_function(
        &self,
        request: v1::RunFunctionRequest,
    ) -> Result<v1::RunFunctionResponse, ComposeError> {
        let started = self.started().await?;
        let result = super::grpc::call(&started.client, &self.image, request).await;
        // A server that died answers "connection refused"; say why it died.
        let exited = match started.server.lock() {
            Ok(mut server) if result.is_err() => server.as_mut().and_then(|s| s.exited()),
            _ => None,
        };
        match exited {
            Some(exit) => Err(ComposeError::Call {
                target: self.image.clone(),
                source: Box::new(CallError::Exited(exit)),
            }),
            None => result,
        }
    }

    async fn stop(&self) {
        let Some(started) = self.started.get() else {
            return;
        };
        let server = started.server.lock().ok().and_then(|mut s| s.take());
        if let Some(server) = server {
            server.stop().await;
        }
    }
}
