//! The connections a front end holds open, and their bounds: a handshake
//! timeout, an idle timeout and a cap on open connections where the
//! oldest idle connection makes room for a new one.
//!
//! Why: every open connection is a file descriptor of the daemon, and the
//! daemon's descriptors are also what its runs need (pipes, the layers
//! they read, crun's sockets). Without bounds, a caller that opens
//! connections and sends nothing — or opens them and leaves them idle —
//! takes the last descriptor, and every later call fails with UNAVAILABLE.
//!
//! A connection asked to close gracefully gets [`CLOSE_GRACE`] after its
//! last call ends to finish the GOAWAY exchange; a client that does not
//! (it never reads) is cut then: its socket is shut down under its HTTP/2
//! server, which ends the connection.
//!
//! Every close the daemon decides is counted by reason in
//! `xfn_connections_closed_total`; `xfn_connections_open` is the gauge.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/grpc/connections.rs`.
use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::metrics::{ConnectionCounts, Metrics};

/// Default of `--handshake-timeout`.
pub(crate) const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--idle-connection-timeout`.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default of `--max-connections`: far above the few connections Crossplane
/// keeps (one per client it made), below the descriptors a default
/// container limit leaves once [`FD_RESERVE`] is set aside.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Descriptors kept for everything but connections (runs, pulls, the
/// cache, logs) when the cap is fitted under the descriptor limit.
pub(crate) const FD_RESERVE: usize = 1024;
/// How long a connection asked to close may take, after its last call, to
/// finish the GOAWAY exchange before it is cut. A client on the same node
/// answers in microseconds.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Bytes a client sends first: the 24-byte HTTP/2 preface and a 9-byte
/// frame header (its SETTINGS).
const HANDSHAKE_BYTES: usize = 24 + 9;
/// At most one warning of a kind (the cap reached, a TLS handshake
/// refused) logged per this long.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Warnings a flood can make, at most one per [`WARN_INTERVAL`], each
/// saying how many were left out since the last.
#[derive(Debug, Default)]
pub(crate) struct WarnThrottle {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl WarnThrottle {
    /// None logged yet.
    pub(crate) const fn new() -> Self {
        Self {
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(left out since the last)` when this one is to be logged.
    pub(crate) fn due(&mut self) -> Option<u64> {
        if self.last.is_some_and(|at| at.elapsed() < WARN_INTERVAL) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(std::time::Instant::now());
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A connection must send its first bytes within this.
    pub handshake_timeout: Duration,
    /// A connection with no call in flight this long is closed.
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl ConnectionLimits {
    /// These limits with the cap fitted under `fd_limit` descriptors (less
    /// [`FD_RESERVE`], at least 16), and whether it had to shrink.
    pub fn fitted_to(self, fd_limit: u64) -> (Self, bool) {
        let room = usize::try_from(fd_limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(FD_RESERVE)
            .max(16);
        let fitted = Self {
            max_connections: self.max_connections.min(room),
            ..self
        };
        (fitted, fitted.max_connections < self.max_connections)
    }
}

/// Raises the soft descriptor limit to the hard one (as the Go runtime
/// does for every Go program) and returns it: the default soft limit of
/// many container runtimes (1024) is far below what they allow.
pub(crate) fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(err) => {
                tracing::debug!(error = %crate::chain::Chain(&err), "cannot raise the descriptor limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => u64::MAX,
    }
}

/// Why the daemon closed a connection (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// It sent nothing within the handshake timeout: cut.
    HandshakeTimeout,
    /// No call for the idle timeout: GOAWAY.
    IdleTimeout,
    /// The cap was reached and it was the longest idle: GOAWAY.
    Evicted,
    /// It was asked to close and did not within [`CLOSE_GRACE`]: cut.
    Unresponsive,
    /// The cap was reached and every connection was busy: refused.
    OverCapacity,
}

impl CloseReason {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::HandshakeTimeout => "handshake_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::Evicted => "evicted",
            Self::Unresponsive => "unresponsive",
            Self::OverCapacity => "over_capacity",
        }
    }
}

/// Where a connection is in its life: what its watcher and its server
/// wait on. Each change wakes them; it changes a few times per
/// connection, never per call.
#[derive(Debug, Clone, Copy)]
struct Lifecycle {
    handshaken: bool,
    /// Asked to close gracefully (idle, evicted, draining).
    closing: bool,
    /// When it was asked.
    closing_since: Instant,
    /// Its socket was shut down.
    cut: bool,
    /// Its HTTP/2 server dropped it.
    ended: bool,
}

