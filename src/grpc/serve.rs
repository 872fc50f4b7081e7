//! Assembling and running the gRPC server for every front end: its
//! services plus health and reflection, on the connections it accepts,
//! with a graceful drain on shutdown.
//!
//! Each admitted connection is served by xfn's own HTTP/2 server
//! ([`super::http2`]), on one serving thread ([`super::threads`]; accepted,
//! and admitted under the cap, here): its socket is registered with that
//! thread's reactor, TLS done on it first when the front end serves TLS
//! ([`super::sni`]). [`super::connections`] decides when a connection is to
//! close; the server's graceful close (GOAWAY, calls taken finish) closes
//! it.
//!
//! Why not tonic's transport server: per call it inserted its connect info
//! into the request's extensions, cloned a boxed service, boxed the body,
//! wrapped the future twice and started a timer on `grpc-timeout` (whose
//! answer, `CANCELLED`, the services had to beat: `super::deadline`); about
//! 7 of the hop's 46 allocations a call (issue 46). Here one small service
//! ([`Glue`]) does per call only what the services need: the body boxed as
//! tonic's, one extension ([`Arrived`]: when, and the SNI), the call
//! counted until its response body is done, and the service its path names.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic_health::ServingStatus;

use super::connections::{CallGuard, Conn, Connections, Counted, Tracked};
use super::deadline::{Arrived, Deadlined};
use super::http2::{Answering, Http2Error, RequestBody};
use super::listen::tcp_incoming;
use super::route::{Answer, Served, Services, ServicesBuilder};
use super::sni::SniConfigs;

/// Errors of serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not load the descriptors.
    #[error("cannot build the reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
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
    tls: Tls,
}

/// The TLS a front end serves over TCP.
#[derive(Clone, Default)]
enum Tls {
    /// Plaintext.
    #[default]
    None,
    /// One configuration (`xfn adapt`'s mTLS).
    One(Arc<rustls::ServerConfig>),
    /// The configuration for the name each client dialled (`xfn host`).
    Sni(Arc<dyn SniConfigs>),
}

impl std::fmt::Debug for ServiceSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSet")
            .field("names", &self.names)
            .field("tls", &!matches!(self.tls, Tls::None))
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
    pub(crate) fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Tls::One(tls);
        self
    }

    /// Serves TCP over TLS with the configuration `sni` gives the name each
    /// client dialled (see [`super::sni`]); replaces [`Self::with_tls`].
    pub(crate) fn with_sni_tls(mut self, sni: Arc<dyn SniConfigs>) -> Self {
        self.tls = Tls::Sni(sni);
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
    let serving = Arc::new(Serving {
        services: routes.build(),
        tls,
        handshake_timeout: connections.limits().handshake_timeout,
    });

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
            let spawn = hand_over(tokio::net::UnixStream::from_std, serving);
            let server = serve_each(incoming, connections, stopped, spawn);
            drain_on(server, stop, drain, stopping).await
        }
        Incoming::Tcp(listener) => {
            let incoming = tcp_incoming(listener)?;
            let spawn = hand_over(tokio::net::TcpStream::from_std, serving);
            let server = serve_each(incoming, connections, stopped, spawn);
            drain_on(server, stop, drain, stopping).await
        }
    }
}

/// What serves every connection of one server: its services, its TLS
/// (the HTTP/2 settings are the server's, `super::http2`).
struct Serving {
    services: Services,
    tls: Tls,
    handshake_timeout: Duration,
}

impl Serving {
    /// Serves `io` (TLS done first, when served) until it ends, or until
    /// its connection is asked to close: then closes it gracefully.
    async fn serve<IO>(&self, io: Tracked<IO>) -> Result<(), Http2Error>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let conn = Arc::clone(io.conn());
        let stop = Arc::clone(&conn).close_requested();
        let timeout = self.handshake_timeout;
        match &self.tls {
            Tls::None => super::http2::serve(io, self.glue(conn, None), stop).await,
            Tls::One(config) => {
                let Some(io) = super::sni::accept_one(io, Arc::clone(config), timeout).await else {
                    return Ok(());
                };
                super::http2::serve(io, self.glue(conn, None), stop).await
            }
            Tls::Sni(configs) => {
                let Some((io, name)) = super::sni::accept(io, &**configs, timeout).await else {
                    return Ok(());
                };
                super::http2::serve(io, self.glue(conn, Some(name)), stop).await
            }
        }
    }

    fn glue(&self, conn: Arc<Conn>, server_name: Option<Arc<str>>) -> Glue {
        Glue {
            services: self.services.clone(),
            conn,
            server_name,
        }
    }
}

/// What one connection's calls go through, between its HTTP/2 server and
/// the services: it stamps each request once ([`Arrived`]), counts the call
/// until its response body is done, and calls the service its path names.
struct Glue {
    services: Services,
    conn: Arc<Conn>,
    server_name: Option<Arc<str>>,
}

impl Answering for Glue {
    type Answer = Glued;
    type Body = Counted<Body>;

    fn answer(&self, request: Request<RequestBody>) -> Glued {
        let arrived = Arrived::now(request.headers(), self.server_name.clone());
        let guard = self.conn.begin_call();
        let (parts, body) = request.into_parts();
        let body = Body::new(Deadlined::new(body, arrived.deadline));
        let mut request = Request::from_parts(parts, body);
        request.extensions_mut().insert(arrived);
        let answer = self.services.answer(request);
        Glued {
            answer,
            guard: Some(guard),
        }
    }
}

/// A call's answer, its response body to hold the call's guard.
struct Glued {
    answer: Answer,
    guard: Option<CallGuard>,
}

impl Future for Glued {
    type Output = Response<Counted<Body>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match std::task::ready!(self.answer.as_mut().poll(cx)) {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let guard = self.guard.take();
        Poll::Ready(response.map(|body| Counted::new(body, guard)))
    }
}

/// What [`serve_each`] does with each admitted connection: hands it to a
/// serving thread, where `adopt` registers its socket with that thread's
/// reactor and `serving` serves it.
fn hand_over<S, J>(
    adopt: fn(S) -> std::io::Result<J>,
    serving: Arc<Serving>,
) -> impl Fn(Tracked<S>, Arc<Connections>)
where
    S: Send + 'static,
    J: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    move |io, connections| {
        let serving = Arc::clone(&serving);
        super::threads::serve_connection(async move {
            let io = match io.adopt(adopt) {
                Ok(io) => io,
                Err(err) => {
                    tracing::debug!(error = %crate::chain::Chain(&err), "cannot serve a connection on its thread");
                    return;
                }
            };
            let conn = Arc::clone(io.conn());
            let (served, ()) = tokio::join!(serving.serve(io), connections.watch(&conn));
            if let Err(err) = served {
                tracing::debug!(error = %crate::chain::Chain(&err), "serving a connection failed");
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
) where
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
    server: impl Future<Output = ()>,
    stop: tokio::sync::oneshot::Sender<()>,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    tokio::pin!(server);
    tokio::select! {
        () = &mut server => return Ok(()),
        () = shutdown => {}
    }
    tracing::info!(grace_period = ?drain.grace_period, "shutting down: no new calls; waiting for runs in flight");
    let _ = stop.send(());
    tokio::select! {
        () = &mut server => {
            tracing::info!("every run finished; stopped");
            return Ok(());
        }
        () = tokio::time::sleep(drain.grace_period) => {}
    }
    tracing::warn!("grace period over: cancelling the runs still in flight");
    drain.abort.cancel();
    tokio::select! {
        () = &mut server => Ok(()),
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
