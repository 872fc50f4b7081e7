//! Function servers, one room: a function image started as a gRPC server
//! through the lifecycle and handed out once it listens ([`start`]), called
//! through one [`Client`] ([`client`]: the one-write request, v1 then
//! v1beta1; [`budget`]: what answers may hold), and watched for its exit by
//! its pidfd ([`Server::exit_watch`]). `xfn host` (which keeps only which
//! server takes a call, idle and stop, and creates each function's next
//! server's container ahead: [`prepare`], [`start_from`]) and render's
//! `Docker`, `Development` and kept servers use it.
//!
//! # Invariants
//! - **Started one way**: as `crossplane render` starts one (its entrypoint
//!   with [`SERVER_ARGS`], listening on [`FUNCTION_PORT`] in its own network
//!   namespace, or on a free loopback port of xfn's network), and handed
//!   out only once it listens; one that exits or never listens first is
//!   stopped and named with its output's tail, so nothing half-started is
//!   left or kept.
//! - **Called one way**: request in, response out, for one named function,
//!   as bytes never decoded here: the shape a request-level runner's
//!   kept-server backend takes, whichever front end calls.
//! - **An exit is told, not polled**: the server's pidfd wakes its watch.
//! - **Arrows point down**: the room uses the runner, the lifecycle, the
//!   sandbox and the gRPC layer's header bounds, and names no front end
//!   (`host/`, `compose/`): a front end's change never reaches it.
pub(crate) mod budget;
pub(crate) mod client;
mod http2;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

pub(crate) use budget::{ResponseBudget, ResponseShare};
pub(crate) use client::{lost_connection, Client, Dial};

use crate::runner::{
    FunctionServer, FunctionServerOptions, Origin, PreparedServer, RunConfig, RunError, Runner,
};
use crate::sandbox::exit_watch::ExitWatch;
use crate::sandbox::netns::NetworkNamespace;

/// Where Crossplane's function SDKs listen by default: a server in its own
/// network namespace has the port to itself.
pub(crate) const FUNCTION_PORT: u16 = 9443;

/// The arguments `crossplane render` runs a function image with (they take
/// the place of the image's `Cmd`).
pub(crate) const SERVER_ARGS: &[&str] = &["--insecure"];