/// What a connection is doing, as seen at one moment: its
/// [`Lifecycle`] and its calls.
#[derive(Debug, Clone, Copy)]
struct State {
    life: Lifecycle,
    calls: usize,
    /// Since when it has had no call (its opening, before any).
    idle_since: Instant,
}

impl std::ops::Deref for State {
    type Target = Lifecycle;

    fn deref(&self) -> &Lifecycle {
        &self.life
    }
}

impl State {
    fn idle(&self) -> bool {
        self.calls == 0 && !self.closing && !self.cut
    }
}

/// A connection's calls in flight, and since when it has had none.
///
/// Choice: **counted without waking anyone**. Every call begins and ends
/// here, and a change to the watched [`Lifecycle`] would wake the
/// connection's watcher and its server's shutdown future twice a call;
/// on 2 CPUs those wake-ups (a parked worker thread woken each time)
/// cost a unary call about 0.15 ms of its round trip (benches/PROFILE.md,
/// seventh pass). Nothing needs to know at once: the watcher reads the
/// count when its timer fires, and while calls are in flight it looks
/// again one quiet period later, before which no quiet period that
/// starts at their end can be over, so it still closes a connection
/// exactly one quiet period after its last call.
#[derive(Debug)]
struct CallCount {
    in_flight: AtomicUsize,
    /// Nanoseconds from the connection's opening to the end of its last
    /// call (0: none yet).
    idle_since: AtomicU64,
}

impl CallCount {
    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A call ended, at `offset` from the opening: the end is stored
    /// before the count drops, so whoever sees the count drop sees when.
    fn end(&self, offset: Duration) {
        let nanos = u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX);
        self.idle_since.fetch_max(nanos, Ordering::AcqRel);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Calls in flight, and since when none (given the opening).
    fn read(&self, opened: Instant) -> (usize, Instant) {
        let calls = self.in_flight.load(Ordering::Acquire);
        let since = Duration::from_nanos(self.idle_since.load(Ordering::Acquire));
        (calls, opened + since)
    }
}

/// One open connection, shared by its socket wrapper ([`Tracked`]), the
/// call counter and the table.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    opened: Instant,
    state: watch::Sender<Lifecycle>,
    calls: CallCount,
    /// The socket while it is open (cleared before it closes, so a cut
    /// never shuts down a reused descriptor number).
    fd: Mutex<Option<RawFd>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Conn {
    fn state(&self) -> State {
        let life = *self.state.borrow();
        let (calls, idle_since) = self.calls.read(self.opened);
        State {
            life,
            calls,
            idle_since,
        }
    }

    /// Counts a call from its start until the guard drops (its response
    /// body is done or dropped).
    pub(crate) fn begin_call(self: &Arc<Self>) -> CallGuard {
        self.calls.begin();
        // A call means the handshake is done; that wakes the watcher once.
        self.state
            .send_if_modified(|s| !std::mem::replace(&mut s.handshaken, true));
        CallGuard(Arc::clone(self))
    }

    /// Asks for a graceful close (GOAWAY); false if it already was.
    fn request_close(&self) -> bool {
        self.state.send_if_modified(|s| {
            let first = !s.closing && !s.cut && !s.ended;
            if first {
                s.closing = true;
                s.closing_since = Instant::now();
            }
            first
        })
    }

    /// Shuts the socket down: hyper's next read sees end-of-file and its
    /// writes fail, so the connection ends at once.
    fn cut(&self) {
        let fd = lock(&self.fd);
        // `fd` is the wrapper's open socket while the lock is held: the
        // wrapper takes it out under the lock before the socket closes.
        if let Some(fd) = *fd {
            let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
        }
        drop(fd);
        self.state.send_modify(|s| s.cut = true);
    }

    /// Resolves once the connection is asked to close, or ended: what the
    /// per-connection server stops on.
    pub(crate) async fn close_requested(self: Arc<Self>) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| s.closing || s.cut || s.ended).await;
    }
}

/// Holds one call of a connection open (see [`Conn::begin_call`]).
#[derive(Debug)]
pub(crate) struct CallGuard(Arc<Conn>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.calls.end(self.0.opened.elapsed());
    }
}

