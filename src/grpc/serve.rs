//! Assembling and running the gRPC server for either front end: its
//! services plus health and reflection, with the deadline stamp, on the
//! connections it accepts, with a graceful drain on shutdown.
//!
//! Each connection is served by a tonic server of its own (a clone of one
//! server and its [`Services`], over a stream that yields that one
//! connection): tonic's server
//! keeps everything it does per call (the `grpc-timeout` timer the
//! deadline stamp relies on, error recovery, TLS) but offers no way to
//! close one connection gracefully; its shutdown signal does that when the
//! server holds a single connection. [`super::connections`] decides when.
//! Connections are accepted (and admitted under the cap) here, and each is
//! then served on one serving thread ([`super::threads`]): its socket is
//! registered with that thread's reactor, never with the accepting one's.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::ServingStatus;

use super::authority::{LenientAuthority, MAX_HEADER_LIST};
use super::connections::{Connections, CountCallsLayer, Tracked};
use super::deadline::StampArrivalLayer;
use super::listen::tcp_incoming;
use super::route::{Served, Services, ServicesBuilder};
use super::sni::{SniConfigs, SniStream};

/// Errors of serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not load the descriptors.
    #[error("cannot build the reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("the gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
    /// The TCP listener could not be registered.
    #[error("cannot listen")]
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
#[derive(Default)]
pub struct ServiceSet {
    routes: ServicesBuilder,
    names: Vec<&'static str>,
    tls: Option<ServerTlsConfig>,
    sni: Option<Arc<dyn SniConfigs>>,
}

impl std::fmt::Debug for ServiceSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSet")
            .field("names", &self.names)
            .field("tls", &self.tls.is_some())
            .field("sni", &self.sni.is_some())
            .finish_non_exhaustive()
    }
}

impl ServiceSet {
    /// No services yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a gRPC service; health reports it by name.
    pub(crate) fn with_service<S: Served>(mut self, service: S) -> Self {
        self.names.push(S::NAME);
        self.routes.add(service);
        self
    }

