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

use tonic::Status;

use super::runtime::{served, Runtime};
use crate::call::{self, FunctionRunner};
use crate::compose::{ComposeError, StartError};
use crate::function_server::{self, Client, ResponseBudget, Server};
use crate::grpc::status_of;
use crate::runner::{RunConfig, Runner};

/// The longest a server may take to listen once its container runs. SDK
/// servers listen within milliseconds (Go) to a second or two (Python); a
/// server that does not is reported by name long before a render's timeout.
pub(super) const MAX_SERVER_START: Duration = Duration::from_secs(30);

/// A Function whose image runs as a gRPC server (`Docker` runtime).
#[derive(Debug)]
pub(crate) struct Docker {
    /// The in-process runner.
    pub(super) runner: Arc<Runner>,
    /// The Function: its name, the image to serve, its pull policy,
    /// credentials and the render's timeout.
    pub(super) function: call::Function,
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
    /// Taken by [`Runtime::stop`].
    server: Mutex<Option<Server>>,
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

#[async_trait::async_trait]
impl Runtime for Docker {
    fn function(&self) -> &call::Function {
        &self.function
    }

    async fn start(&self) -> Result<(), ComposeError> {
        let name = self.function.name.as_deref().unwrap_or_default();
        self.started
            .get_or_try_init(|| async {
                let started = Instant::now();
                let server = start(
                    name,
                    &self.runner,
                    &self.function.image,
                    &self.function.config,
                    &self.env,
                    self.host_network,
                )
                .await?;
                let client = server.client(name, 1, Arc::new(ResponseBudget::one_answer()));
                tracing::debug!(
                    function = %name,
                    image = %self.function.image,
                    elapsed = ?started.elapsed(),
                    "function server started"
                );
                Ok(StartedServer {
                    client,
                    server: Mutex::new(Some(server)),
                })
            })
            .await
            .map(drop)
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

/// The backend of a render's function server: the request on its client;
/// a server that died answers "connection refused", so a failed call says
/// why it died instead, where it did.
#[async_trait::async_trait]
impl FunctionRunner for Docker {
    async fn run_function(
        &self,
        _function: &call::Function,
        request: call::Request,
    ) -> Result<call::Response, Status> {
        let started = self
            .started
            .get()
            .ok_or_else(|| Status::failed_precondition("the function server is not started"))?;
        let status = match served(&started.client, request).await {
            Ok(response) => return Ok(response),
            Err(status) => status,
        };
        let exited = match started.server.lock() {
            Ok(mut server) => server.as_mut().and_then(|s| s.exited()),
            Err(_) => None,
        };
        Err(match exited {
            Some(exit) => {
                let exit = status_of(&exit);
                Status::new(
                    exit.code(),
                    format!("the function server exited: {}", exit.message()),
                )
            }
            None => status,
        })
    }
}