/// The table of open connections of one server.
#[derive(Debug)]
pub(crate) struct Connections {
    limits: ConnectionLimits,
    counts: ConnectionCounts,
    /// What its cap is called in the log.
    cap: &'static str,
    table: Mutex<Table>,
    /// How many are open (drain waits for 0).
    open: watch::Sender<usize>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Arc<Conn>>,
    cap_warnings: WarnThrottle,
}

impl Connections {
    /// An empty table under `limits`, counting into `metrics`.
    pub(crate) fn new(limits: ConnectionLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_counts(
            limits,
            metrics.connection_counts(),
            "connection cap (--max-connections)",
        )
    }

    /// An empty table under `limits`, counting into `counts`, its cap
    /// named `cap` in the log.
    pub(crate) fn with_counts(
        limits: ConnectionLimits,
        counts: ConnectionCounts,
        cap: &'static str,
    ) -> Arc<Self> {
        Arc::new(Self {
            limits,
            counts,
            cap,
            table: Mutex::default(),
            open: watch::Sender::new(0),
        })
    }

    /// The bounds connections are held to.
    pub(crate) fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// Waits until a new connection may be taken with at most one over
    /// the cap held open. A connection cut still holds its descriptor
    /// until its server drops it, which its task does only when it next runs:
    /// counting it, and waiting here for it to go, bounds the descriptors
    /// by the table rather than by how far the tasks run behind a flood.
    /// Quiet connections already asked to close are cut meanwhile (they
    /// had their warning).
    pub(crate) async fn room(&self) {
        let mut open = self.open.subscribe();
        loop {
            {
                let table = lock(&self.table);
                if table.open.len() <= self.limits.max_connections {
                    return;
                }
                for conn in table.open.values() {
                    let s = conn.state();
                    if s.closing && s.calls == 0 && !s.cut && !s.ended {
                        conn.cut();
                        self.count(CloseReason::Unresponsive);
                    }
                }
            }
            // Every removal sends; the sender lives as long as `self`.
            if open.changed().await.is_err() {
                return;
            }
        }
    }

    /// Takes a new connection in (after [`Connections::room`]), making
    /// room under the cap; `None` when it is refused (every connection
    /// busy), `io` then closes.
    pub(crate) fn admit<IO: AsRawFd>(self: &Arc<Self>, io: IO) -> Option<Tracked<IO>> {
        let mut table = lock(&self.table);
        // Every connection not yet dropped holds a descriptor, cut or not.
        if table.open.len() >= self.limits.max_connections {
            let states: Vec<(Arc<Conn>, State)> = table
                .open
                .values()
                .map(|c| (Arc::clone(c), c.state()))
                .collect();
            // One already asked to go, and quiet, had its warning; one cut
            // is going: either makes room soon.
            let mut going = false;
            for (conn, s) in &states {
                if s.closing && s.calls == 0 && !s.cut && !s.ended {
                    conn.cut();
                    self.count(CloseReason::Unresponsive);
                    going = true;
                } else if s.cut && !s.ended {
                    going = true;
                }
            }
            let oldest_idle = states
                .iter()
                .filter(|(_, s)| s.idle())
                .min_by_key(|(_, s)| s.idle_since);
            if let Some((conn, _)) = oldest_idle {
                conn.request_close();
                self.count(CloseReason::Evicted);
                self.log_cap(&mut table, "closing the connection idle the longest");
            } else if !going {
                self.count(CloseReason::OverCapacity);
                self.log_cap(
                    &mut table,
                    "every connection has a call in flight: refusing the new one",
                );
                return None;
            }
        }
        table.next_id += 1;
        let now = Instant::now();
        let conn = Arc::new(Conn {
            id: table.next_id,
            opened: now,
            state: watch::Sender::new(Lifecycle {
                handshaken: false,
                closing: false,
                closing_since: now,
                cut: false,
                ended: false,
            }),
            calls: CallCount {
                in_flight: AtomicUsize::new(0),
                idle_since: AtomicU64::new(0),
            },
            fd: Mutex::new(Some(io.as_raw_fd())),
        });
        table.open.insert(conn.id, Arc::clone(&conn));
        let count = table.open.len();
        drop(table);
        self.open.send_replace(count);
        self.counts.set_open(count);
        Some(Tracked {
            io: Some(io),
            conn,
            read: 0,
            table: Arc::clone(self),
            handed_on: false,
        })
    }

