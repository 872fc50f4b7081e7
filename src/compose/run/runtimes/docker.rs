//! The `Docker` runtime, without Docker: every Function built with
//! Crossplane's SDKs is a gRPC server, so its image runs rootless through the
//! runner as a server for the length of the render, started as `crossplane
//! render` starts it (its entrypoint with `--insecure`, listening on 9443).
//!
//! By default the server has egress, as upstream's (which joins a Docker
//! bridge network): it shares the host's network and listens on a loopback
//! port xfn picks, never 9443 of the host, so ports never clash. With
//! `runtime-docker-network: none` nothing is published at all: the server
//! listens in the container's own, empty network namespace and xfn connects
//! from inside that namespace (see [`crate::sandbox::netns`]), so no other
//! process on the machine can call it.
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError, StartError};
use crate::proto::v1;
use crate::runner::{FunctionServer, FunctionServerOptions, RunConfig, Runner};

/// A loopback port nothing listens on now (the kernel's pick).
fn free_loopback_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Where Crossplane's function SDKs listen by default.
pub(super) const FUNCTION_PORT: u16 = 9443;

/// The arguments `crossplane render` runs a function image with (they take
/// the place of the image's `Cmd`).
pub(super) const SERVER_ARGS: &[&str] = &["--insecure"];

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

/// A started server and the channel to it.
#[derive(Debug)]
pub(super) struct StartedServer {
    channel: Channel,
    /// Taken by [`FunctionCaller::stop`].
    server: Mutex<Option<FunctionServer>>,
}

impl Docker {
    async fn started(&self) -> Result<&StartedServer, ComposeError> {
        self.started.get_or_try_init(|| self.start_server()).await
    }

    async fn start_server(&self) -> Result<StartedServer, ComposeError> {
        let started = Instant::now();
        let (server, address) = start_function_server(&FunctionServerSpec {
            function: &self.function,
            runner: &self.runner,
            image: &self.image,
            config: &self.config,
            env: &self.env,
            host_network: self.host_network,
        })
        .await?;
        let channel = server.channel(address);
        tracing::debug!(
            function = %self.function,
            image = %self.image,
            elapsed = ?started.elapsed(),
            "function server started"
        );
        Ok(StartedServer {
            channel,
            server: Mutex::new(Some(server)),
        })
    }
}

/// What a function server is started from.
pub(super) struct FunctionServerSpec<'a> {
    /// The Function's name, for errors.
    pub(crate) function: &'a str,
    /// The in-process runner.
    pub(crate) runner: &'a Runner,
    /// The image.
    pub(crate) image: &'a str,
    /// Pull policy, credentials, and the render's timeout.
    pub(crate) config: &'a RunConfig,
    /// `runtime-docker-env`.
    pub(crate) env: &'a [String],
    /// Egress (any `runtime-docker-network` but `none`).
    pub(crate) host_network: bool,
}

/// Starts a function server as `crossplane render` starts it and waits
/// until it listens; returns it and the address it listens on (inside its
/// namespace). A server that exits or never listens is named with the
/// tail of its output.
pub(super) async fn start_function_server(
    spec: &FunctionServerSpec<'_>,
) -> Result<(FunctionServer, SocketAddr), ComposeError> {
    let failed = |source: StartError| ComposeError::FunctionStart {
        function: spec.function.to_string(),
        image: spec.image.to_string(),
        source: Box::new(source),
    };
    // Half the render's time at most, so that a server that never
    // listens is named in the error before the whole render times out.
    let startup = (spec.config.timeout / 2).min(MAX_SERVER_START);
    let mut args: Vec<String> = SERVER_ARGS.iter().map(|a| a.to_string()).collect();
    // In its own namespace the server has 9443 to itself; on the host's
    // network it gets a free loopback port instead (the SDKs take
    // `--address`), so servers never clash and nothing listens beyond
    // the loopback interface.
    let port = if spec.host_network {
        let port = free_loopback_port().map_err(|source| {
            failed(StartError::Io {
                what: "find a free port on",
                path: "127.0.0.1".into(),
                source,
            })
        })?;
        args.push(format!("--address=127.0.0.1:{port}"));
        port
    } else {
        FUNCTION_PORT
    };
    tracing::debug!(
        function = spec.function,
        image = spec.image,
        ?args,
        "starting the function server"
    );
    let mut server = spec
        .runner
        .serve(
            spec.image,
            FunctionServerOptions {
                cmd: &args,
                env: spec.env,
                host_network: spec.host_network,
            },
            &RunConfig {
                timeout: startup,
                ..spec.config.clone()
            },
        )
        .await
        .map_err(|e| failed(e.into()))?;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    if let Err(err) = server.wait_listening(address, startup).await {
        server.stop().await;
        return Err(failed(err.into()));
    }
    Ok((server, address))
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
        let result = super::grpc::run_function(started.channel.clone(), &self.image, request).await;
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