    /// Serves over TLS.
    pub fn with_tls(mut self, tls: ServerTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Serves TCP over TLS with the configuration `sni` gives the name each
    /// client dialled (see [`super::sni`]); replaces [`Self::with_tls`].
    pub(crate) fn with_sni_tls(mut self, sni: Arc<dyn SniConfigs>) -> Self {
        self.tls = None;
        self.sni = Some(sni);
        self
    }
}

/// How long to wait for connections to close after runs were cancelled.
const AFTER_CANCEL: Duration = Duration::from_secs(5);

/// How the server stops (make it with [`super::Calls::drain`]).
#[derive(Debug, Clone)]
pub(crate) struct Drain {
    /// Calls in flight get this long to finish after the shutdown signal.
    pub(crate) grace_period: Duration,
    /// Cancelled at the end of the grace period; the calls share it.
    pub(crate) abort: CancellationToken,
}

/// Serves `services` (plus health and reflection) on `incoming`, each
/// connection under the bounds of `connections`, until `shutdown`
/// resolves, then stops accepting, lets calls in flight finish within the
/// grace period, cancels the rest, and returns.
pub(crate) async fn serve(
    incoming: Incoming,
    services: ServiceSet,
    connections: Arc<Connections>,
    drain: Drain,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let ServiceSet {
        mut routes,
        names,
        tls,
        sni,
    } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in &names {
        health
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    routes.add(health_service);
    routes.add(reflection_v1()?);
    routes.add(reflection_v1alpha()?);
    let services = routes.build();
    // h2's default already, said here so the `:authority` fix-up decodes
    // under the same bound h2 announces and refuses past.
    let max_header_list = u32::try_from(MAX_HEADER_LIST).unwrap_or(u32::MAX);
    let mut builder = Server::builder().http2_max_header_list_size(max_header_list);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let router = Serving {
        server: builder.layer(CountCallsLayer).layer(StampArrivalLayer),
        services,
    };

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
    // Accepted here, each connection is served on a serving thread,
    // registered with that thread's reactor (`super::threads`).
    match incoming {
        Incoming::Unix(incoming) => {
            let incoming = incoming.map(|io| io.and_then(tokio::net::UnixStream::into_std));
            let spawn = hand_over(
                |io| tokio::net::UnixStream::from_std(io).map(LenientAuthority::new),
                move |io, connections| serve_one(router, io, connections),
            );
            let server = serve_each(incoming, connections, stopped, spawn);
            drain_on(server, stop, drain, stopping).await
        }
        Incoming::Tcp(listener) => {
            let incoming = tcp_incoming(listener)?;
            let adopt = tokio::net::TcpStream::from_std;
            match sni {
                Some(sni) => {
                    let timeout = connections.limits().handshake_timeout;
                    let spawn = hand_over(adopt, move |io, connections| {
                        serve_one_sni(router, io, connections, sni, timeout)
                    });
                    let server = serve_each(incoming, connections, stopped, spawn);
                    drain_on(server, stop, drain, stopping).await
                }
                None => {
                    let spawn = hand_over(adopt, move |io, connections| {
                        serve_one(router, io, connections)
                    });
                    let server = serve_each(incoming, connections, stopped, spawn);
                    drain_on(server, stop, drain, stopping).await
                }
            }
        }
    }
}

/// What [`serve_each`] does with each admitted connection: hands it to a
/// serving thread, where `adopt` registers its socket with that thread's
/// reactor and `serve` serves it.
fn hand_over<S, J, F, Fut>(
    adopt: fn(S) -> std::io::Result<J>,
    serve: F,
) -> impl Fn(Tracked<S>, Arc<Connections>)
where
    S: Send + 'static,
    J: Send + 'static,
    F: FnOnce(Tracked<J>, Arc<Connections>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    move |io, connections| {
        let serve = serve.clone();
        super::threads::serve_connection(async move {
            match io.adopt(adopt) {
                Ok(io) => serve(io, connections).await,
                Err(err) => {
                    tracing::debug!(error = %crate::chain::Chain(&err), "cannot serve a connection on its thread");
                }
            }
        });
    }
}

/// Takes connections from `incoming` into `connections` (which may refuse
/// them) and has `spawn` serve each, until `stop` resolves or `incoming`
/// ends; then asks every connection to close and returns once all have.
async fn serve_each<IO>(
    incoming: impl futures::Stream<Item = std::io::Result<IO>>,
    connections: Arc<Connections>,
    stop: impl Future<Output = ()>,
    spawn: impl Fn(Tracked<IO>, Arc<Connections>),
) -> Result<(), tonic::transport::Error>
where
    IO: std::os::fd::AsRawFd + Send + 'static,
{
    let mut incoming = Box::pin(incoming);
    tokio::pin!(stop);
    loop {
        // At most one over the cap held open, whatever the flood: the next
        // connection is taken only once there is room for it.
        tokio::select! {
            () = &mut stop => break,
            () = connections.room() => {}
        }
        tokio::select! {
            () = &mut stop => break,
            next = incoming.next() => match next {
                // The gatekeeper is gone: no caller can connect any more.
                None => break,
                Some(Err(err)) => tracing::debug!(error = %crate::chain::Chain(&err), "accepting a connection failed"),
                Some(Ok(io)) => {
                    if let Some(tracked) = connections.admit(io) {
                        spawn(tracked, Arc::clone(&connections));
                    }
                }
            },
        }
    }
    // Stop accepting first: for the gatekeeper's channel this ends the
    // gatekeeper, whose exit closes the listening socket, so new callers
    // are refused rather than left waiting through the drain.
    drop(incoming);
    connections.drain().await;
    Ok(())
}

/// A tonic server (its layers, TLS, h2 settings) and what it serves.
#[derive(Clone)]
struct Serving<L> {
    server: Server<L>,
    services: Services,
}

/// What [`serve_each`] needs of a router: to serve one connection until a
/// signal (`Server::serve_with_incoming_shutdown`, with its bounds spelled
/// once here).
pub(crate) trait ConnectionRouter<IO>: Clone + Send + 'static {
    /// Serves `io` until `stop`, then closes it gracefully.
    fn serve_one(
        self,
        io: IO,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = Result<(), tonic::transport::Error>> + Send;
}

impl<L, IO, ResBody> ConnectionRouter<IO> for Serving<L>
where
    L: tower::Layer<Services> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<ResBody>,
        > + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<tonic::codegen::http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as tower::Service<tonic::codegen::http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    fn serve_one(
        self,
        io: IO,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = Result<(), tonic::transport::Error>> + Send {
        // The stream must not end after its one connection: tonic takes
        // the end of its incoming stream as the signal to shut down.
        let one = futures::stream::once(async move { Ok::<_, std::io::Error>(io) })
            .chain(futures::stream::pending());
        self.server
            .serve_with_incoming_shutdown(self.services, one, stop)
    }
}

/// Serves one admitted connection until it ends, under its bounds.
async fn serve_one<R, IO>(router: R, io: Tracked<IO>, connections: Arc<Connections>)
where
    R: ConnectionRouter<Tracked<IO>>,
{
    let conn = Arc::clone(io.conn());
    let stop = Arc::clone(&conn).close_requested();
    let (served, ()) = tokio::join!(router.serve_one(io, stop), connections.watch(&conn));
    if let Err(err) = served {
        tracing::debug!(error = %crate::chain::Chain(&err), "serving a connection failed");
    }
}

/// Serves one admitted TCP connection after its SNI-routed TLS handshake
/// (refused or failed: closed), until it ends, under its bounds.
async fn serve_one_sni<R, IO>(
    router: R,
    io: Tracked<IO>,
    connections: Arc<Connections>,
    sni: Arc<dyn SniConfigs>,
    handshake_timeout: Duration,
) where
    R: ConnectionRouter<SniStream<Tracked<IO>>>,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::clone(io.conn());
    let stop = Arc::clone(&conn).close_requested();
    let served = async move {
        let Some(stream) = super::sni::accept(io, &*sni, handshake_timeout).await else {
            return Ok(());
        };
        router.serve_one(stream, stop).await
    };
    let (served, ()) = tokio::join!(served, connections.watch(&conn));
    if let Err(err) = served {
        tracing::debug!(error = %crate::chain::Chain(&err), "serving a connection failed");
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

/// Resolves on the first SIGTERM or SIGINT: the shutdown every daemon
/// drains on.
pub(crate) async fn shutdown_signal() {
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