    fn count(&self, reason: CloseReason) {
        self.counts.closed(reason.label());
    }

    /// Asks `conn`, idle past the idle timeout, to close (once).
    fn close_idle(&self, conn: &Conn) {
        if conn.request_close() {
            tracing::debug!(connection = conn.id, "idle connection closed");
            self.count(CloseReason::IdleTimeout);
        }
    }

    fn log_cap(&self, table: &mut Table, outcome: &'static str) {
        if let Some(suppressed) = table.cap_warnings.due() {
            tracing::warn!(
                max_connections = self.limits.max_connections,
                suppressed,
                "{} reached: {outcome}",
                self.cap
            );
        }
    }

    fn remove(&self, id: u64) {
        let count = {
            let mut table = lock(&self.table);
            table.open.remove(&id);
            table.open.len()
        };
        self.open.send_replace(count);
        self.counts.set_open(count);
    }

    /// Asks every connection to close gracefully and waits until all are
    /// gone (their calls decide when: see the drain in `serve`).
    pub(crate) async fn drain(&self) {
        let all: Vec<Arc<Conn>> = lock(&self.table).open.values().cloned().collect();
        for conn in all {
            conn.request_close();
        }
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|n| *n == 0).await;
    }

    /// Watches one connection until it ends: cuts it past the handshake
    /// timeout, closes it past the idle timeout, and cuts it when asked to
    /// close and still there [`CLOSE_GRACE`] after its last call.
    pub(crate) async fn watch(&self, conn: &Conn) {
        let mut rx = conn.state.subscribe();
        loop {
            rx.borrow_and_update();
            let s = conn.state();
            if s.ended || s.cut {
                return;
            }
            // The earliest of what applies now.
            let handshake = (!s.handshaken).then(|| {
                (
                    conn.opened + self.limits.handshake_timeout,
                    Some(CloseReason::HandshakeTimeout),
                )
            });
            // The quiet period's end; with calls in flight (they do not
            // wake this watcher: see `CallCount`), a look one period on.
            let period = match s.closing {
                true => CLOSE_GRACE,
                false => self.limits.idle_timeout,
            };
            let quiet = match (s.calls, s.closing) {
                (0, true) => (
                    s.idle_since.max(s.closing_since) + period,
                    Some(CloseReason::Unresponsive),
                ),
                (0, false) => (s.idle_since + period, Some(CloseReason::IdleTimeout)),
                _ => (Instant::now() + period, None),
            };
            let (at, reason) = match handshake {
                Some(handshake) if handshake.0 < quiet.0 => handshake,
                _ => quiet,
            };
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(at) => {
                    match reason {
                        // Calls were in flight: look again.
                        None => {}
                        Some(CloseReason::IdleTimeout) => self.close_idle(conn),
                        Some(reason) => {
                            tracing::debug!(connection = conn.id, reason = reason.label(), "connection cut");
                            conn.cut();
                            self.count(reason);
                        }
                    }
                }
            }
        }
    }
}

/// A connection's socket, tracked: counts the first bytes read (the
/// handshake), takes it out of the table when its server drops it, and carries
/// its [`Conn`] to the call counter.
#[derive(Debug)]
pub(crate) struct Tracked<IO> {
    /// Closed in `drop` before the connection leaves the table, so the
    /// table never counts fewer descriptors than are open; `None` once
    /// handed on ([`Tracked::adopt`]).
    io: Option<IO>,
    conn: Arc<Conn>,
    read: usize,
    table: Arc<Connections>,
    /// Its socket and its place in the table went to another wrapper.
    handed_on: bool,
}

impl<IO> Tracked<IO> {
    /// The connection.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The same connection with its socket made another type by `adopt`
    /// (registered with another runtime's reactor: [`super::threads`]).
    /// When `adopt` fails (its socket then closed), the connection ends.
    pub(crate) fn adopt<J>(
        mut self,
        adopt: impl FnOnce(IO) -> std::io::Result<J>,
    ) -> std::io::Result<Tracked<J>> {
        // No cut reaches the descriptor while it changes hands (a failed
        // `adopt` closes it).
        let fd = lock(&self.conn.fd).take();
        let io = self
            .io
            .take()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotConnected))?;
        let io = adopt(io)?;
        *lock(&self.conn.fd) = fd;
        self.handed_on = true;
        Ok(Tracked {
            io: Some(io),
            conn: Arc::clone(&self.conn),
            read: self.read,
            table: Arc::clone(&self.table),
            handed_on: false,
        })
    }
}

