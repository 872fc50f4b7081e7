//! Assembling and running the gRPC server: the runner service, health and
//! reflection, on the bound listener, with a graceful drain on shutdown.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, Router};
use tonic::transport::Server;

use super::listen::{tcp_incoming, unix_incoming, Listener};
use super::peer::CallerPolicy;
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

/// Serves `service` (plus health and reflection) on `listener` until
/// `shutdown` resolves, then stops accepting, lets runs in flight finish
/// within the grace period, cancels the rest, and returns.
pub async fn serve<R: FunctionRunner>(
    listener: Listener,
    policy: Arc<CallerPolicy>,
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
    match listener {
        Listener::Unix(listener) => {
            drain_on(router, unix_incoming(listener, policy), drain, stopping).await
        }
        Listener::Tcp(listener) => drain_on(router, tcp_incoming(listener), drain, stopping).await,
    }
}

async fn drain_on<I, IO>(
    router: Router,
    incoming: I,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    I: Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = router.serve_with_incoming_shutdown(incoming, async move {
        let _ = stopped.await;
    });
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
