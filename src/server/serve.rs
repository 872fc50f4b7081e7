//! Assembling and running the gRPC server: the runner service, health and
//! reflection, on the bound listener, with a graceful drain on shutdown.
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use super::deadline::StampArrivalLayer;
use super::gate::{GateError, GateReceiver};
use super::listen::tcp_incoming;
use super::{FunctionRunner, RunnerService};
use crate::proto::v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerServiceServer;

/// Errors of serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not load the descriptors.
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The gatekeeper channel could not be used.
    #[error(transparent)]
    Gate(#[from] GateError),
    /// The TCP listener could not be registered.
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Where connections come from.
#[derive(Debug)]
pub enum Incoming {
    /// Unix connections, accepted and checked by the gatekeeper.
    Gate(GateReceiver),
    /// TCP connections (unchecked: TCP carries no credentials).
    Tcp(std::net::TcpListener),
}

/// Room for the protobuf framing around an input at the size limit, so an
/// input just over it gets our InvalidArgument rather than tonic's
/// message-size error.
const DECODE_SLACK: usize = 1 << 20;

/// How long to wait for connections to close after runs were cancelled.
const AFTER_CANCEL: Duration = Duration::from_secs(5);

/// How the server stops.
#[derive(Debug, Clone)]
pub struct Drain {
    /// Runs in flight get this long to finish after the shutdown signal.
    pub grace_period: Duration,
    /// Cancelled at the end of the grace period; the service must share it.
    pub abort: CancellationToken,
}

/// Serves `service` (plus health and reflection) on `incoming` until
/// `shutdown` resolves, then stops accepting, lets runs in flight finish
/// within the grace period, cancels the rest, and returns.
pub async fn serve<R: FunctionRunner>(
    incoming: Incoming,
    service: RunnerService<R>,
    drain: Drain,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let max_decode = service
        .options()
        .max_input_bytes
        .saturating_add(DECODE_SLACK);
    let runner = ContainerizedFunctionRunnerServiceServer::new(service)
        .max_decoding_message_size(max_decode)
        .max_encoding_message_size(usize::MAX);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ContainerizedFunctionRunnerServiceServer<RunnerService<R>>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let router = Server::builder()
        .layer(StampArrivalLayer)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(runner);

    let stopping = async {
        shutdown.await;
        health
            .set_not_serving::<ContainerizedFunctionRunnerServiceServer<RunnerService<R>>>()
            .await;
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    match incoming {
        Incoming::Gate(gate) => {
            let server = router.serve_with_incoming_shutdown(gate.incoming()?, stopped);
            drain_on(server, stop, drain, stopping).await
        }
        Incoming::Tcp(listener) => {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let server = router.serve_with_incoming_shutdown(tcp_incoming(listener), stopped);
            drain_on(server, stop, drain, stopping).await
        }
    }
}

/// Runs `server` until `shutdown`, then tells it to stop accepting (`stop`)
/// and drains it: runs in flight get the grace period, then are cancelled.
async fn drain_on(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    stop: tokio::sync::oneshot::Sender<()>,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return Ok(result?),
        () = shutdown => {}
    }
    tracing::info!(grace_period = ?drain.grace_period, "shutting down: no new calls; waiting for runs in flight");
    let _ = stop.send(());
    tokio::select! {
        result = &mut server => {
            tracing::info!("every run finished; stopped");
            return Ok(result?);
        }
        () = tokio::time::sleep(drain.grace_period) => {}
    }
    tracing::warn!("grace period over: cancelling the runs still in flight");
    drain.abort.cancel();
    tokio::select! {
        result = &mut server => Ok(result?),
        () = tokio::time::sleep(AFTER_CANCEL) => {
            tracing::warn!("connections still open after cancelling every run; exiting anyway");
            Ok(())
        }
    }
}