/// An error for a read or write of a socket handed on (never polled).
fn handed_on() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::NotConnected)
}

impl<IO> Drop for Tracked<IO> {
    fn drop(&mut self) {
        if self.handed_on {
            return;
        }
        // Before `io` closes: no cut may reach the descriptor number once
        // it can be reused.
        lock(&self.conn.fd).take();
        drop(self.io.take());
        self.conn.state.send_modify(|s| s.ended = true);
        // Only once its descriptor is closed does a connection leave the
        // count `room` waits on.
        self.table.remove(self.conn.id);
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Err(handed_on()));
        };
        let polled = Pin::new(io).poll_read(cx, buf);
        if self.read < HANDSHAKE_BYTES {
            self.read += buf.filled().len() - before;
            if self.read >= HANDSHAKE_BYTES {
                self.conn.state.send_modify(|s| s.handshaken = true);
            }
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.io.as_mut() {
            Some(io) => Pin::new(io).poll_write(cx, buf),
            None => Poll::Ready(Err(handed_on())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.io.as_mut() {
            Some(io) => Pin::new(io).poll_flush(cx),
            None => Poll::Ready(Err(handed_on())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.io.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Err(handed_on())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.io.as_mut() {
            Some(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            None => Poll::Ready(Err(handed_on())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }
}

/// What the metrics endpoint (axum) puts in each request's extensions for
/// a [`Tracked`] connection: the call counter finds the connection there.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo(pub Arc<Conn>);

/// A tower layer that counts each call of a [`Tracked`] connection from
/// its arrival until its response body is done (a streaming call counts
/// for as long as it streams): what "idle" means. The metrics endpoint's;
/// the gRPC server counts its calls itself (`super::serve`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CountCallsLayer;

impl<S> tower::Layer<S> for CountCallsLayer {
    type Service = CountCalls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountCalls(inner)
    }
}

/// The service [`CountCallsLayer`] makes.
#[derive(Debug, Clone)]
pub(crate) struct CountCalls<S>(S);

impl<S, B, ResBody> tower::Service<tonic::codegen::http::Request<B>> for CountCalls<S>
where
    S: tower::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<ResBody>,
    >,
    S::Future: Send + 'static,
    ResBody: http_body::Body + Unpin,
{
    type Response = tonic::codegen::http::Response<Counted<ResBody>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        let guard = request
            .extensions()
            .get::<axum::extract::ConnectInfo<ConnInfo>>()
            .map(|info| info.0 .0.begin_call());
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Counted::new(body, guard)))
        })
    }
}

/// A response body that holds its call's [`CallGuard`] until it is done.
#[derive(Debug)]
pub(crate) struct Counted<B> {
    body: B,
    _guard: Option<CallGuard>,
}

