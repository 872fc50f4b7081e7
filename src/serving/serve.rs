//! Assembling and running the gRPC server for either front end: its
//! services plus health and reflection, with the deadline stamp, on the
//! connections it accepts, with a graceful drain on shutdown.
use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::ServingStatus;

use super::deadline::StampArrivalLayer;
use super::listen::tcp_incoming;

/// Errors of serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not load the descriptors.
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The TCP listener could not be registered.
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Where connections come from.
pub enum Incoming {
    /// Unix connections, already accepted (and checked) by the front end.
    Unix(BoxStream<'static, std::io::Result<tokio::net::UnixStream>>),
    /// A bound, non-blocking TCP listener.
    Tcp(std::net::TcpListener),
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(_) => f.write_str("Incoming::Unix"),
            Self::Tcp(listener) => f.debug_tuple("Incoming::Tcp").field(listener).finish(),
        }
    }
}

/// What a front end serves: its gRPC services (named for health) and,
/// optionally, TLS.
#[derive(Debug, Default)]
pub struct Services {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    tls: Option<ServerTlsConfig>,
}

impl Services {
    /// No services yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a gRPC service; health reports it by name.
    pub fn with_service<S>(mut self, service: S) -> Self
    where
        S: tower::Service<
                tonic::codegen::http::Request<tonic::body::Body>,
                Error = std::convert::Infallible,
            > + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.names.push(S::NAME);
        self.routes.add_service(service);
        self
    }

    /// Serves over TLS.
    pub fn with_tls(mut self, tls: ServerTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// How long to wait for connections to close after runs were cancelled.
const AFTER_CANCEL: Duration = Duration::from_secs(5);

/// How the server stops (make it with [`super::Calls::drain`]).
#[derive(Debug, Clone)]
pub struct Drain {
    /// Calls in flight get this long to finish after the shutdown signal.
    pub grace_period: Duration,
    /// Cancelled at the end of the grace period; the calls share it.
    pub abort: CancellationToken,
}

/// Serves `services` (plus health and reflection) on `incoming` until
/// `shutdown` resolves, then stops accepting, lets calls in flight finish
/// within the grace period, cancels the rest, and returns.
pub async fn serve(
    incoming: Incoming,
    services: Services,
    drain: Drain,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let Services { routes, names, tls } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in &names {
        health
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let routes: Routes = routes
        .routes()
        .add_service(health_service)
        .add_service(reflection_v1()?)
        .add_service(reflection_v1alpha()?);
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let router = builder.layer(StampArrivalLayer).add_routes(routes);

    let stopping = async {
        shutdown.await;
        for name in &names {
            health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    match incoming {
        Incoming::Unix(connections) => {
            let server = router.serve_with_incoming_shutdown(connections, stopped);
            drain_on(server, stop, drain, stopping).await
        }
        Incoming::Tcp(listener) => {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let server = router.serve_with_incoming_shutdown(tcp_incoming(listener), stopped);
            drain_on(server, stop, drain, stopping).await
        }
    }
}

fn reflection_v1() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    ServeError,
> {
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?)
}

fn reflection_v1alpha() -> Result<
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
    ServeError,
> {
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?)
}

/// Runs `server` until `shutdown`, then tells it to stop accepting (`stop`)
/// and drains it: calls in flight get the grace period, then are cancelled.
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

/// Resolves on the first SIGTERM or SIGINT: the shutdown both front ends
/// drain on.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop xfn with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
