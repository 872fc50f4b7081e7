//! Function servers, one room: a function image started as a gRPC server
//! through the lifecycle and handed out once it listens ([`start`]), called
//! through one [`Client`] ([`client`]: the one-write request, v1 then
//! v1beta1; [`budget`]: what answers may hold), and watched for its exit by
//! its pidfd ([`Server::exit_watch`]). `xfn host` (which keeps only which
//! server takes a call, idle and stop) and render's `Docker`, `Development`
//! and kept servers use it.
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

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

pub(crate) use budget::{ResponseBudget, ResponseShare};
pub(crate) use client::{lost_connection, Client, Dial};

use crate::runner::{FunctionServer, FunctionServerOptions, RunConfig, RunError, Runner};
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
    let mut args: Vec<String> = SERVER_ARGS.iter().map(|a| a.to_string()).collect();
    // On xfn's network a free loopback port instead (the SDKs take
    // `--address`), so servers never clash and nothing listens beyond the
    // loopback interface.
    let port = match host_network {
        true => {
            let port = free_loopback_port().map_err(ServerError::Port)?;
            args.push(format!("--address=127.0.0.1:{port}"));
            port
        }
        false => FUNCTION_PORT,
    };
    tracing::debug!(image, ?args, "starting the function server");
    let options = FunctionServerOptions {
        cmd: &args,
        env,
        host_network,
        log_as,
    };
    let mut served = runner
        .serve(image, options, config)
        .await
        .map_err(ServerError::Run)?;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    if let Err(err) = served.wait_listening(address, config.timeout).await {
        served.stop().await;
        return Err(ServerError::NotListening(err));
    }
    let exit = match served.exit_watch() {
        Ok(exit) => exit,
        Err(err) => {
            served.stop().await;
            return Err(ServerError::Watch(err));
        }
    };
    Ok(Server {
        served,
        address,
        exit,
    })
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