impl<B> Counted<B> {
    /// `body`, holding `guard` until it is done.
    pub(crate) fn new(body: B, guard: Option<CallGuard>) -> Self {
        Self {
            body,
            _guard: guard,
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize) -> Arc<Connections> {
        Connections::new(
            ConnectionLimits {
                max_connections: max,
                ..ConnectionLimits::default()
            },
            Arc::new(Metrics::new()),
        )
    }

    fn socket() -> std::os::unix::net::UnixStream {
        std::os::unix::net::UnixStream::pair().unwrap().0
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_is_asked_to_close() {
        let table = table(2);
        let first = table.admit(socket()).unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let second = table.admit(socket()).unwrap();
        // The older one is busy: the younger idle one goes.
        let _call = first.conn().begin_call();
        let _third = table.admit(socket()).unwrap();
        assert!(!first.conn().state().closing);
        assert!(second.conn().state().closing);
        // The next newcomer waits: the one already asked is cut, and its
        // descriptor counts until it is dropped. Never more than one over
        // the cap is held.
        let room = table.room();
        tokio::pin!(room);
        assert!(futures::FutureExt::now_or_never(room.as_mut()).is_none());
        assert!(second.conn().state().cut);
        drop(second);
        room.await;
        let _fourth = table.admit(socket()).unwrap();
        assert!(!first.conn().state().closing);
    }

    #[tokio::test]
    async fn connections_cut_but_not_yet_dropped_count_against_the_cap() {
        let table = table(2);
        let first = table.admit(socket()).unwrap();
        let _second = table.admit(socket()).unwrap();
        // Cut (say, at its handshake timeout) and not yet dropped by its server:
        // its descriptor is still open.
        first.conn().cut();
        table.room().await;
        let _third = table.admit(socket()).unwrap();
        // Three held against a cap of two: no fourth until one is gone.
        let room = table.room();
        tokio::pin!(room);
        assert!(futures::FutureExt::now_or_never(room.as_mut()).is_none());
        drop(first);
        room.await;
    }

    #[tokio::test]
    async fn with_every_connection_busy_a_newcomer_is_refused() {
        let table = table(1);
        let only = table.admit(socket()).unwrap();
        let _call = only.conn().begin_call();
        assert!(table.admit(socket()).is_none());
        assert!(!only.conn().state().closing);
    }

    #[tokio::test]
    async fn a_dropped_connection_leaves_the_table() {
        let table = table(4);
        let conn = table.admit(socket()).unwrap();
        assert_eq!(*table.open.borrow(), 1);
        drop(conn);
        assert_eq!(*table.open.borrow(), 0);
        table.drain().await;
    }

    #[test]
    fn the_cap_fits_under_the_descriptor_limit() {
        let limits = ConnectionLimits::default();
        assert_eq!(limits.fitted_to(1 << 20), (limits, false));
        let (fitted, shrunk) = limits.fitted_to(1024);
        assert!(shrunk);
        assert_eq!(fitted.max_connections, 16);
        assert_eq!(limits.fitted_to(20_000).0.max_connections, 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_wake_no_watcher_and_the_idle_timeout_still_runs_from_the_last_calls_end() {
        let idle = Duration::from_secs(30);
        let table = Connections::new(
            ConnectionLimits {
                idle_timeout: idle,
                ..ConnectionLimits::default()
            },
            Arc::new(Metrics::new()),
        );
        let tracked = table.admit(socket()).unwrap();
        let conn = Arc::clone(tracked.conn());
        drop(conn.begin_call());
        let mut rx = conn.state.subscribe();
        rx.borrow_and_update();
        // A call through three idle periods: no wake-up, and no close.
        let call = conn.begin_call();
        let watch = table.watch(&conn);
        tokio::pin!(watch);
        tokio::select! {
            () = &mut watch => panic!("the watcher ended with a call in flight"),
            () = tokio::time::sleep(3 * idle) => {}
        }
        assert!(!rx.has_changed().unwrap(), "a call woke the watcher");
        assert!(!conn.state().closing);
        // Closed one idle period after the call ended, not before.
        let ended = Instant::now();
        drop(call);
        assert!(!rx.has_changed().unwrap(), "a call's end woke the watcher");
        tokio::select! {
            () = &mut watch => panic!("the watcher ended before closing"),
            closing = rx.wait_for(|s| s.closing) => assert!(closing.is_ok()),
        }
        assert_eq!(ended.elapsed(), idle);
    }

    #[tokio::test]
    async fn a_silent_connection_is_cut_at_the_handshake_timeout_and_an_idle_one_closed() {
        let table = Connections::new(
            ConnectionLimits {
                handshake_timeout: Duration::from_millis(20),
                idle_timeout: Duration::from_millis(20),
                max_connections: 8,
            },
            Arc::new(Metrics::new()),
        );
        let silent = table.admit(socket()).unwrap();
        let conn = Arc::clone(silent.conn());
        table.watch(&conn).await;
        assert!(conn.state().cut);

        let quiet = table.admit(socket()).unwrap();
        let conn = Arc::clone(quiet.conn());
        conn.state.send_modify(|s| s.handshaken = true);
        let watch = table.watch(&conn);
        tokio::pin!(watch);
        // Idle timeout: asked to close; then cut after the grace.
        tokio::select! {
            () = &mut watch => {}
            () = async {
                let mut rx = conn.state.subscribe();
                let _ = rx.wait_for(|s| s.closing).await;
            } => {}
        }
        assert!(conn.state().closing);
        watch.await;
        assert!(conn.state().cut);
    }
}