/// Why a function server did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerError {
    /// No loopback port was free for a server on xfn's network.
    #[error("cannot find a free port on 127.0.0.1")]
    Port(#[source] std::io::Error),
    /// Its container could not be made or started (the pull, the image,
    /// the limits, the start's timeout).
    #[error(transparent)]
    Run(RunError),
    /// It exited, or did not listen in time (its exit code, an OOM kill,
    /// its output's tail).
    #[error(transparent)]
    NotListening(RunError),
    /// Its exit cannot be watched (its pidfd cannot be registered).
    #[error("cannot watch its exit")]
    Watch(#[source] std::io::Error),
}

/// A function server that listens, until [`Server::stop`] (or its drop)
/// kills it and removes its container.
#[derive(Debug)]
pub(crate) struct Server {
    served: FunctionServer,
    address: SocketAddr,
    exit: ExitWatch,
}

/// A function server's container created ahead of its start
/// ([`prepare`]), and the loopback port it will be told to listen on
/// when on xfn's network.
#[derive(Debug)]
pub(crate) struct Prepared {
    container: PreparedServer,
    port: Option<u16>,
}

impl Prepared {
    /// Tears it down (off the async threads), awaited.
    pub(crate) async fn discard(self) {
        self.container.discard().await;
    }
}

/// The arguments and port of a server (on xfn's network when
/// `host_network`: a free loopback port instead of [`FUNCTION_PORT`], or
/// `port`, the one it was prepared with).
fn server_args(host_network: bool, port: Option<u16>) -> Result<(Vec<String>, u16), ServerError> {
    let mut args: Vec<String> = SERVER_ARGS.iter().map(|a| a.to_string()).collect();
    // On xfn's network a free loopback port instead (the SDKs take
    // `--address`), so servers never clash and nothing listens beyond the
    // loopback interface.
    if !host_network {
        return Ok((args, FUNCTION_PORT));
    }
    let port = match port {
        Some(port) => port,
        None => free_loopback_port().map_err(ServerError::Port)?,
    };
    args.push(format!("--address=127.0.0.1:{port}"));
    Ok((args, port))
}

/// Creates the container of a server of `image` (as [`start`] would start
/// it, `config.timeout` bounding the creation) ahead of its start.
pub(crate) async fn prepare(
    runner: &Runner,
    image: &str,
    config: &RunConfig,
    env: &[String],
    host_network: bool,
) -> Result<Prepared, ServerError> {
    let (args, port) = server_args(host_network, None)?;
    let options = FunctionServerOptions {
        cmd: &args,
        env,
        host_network,
        log_as: None,
    };
    let container = runner
        .prepare_server(image, options, config)
        .await
        .map_err(ServerError::Run)?;
    tracing::debug!(
        image,
        container = container.id(),
        "function server's container created ahead"
    );
    Ok(Prepared {
        container,
        port: host_network.then_some(port),
    })
}

/// Starts `image` as a function server (with `env` added, on xfn's network
/// when `host_network`; its output logged as `log_as`, the function's name,
/// when it has one) and waits until it listens. `config.timeout` bounds
/// the start and the wait (the pull excluded).
pub(crate) async fn start(
    runner: &Runner,
    image: &str,
    config: &RunConfig,
    env: &[String],
    host_network: bool,
    log_as: Option<&str>,
) -> Result<Server, ServerError> {
    let (server, _) = start_from(None, runner, image, config, env, host_network, log_as).await?;
    Ok(server)
}

/// [`start`] from `prepared`'s container when it fits (the image's digest
/// now, the same settings) and is still there, else from one created now
/// (what does not fit or is gone is discarded). Says which.
pub(crate) async fn start_from(
    prepared: Option<Prepared>,
    runner: &Runner,
    image: &str,
    config: &RunConfig,
    env: &[String],
    host_network: bool,
    log_as: Option<&str>,
) -> Result<(Server, Origin), ServerError> {
    let since = std::time::Instant::now();
    // A port prepared for is given up if something took it meanwhile.
    let (prepared, port) = match prepared {
        Some(Prepared {
            container,
            port: Some(port),
        }) if !port_free(port) => {
            container.discard().await;
            (None, None)
        }
        Some(prepared) => (Some(prepared.container), prepared.port),
        None => (None, None),
    };
    let (args, port) = server_args(host_network, port)?;
    tracing::debug!(image, ?args, "starting the function server");
    let options = FunctionServerOptions {
        cmd: &args,
        env,
        host_network,
        log_as,
    };
    let (mut served, origin) = runner
        .serve_prepared(image, options, config, prepared)
        .await
        .map_err(ServerError::Run)?;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    if let Err(err) = served.wait_listening(address, config.timeout).await {
        served.stop().await;
        return Err(ServerError::NotListening(err));
    }
    tracing::debug!(image, ?origin, listening_at = ?since.elapsed(), "function server listening");
    let exit = match served.exit_watch() {
        Ok(exit) => exit,
        Err(err) => {
            served.stop().await;
            return Err(ServerError::Watch(err));
        }
    };
    Ok((
        Server {
            served,
            address,
            exit,
        },
        origin,
    ))
}

/// Whether nothing listens on `port` of 127.0.0.1 now.
fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A loopback port nothing listens on now (the kernel's pick).
fn free_loopback_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    /// A client of it for `function`, at most `streams` calls at once, its
    /// answers held within `budget`.
    pub(crate) fn client(
        &self,
        function: &str,
        streams: usize,
        budget: Arc<ResponseShare>,
    ) -> Client {
        Client::new(function, self.dial(), streams, budget)
    }

    /// Where it is reached.
    pub(crate) fn dial(&self) -> Dial {
        Dial::Namespace(self.network().clone(), self.address)
    }

    /// The network namespace it listens in.
    pub(crate) fn network(&self) -> &NetworkNamespace {
        self.served.network()
    }

    /// Where it listens inside [`Server::network`].
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Woken when it exits; [`Server::exited`] then says why.
    pub(crate) fn exit_watch(&self) -> &ExitWatch {
        &self.exit
    }

    /// Why it is gone, if it is (its exit code, an OOM kill, its output's
    /// tail).
    pub(crate) fn exited(&mut self) -> Option<RunError> {
        self.served.exited()
    }

    /// Kills it and removes its container, cgroup and rootfs.
    pub(crate) async fn stop(self) {
        self.served.stop().await;
    }
}
