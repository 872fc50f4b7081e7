//! The one client of function servers: a unary gRPC call whose request
//! and answer stay bytes, over HTTP/2 (xfn's own client, [`super::http2`];
//! made inside the server's own network namespace, or to a TCP address or
//! a socket file: [`Dial`]), v1 first and v1beta1 when the server answers
//! Unimplemented (Functions built before v1), as Crossplane does.
//! Invariants:
//! - **A request leaves xfn in one write**. A server woken by the HEADERS
//!   frame alone only waits again for the DATA, a wake-up paid on every
//!   call (benches/PROFILE.md, "xfn host's hop"); the caller frames both
//!   and writes them itself (hyper's client, so tonic's `Channel`, writes
//!   the body apart).
//! - **A call wakes only its caller's thread**: a connection per serving
//!   thread (`grpc::threads::index`) and one for calls from any other, each
//!   made by the first call on its thread (again once found broken or gone
//!   away) and its reader spawned there. With one connection a call that
//!   came in on another serving thread than its maker's woke that thread.
//! - **`streams` bounds the calls at once over all of them**: the caller
//!   admits them (the host: at most `calls_per_server` per server, counted
//!   whatever the thread, `host::servers`); the server's own
//!   `max_concurrent_streams` is per connection (a call waits for it).
//!   Each connection is sized for all of them (its window).
//! - The answer is read within [`super::budget`] (its declared length, at
//!   most [`MAX_RESPONSE`]; the function's one share of the budget, over
//!   every connection; a minimum pace). A call dropped is reset on the wire.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use tonic::codegen::http;
use tonic::{Code, Status};

use super::budget::{Pace, ResponseShare, MAX_RESPONSE, PREFIX};
use super::http2::{handshake, Block, Connection, Http2Error, RequestHead};
use crate::grpc::deadline::format_grpc_timeout;
use crate::grpc::raw::prefix;
use crate::sandbox::netns::NetworkNamespace;

/// The method a function serves, in the version asked.
const V1_RUN_FUNCTION: &str = "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction";
const V1BETA1_RUN_FUNCTION: &str =
    "/apiextensions.fn.proto.v1beta1.FunctionRunnerService/RunFunction";

/// Where a function server is reached.
#[derive(Debug, Clone)]
pub(crate) enum Dial {
    /// An address inside a network namespace (a started server's own, or
    /// xfn's for one on the host's network).
    Namespace(NetworkNamespace, SocketAddr),
    /// `host:port` (or `http://host:port`) on xfn's network: a server
    /// already running (render's `Development` runtime).
    Tcp(String),
    /// A socket file (a kept server's keeper).
    Unix(PathBuf),
}

impl Dial {
    /// The `:authority` a call to the server names: the `host:port` dialled
    /// (as gRPC clients do: Crossplane dialling `dns:///fn:9443` sends
    /// `fn:9443`, and `xfn host --insecure` routes by its host), else
    /// `localhost`.
    fn authority(&self) -> String {
        match self {
            Dial::Namespace(_, address) => address.to_string(),
            Dial::Tcp(target) => {
                let target = target.strip_prefix("http://").unwrap_or(target);
                target.trim_end_matches('/').to_string()
            }
            Dial::Unix(_) => "localhost".to_string(),
        }
    }
}

/// One function's server, its calls and the connections there once made.
#[derive(Debug)]
pub(crate) struct Client {
    function: String,
    /// Most calls on it at once (each connection's window holds them).
    streams: usize,
    budget: Arc<ResponseShare>,
    dial: Dial,
    /// The `:authority` every call names (what a front, such as `xfn
    /// host` without TLS, routes by).
    authority: String,
    /// Each method's request header block with that authority, encoded
    /// once.
    v1: RequestHead,
    v1beta1: RequestHead,
    /// The connection of calls made on each serving thread, by its index.
    serving: Box<[Slot]>,
    /// The connection of calls made on any other thread.
    other: Slot,
}

/// A connection to the server, once made (by a call on the thread it
/// serves), and the lock of whoever makes it again.
#[derive(Debug, Default)]
struct Slot {
    live: Mutex<Option<Arc<Connection>>>,
    making: tokio::sync::Mutex<()>,
}

impl Slot {
    /// The connection, when it takes new calls.
    fn open(&self) -> Option<Arc<Connection>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().filter(|c| c.is_open()).cloned()
    }
}

impl Client {
    /// A client of `function`'s server at `dial`, taking at most `streams`
    /// calls at once, its answers held within `budget`. Connects on the
    /// first call (or [`Client::connect`]).
    pub(crate) fn new(
        function: &str,
        dial: Dial,
        streams: usize,
        budget: Arc<ResponseShare>,
    ) -> Self {
        let authority = dial.authority();
        Self {
            function: function.to_string(),
            streams,
            budget,
            v1: method_head(&authority, V1_RUN_FUNCTION),
            v1beta1: method_head(&authority, V1BETA1_RUN_FUNCTION),
            authority,
            dial,
            serving: (0..crate::grpc::threads::count())
                .map(|_| Slot::default())
                .collect(),
            other: Slot::default(),
        }
    }

    /// Answers `request` (an encoded `RunFunctionRequest`) with the encoded
    /// `RunFunctionResponse`, or the server's status, by `deadline` (told
    /// to the server as `grpc-timeout`; a call given up is reset on the
    /// connection). A call lost to the connection keeps its cause as the
    /// status's source ([`lost_connection`]).
    pub(crate) async fn call(
        &self,
        request: &Bytes,
        deadline: Option<Instant>,
    ) -> Result<Bytes, Status> {
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let answer = async {
            match self.call_method(&self.v1, request, timeout).await {
                // Built before v1: ask again in v1beta1 (the same bytes: the
                // two share their wire format).
                Err(status) if status.code() == Code::Unimplemented => {
                    self.call_method(&self.v1beta1, request, timeout).await
                }
                answer => answer,
            }
        };
        let Some(deadline) = deadline else {
            return answer.await;
        };
        tokio::time::timeout_at(deadline, answer)
            .await
            .unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "function {}: the caller's deadline passed while the function ran",
                    self.function
                )))
            })
    }

    /// Makes the connection of calls on this thread unless it is live.
    pub(crate) async fn connect(&self) -> Result<(), Status> {
        self.connection().await.map(drop)
    }

    /// The connection slot of calls on this thread.
    fn slot(&self) -> &Slot {
        crate::grpc::threads::index()
            .and_then(|index| self.serving.get(index))
            .unwrap_or(&self.other)
    }

    /// This thread's open connection, made (again) when there is none.
    async fn connection(&self) -> Result<Arc<Connection>, Status> {
        let slot = self.slot();
        if let Some(open) = slot.open() {
            return Ok(open);
        }
        let _making = slot.making.lock().await;
        // Another call may have made it again meanwhile.
        if let Some(open) = slot.open() {
            return Ok(open);
        }
        let made = self.dial().await?;
        *slot.live.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&made));
        Ok(made)
    }

    /// A new connection where [`Dial`] says.
    async fn dial(&self) -> Result<Arc<Connection>, Status> {
        let refused = |e: std::io::Error| lost("cannot connect to it", Http2Error::Io(Arc::new(e)));
        Ok(match &self.dial {
            Dial::Namespace(network, address) => {
                let stream = network.connect(*address).await.map_err(refused)?;
                handshake(stream, self.streams)
            }
            Dial::Tcp(_) => {
                let stream = tokio::net::TcpStream::connect(self.authority.as_str())
                    .await
                    .map_err(refused)?;
                stream.set_nodelay(true).map_err(refused)?;
                handshake(stream, self.streams)
            }
            Dial::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(refused)?;
                handshake(stream, self.streams)
            }
        })
    }

    /// Calls the method of `head` with the encoded `message`, telling the
    /// server the `timeout` left; the encoded answer, or the server's
    /// status. A call the server took on no connection (it went away
    /// first) is made once more, on a new one.
    async fn call_method(
        &self,
        head: &RequestHead,
        message: &Bytes,
        timeout: Option<Duration>,
    ) -> Result<Bytes, Status> {
        let mut again = true;
        loop {
            let connection = self.connection().await?;
            match call_on(
                &connection,
                &self.budget,
                &self.function,
                head,
                message,
                timeout,
            )
            .await
            {
                Err(status) if again && unprocessed(&status) => again = false,
                answer => return answer,
            }
        }
    }
}

/// Whether `status` came from the connection breaking rather than from the
/// function (the client keeps the HTTP/2 or I/O error as its source), or is
/// an `UNAVAILABLE` with nothing of the server's beside it.
pub(crate) fn lost_connection(status: &Status) -> bool {
    use std::error::Error;
    status.source().is_some()
        || (status.code() == Code::Unavailable && status.metadata().is_empty())
}

/// Whether `status` is a call the server never took (it went away first).
fn unprocessed(status: &Status) -> bool {
    use std::error::Error;
    status
        .source()
        .and_then(|source| source.downcast_ref::<Http2Error>())
        .is_some_and(|err| matches!(err, Http2Error::Unprocessed(_)))
}

/// The request head of `method` (a path) on the server at `authority`,
/// made once per client; an authority no URI holds (a `Dial::Tcp` target
/// mistyped) names `localhost` instead, and its connect fails before any
/// call is sent.
fn method_head(authority: &str, method: &'static str) -> RequestHead {
    let authority = match http::uri::Authority::try_from(authority) {
        Ok(_) => authority,
        Err(_) => "localhost",
    };
    RequestHead::new(authority, method)
}

/// One unary call on `connection` (see [`Client::call`]) to the method of
/// `head`.
async fn call_on(
    connection: &Arc<Connection>,
    budget: &ResponseShare,
    function: &str,
    head: &RequestHead,
    message: &Bytes,
    timeout: Option<Duration>,
) -> Result<Bytes, Status> {
    let prefix = prefix(message.len())?;
    let timeout = timeout.map(format_grpc_timeout);
    let stream = connection
        .open(
            head,
            timeout.as_ref().map(|t| t.as_bytes()),
            prefix,
            message,
        )
        .await
        .map_err(|e| lost("the call could not be sent", e))?;
    match stream.head().await.map_err(|e| lost("no answer", e))? {
        Block::Head(200) => {}
        Block::Head(status) => {
            return Err(Status::unknown(format!(
                "the function server answered HTTP {status}"
            )))
        }
        // A status in the headers is a trailers-only answer: no message.
        Block::Ok => return Err(Status::ok("")),
        Block::Fields(fields) => {
            return Err(Status::from_header_map(&fields).unwrap_or_else(|| {
                Status::internal("the function server's answer headers are malformed")
            }))
        }
    }
    let too_large = || {
        Status::resource_exhausted(format!(
            "function {function}: its response is larger than xfn reads from a function server ({} MiB)",
            MAX_RESPONSE >> 20
        ))
    };
    let mut read = BytesMut::new();
    // The declared length and the room held for it, once the prefix is in.
    let mut held = None;
    let mut pace = Pace::new(function);
    loop {
        let next = match &held {
            None => stream.data().await,
            Some(_) => pace.next(|| stream.data()).await?,
        };
        let Some(chunk) = next.map_err(|e| lost("the answer broke off", e))? else {
            break;
        };
        let end = read.len() + chunk.len();
        match &held {
            // Never read past the length it declared.
            Some((length, _)) if end > PREFIX + length => {
                return Err(longer(function, *length));
            }
            Some(_) => pace.arrived(chunk.len())?,
            None if end > MAX_RESPONSE + PREFIX => return Err(too_large()),
            None => {}
        }
        if read.is_empty() {
            read = chunk;
        } else {
            read.extend_from_slice(&chunk);
        }
        // Refused by its length before its body is read; else read once
        // the budget has room for it, its buffer taken once.
        if held.is_none() && read.len() >= PREFIX {
            let length = u32::from_be_bytes([read[1], read[2], read[3], read[4]]) as usize;
            if length > MAX_RESPONSE {
                return Err(too_large());
            }
            if read.len() > PREFIX + length {
                return Err(longer(function, length));
            }
            let room = budget.hold(PREFIX + length).await.ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "function {function}: its response ({length} bytes) is larger than all responses xfn holds at once (--response-budget)"
                ))
            })?;
            read.reserve((PREFIX + length).saturating_sub(read.len()));
            pace.start(PREFIX + length - read.len());
            held = Some((length, room));
        }
    }
    // The trailers came with the end of the stream. `grpc-status: 0` is
    // read as it is; only another is made a `Status` (which copies them).
    match stream.trailers() {
        Some(Block::Ok) => {}
        Some(Block::Fields(trailers)) => match Status::from_header_map(&trailers) {
            Some(status) if status.code() != Code::Ok => return Err(status),
            Some(_) => {}
            None => return Err(no_status()),
        },
        Some(Block::Head(_)) | None => return Err(no_status()),
    }
    unframed(match held {
        Some((_, room)) => room.held_by(read.freeze()),
        None => read.freeze(),
    })
}

fn no_status() -> Status {
    Status::internal("the function server's answer ended without a grpc-status")
}

/// An answer that goes on past the length its prefix declares: a protocol
/// error, and what follows is never read.
fn longer(function: &str, length: usize) -> Status {
    Status::internal(format!(
        "function {function}: its server's answer is longer than the {length} bytes it declares"
    ))
}

/// The one uncompressed message of a unary answer.
fn unframed(mut read: Bytes) -> Result<Bytes, Status> {
    let malformed = |what: &str| Status::internal(format!("the function server's answer {what}"));
    if read.len() < PREFIX {
        return Err(malformed("holds no message"));
    }
    let prefix = read.split_to(PREFIX);
    if prefix[0] != 0 {
        return Err(malformed("is compressed, and none was asked for"));
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    if usize::try_from(length).ok() != Some(read.len()) {
        return Err(malformed("is not one message"));
    }
    Ok(read)
}

/// A call lost to the connection, its cause kept as the status's source
/// ([`lost_connection`] tells these from a function's).
fn lost(what: &str, err: Http2Error) -> Status {
    let mut lost = Status::new(err.code(), format!("{what}: {err}"));
    lost.set_source(Arc::new(err));
    lost
}

#[cfg(test)]
mod tests {
    use super::super::budget::ResponseBudget;
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use tokio::io::{AsyncRead, AsyncWrite};
    use tokio::net::UnixStream;

    use super::super::http2::{Socket, Writer};
    use crate::grpc::raw::framed;

    /// The client's end of a connection, keeping every write it makes.
    struct Recorded {
        io: UnixStream,
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    struct RecordedWriter {
        io: Box<dyn Writer>,
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl Socket for Recorded {
        fn split(self) -> (Box<dyn AsyncRead + Send + Unpin>, Box<dyn Writer>) {
            let (read, io) = Socket::split(self.io);
            let writes = self.writes;
            (read, Box::new(RecordedWriter { io, writes }))
        }
    }

    impl Writer for RecordedWriter {
        fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
            let written = self.io.try_write(bytes)?;
            self.writes.lock().unwrap().push(bytes[..written].to_vec());
            Ok(written)
        }

        fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.io.poll_write_ready(cx)
        }

        fn shutdown(&self) {
            self.io.shutdown()
        }
    }

    /// The (type, flags, stream) of each whole frame in `write`.
    fn frames(write: &[u8]) -> Vec<(u8, u8, u32)> {
        let mut frames = Vec::new();
        let mut rest = write;
        while rest.len() >= 9 {
            let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
            frames.push((rest[3], rest[4], stream));
            rest = &rest[(9 + length).min(rest.len())..];
        }
        frames
    }

    /// What a test server answers a call with: (headers, message,
    /// trailers).
    type Answered = (http::HeaderMap, Option<Bytes>, Option<http::HeaderMap>);

    /// A function server on the other end of `io` answering each call
    /// with `answer(request head, request message)`: (headers, message,
    /// trailers).
    fn serve(
        io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
        answer: impl Fn(&http::request::Parts, Bytes) -> Answered + Send + Sync + 'static,
    ) {
        serve_with(h2::server::Builder::new(), io, answer)
    }

    /// [`serve`] with h2's server made by `builder`.
    fn serve_with(
        builder: h2::server::Builder,
        io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
        answer: impl Fn(&http::request::Parts, Bytes) -> Answered + Send + Sync + 'static,
    ) {
        tokio::spawn(async move {
            let mut connection = builder.handshake(io).await.unwrap();
            let answer = Arc::new(answer);
            // The accept loop drives the connection: each call is answered
            // in a task of its own.
            while let Some(Ok((request, mut respond))) = connection.accept().await {
                let answer = Arc::clone(&answer);
                tokio::spawn(async move {
                    let (head, mut body) = request.into_parts();
                    let mut read = BytesMut::new();
                    while let Some(chunk) = body.data().await {
                        let chunk = chunk.unwrap();
                        let _ = body.flow_control().release_capacity(chunk.len());
                        read.extend_from_slice(&chunk);
                    }
                    let (headers, message, trailers) =
                        answer(&head, unframed(read.freeze()).unwrap());
                    let mut response = http::Response::new(());
                    *response.headers_mut() = headers;
                    let end = message.is_none() && trailers.is_none();
                    let mut stream = respond.send_response(response, end).unwrap();
                    if let Some(message) = message {
                        stream.send_data(framed(&message).unwrap(), false).unwrap();
                    }
                    if let Some(trailers) = trailers {
                        stream.send_trailers(trailers).unwrap();
                    }
                });
            }
        });
    }

    /// An empty call over `io` to whatever serves its other end.
    async fn call_over<T>(io: T, budget: &ResponseShare) -> Result<Bytes, Status>
    where
        T: Socket,
    {
        let connection = handshake(io, 1);
        call_on(
            &connection,
            budget,
            "fn",
            &method_head("fn:9443", V1_RUN_FUNCTION),
            &Bytes::new(),
            None,
        )
        .await
    }

    fn budget() -> ResponseShare {
        budget_of(MAX_RESPONSE)
    }

    /// One function's share of a budget of `bytes` (all of it, when that
    /// is one largest answer or less).
    fn budget_of(bytes: usize) -> ResponseShare {
        Arc::new(ResponseBudget::new(bytes)).share()
    }

    fn grpc_status(code: &str) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        map.insert("grpc-status", code.parse().unwrap());
        map
    }

    #[tokio::test]
    async fn a_call_leaves_in_one_write_with_its_deadline_and_its_answer_comes_back_as_bytes() {
        let (client, server) = UnixStream::pair().unwrap();
        let seen = Arc::new(Mutex::new(None));
        let seen_by_server = Arc::clone(&seen);
        serve(server, move |head, message| {
            *seen_by_server.lock().unwrap() = Some((head.clone(), message.clone()));
            let mut headers = http::HeaderMap::new();
            headers.insert("content-type", "application/grpc".parse().unwrap());
            (
                headers,
                Some(Bytes::from_static(b"answer")),
                Some(grpc_status("0")),
            )
        });
        let writes = Arc::new(Mutex::new(Vec::new()));
        let connection = handshake(
            Recorded {
                io: client,
                writes: Arc::clone(&writes),
            },
            1,
        );
        let message = Bytes::from_static(b"request");
        let budget = budget();
        let head = method_head("big:9443", V1_RUN_FUNCTION);
        let call = call_on(
            &connection,
            &budget,
            "fn",
            &head,
            &message,
            Some(Duration::from_secs(120)),
        );
        let answer = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call was not answered")
            .unwrap();
        assert_eq!(answer, Bytes::from_static(b"answer"));

        let (head, received) = seen.lock().unwrap().take().unwrap();
        assert_eq!(received, message);
        assert_eq!(head.uri.path(), V1_RUN_FUNCTION);
        // The authority dialled, which `xfn host --insecure` routes by.
        assert_eq!(head.uri.authority().map(|a| a.as_str()), Some("big:9443"));
        assert_eq!(head.headers["grpc-timeout"], "120000m");
        assert_eq!(head.headers["content-type"], "application/grpc");
        // HEADERS (1) and DATA (0) with END_STREAM (1) of stream 1, in the
        // same write.
        let writes = writes.lock().unwrap();
        let request_write = writes
            .iter()
            .map(|w| frames(w))
            .find(|frames| {
                frames
                    .iter()
                    .any(|&(kind, _, stream)| kind == 1 && stream == 1)
            })
            .expect("no HEADERS frame was written");
        assert!(
            request_write
                .iter()
                .any(|&(kind, flags, stream)| kind == 0 && flags & 1 == 1 && stream == 1),
            "the request's DATA left in another write than its HEADERS: {request_write:?}"
        );
    }

    #[test]
    fn a_call_names_the_host_and_port_dialled_as_its_authority() {
        // What `xfn host --insecure` routes by: render's Development
        // target `dns:///big:9443` reaches the client as `big:9443`.
        for target in ["big:9443", "http://big:9443", "http://big:9443/"] {
            assert_eq!(Dial::Tcp(target.to_string()).authority(), "big:9443");
        }
        assert_eq!(
            Dial::Unix(PathBuf::from("/k.sock")).authority(),
            "localhost"
        );
    }

    #[tokio::test]
    async fn a_function_status_comes_back_as_it_is_trailers_only_or_after_headers() {
        for trailers_only in [true, false] {
            let (client, server) = UnixStream::pair().unwrap();
            serve(server, move |_, _| {
                let mut status = grpc_status("12");
                status.insert("grpc-message", "no such method".parse().unwrap());
                match trailers_only {
                    true => (status, None, None),
                    false => (http::HeaderMap::new(), None, Some(status)),
                }
            });
            let status = call_over(client, &budget()).await.unwrap_err();
            assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
            assert_eq!(status.message(), "no such method");
        }
    }

    #[tokio::test]
    async fn a_connection_gone_is_a_lost_call_with_its_cause_kept() {
        let (client, server) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let mut connection = h2::server::handshake(server).await.unwrap();
            // Takes the call, then the server dies with it.
            let _call = connection.accept().await;
            drop(connection);
        });
        let status = call_over(client, &budget()).await.unwrap_err();
        assert!(std::error::Error::source(&status).is_some(), "{status:?}");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }

    #[tokio::test]
    async fn calls_on_each_serving_thread_and_off_them_go_over_a_connection_made_by_each() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                serve(stream, |_, _| {
                    let answer = Some(Bytes::from_static(b"answer"));
                    (http::HeaderMap::new(), answer, Some(grpc_status("0")))
                });
            }
        });
        let client = Arc::new(Client::new(
            "fn",
            Dial::Tcp(address.to_string()),
            4,
            Arc::new(budget()),
        ));
        // Two calls on each serving thread (held open together, so they
        // spread over the threads) and two on this one.
        let (indexes, mut told) = tokio::sync::mpsc::unbounded_channel();
        let mut holds = Vec::new();
        for _ in 0..crate::grpc::threads::count() {
            let (hold, held) = tokio::sync::oneshot::channel::<()>();
            holds.push(hold);
            let (client, indexes) = (Arc::clone(&client), indexes.clone());
            crate::grpc::threads::serve_connection(async move {
                for _ in 0..2 {
                    client.call(&Bytes::new(), None).await.unwrap();
                }
                let _ = indexes.send(crate::grpc::threads::index());
                let _ = held.await;
            });
        }
        for _ in 0..2 {
            client.call(&Bytes::new(), None).await.unwrap();
        }
        let mut threads = std::collections::BTreeSet::new();
        for _ in 0..holds.len() {
            let index = told.recv().await.unwrap();
            threads.insert(index.expect("a call on a serving thread has its index"));
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            threads.len() + 1,
            "one connection per thread that called, serving threads {threads:?}"
        );
        drop(holds);
    }

    #[test]
    fn a_message_framed_is_unframed_to_itself() {
        let message = Bytes::from_static(b"\x0a\x03abc");
        assert_eq!(unframed(framed(&message).unwrap()).unwrap(), message);
    }

    #[test]
    fn an_answer_not_one_uncompressed_message_is_refused() {
        let mut compressed = framed(b"abc").unwrap().to_vec();
        compressed[0] = 1;
        let mut short = framed(b"abc").unwrap().to_vec();
        short.pop();
        for (answer, says) in [
            (Bytes::from(compressed), "compressed"),
            (Bytes::from(short), "not one message"),
            (Bytes::from_static(b"\0\0"), "no message"),
        ] {
            let status = unframed(answer).unwrap_err();
            assert_eq!(status.code(), Code::Internal);
            assert!(status.message().contains(says), "{}", status.message());
        }
    }

    /// A server answering every call with `size` bytes.
    fn answering(size: usize) -> UnixStream {
        let (client, server) = UnixStream::pair().unwrap();
        serve(server, move |_, _| {
            let message = Bytes::from(vec![7u8; size]);
            (
                http::HeaderMap::new(),
                Some(message),
                Some(grpc_status("0")),
            )
        });
        client
    }

    #[tokio::test]
    async fn a_response_waits_for_room_in_the_budget_until_an_earlier_ones_bytes_are_dropped() {
        let budget = budget_of(4096);
        let first = call_over(answering(3000), &budget).await.unwrap();
        let mut second = Box::pin(call_over(answering(3000), &budget));
        // It cannot be read while the first's bytes are held.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut second)
                .await
                .is_err()
        );
        let copy = first.slice(10..20);
        drop(first);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut second)
                .await
                .is_err(),
            "the room came back while a copy of the bytes lived"
        );
        drop(copy);
        let second = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the room never came back")
            .unwrap();
        assert_eq!(second.len(), 3000);
    }

    #[tokio::test]
    async fn a_response_larger_than_the_whole_budget_is_resource_exhausted() {
        let budget = budget_of(4096);
        let status = call_over(answering(8000), &budget).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("--response-budget"), "{status:?}");
    }

    #[tokio::test]
    async fn responses_waiting_for_room_never_stall_the_one_being_read() {
        // Room for one 150 KiB response at a time, four asked for at once
        // on one connection: each waiting one stops being read with up
        // to a stream window of it received.
        let budget = budget_of(200 << 10);
        let connection = handshake(answering(150 << 10), 4);
        let call = || async {
            call_on(
                &connection,
                &budget,
                "fn",
                &method_head("fn:9443", V1_RUN_FUNCTION),
                &Bytes::new(),
                None,
            )
            .await
            .map(|answer| answer.len())
        };
        let all = futures::future::join_all((0..4).map(|_| call()));
        let lengths = tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .expect("responses waiting for room stalled the one being read");
        for length in lengths {
            assert_eq!(length.unwrap(), 150 << 10);
        }
    }

    /// A server answering every call with `chunks` as its DATA frames
    /// (the first one sent at once, each later one `every` after the last)
    /// and then `grpc-status: 0`.
    fn answering_raw(chunks: Vec<Bytes>, every: Duration) -> UnixStream {
        let (client, server) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let mut connection = h2::server::handshake(server).await.unwrap();
            while let Some(Ok((_, mut respond))) = connection.accept().await {
                let chunks = chunks.clone();
                tokio::spawn(async move {
                    let mut stream = respond
                        .send_response(http::Response::new(()), false)
                        .unwrap();
                    for (i, chunk) in chunks.into_iter().enumerate() {
                        if i > 0 {
                            tokio::time::sleep(every).await;
                        }
                        stream.reserve_capacity(chunk.len());
                        if stream.send_data(chunk, false).is_err() {
                            return;
                        }
                    }
                    let _ = stream.send_trailers(grpc_status("0"));
                });
            }
        });
        client
    }

    fn prefix(length: u32) -> Bytes {
        let [a, b, c, d] = length.to_be_bytes();
        Bytes::copy_from_slice(&[0, a, b, c, d])
    }

    #[tokio::test]
    async fn an_answer_longer_than_it_declares_is_refused_at_its_declared_length() {
        let chunks = vec![
            prefix(10),
            Bytes::from(vec![7u8; 10]),
            Bytes::from(vec![7u8; 1000]),
        ];
        let status = call_over(answering_raw(chunks, Duration::ZERO), &budget())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert!(
            status
                .message()
                .contains("longer than the 10 bytes it declares"),
            "{status:?}"
        );
        // In the prefix's own frame too.
        let mut one = prefix(3).to_vec();
        one.extend_from_slice(b"abcd");
        let status = call_over(
            answering_raw(vec![Bytes::from(one)], Duration::ZERO),
            &budget(),
        )
        .await
        .unwrap_err();
        assert!(
            status.message().contains("longer than the 3 bytes"),
            "{status:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_stalls_while_holding_room_is_given_up_and_its_room_given_back() {
        let budget = budget_of(8 << 20);
        let trickle: Vec<Bytes> = std::iter::once(prefix(4 << 20))
            .chain((0..100).map(|_| Bytes::from_static(b"x")))
            .collect();
        let status = call_over(answering_raw(trickle, Duration::from_secs(1)), &budget)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("stalled"), "{status:?}");
        // Its room came back: the whole budget is there for another.
        assert_eq!(budget.room.available_permits(), budget.kib);
        // One that comes at its pace is read whole, however slowly it
        // began (no room is held before its prefix).
        let paced: Vec<Bytes> = vec![
            prefix(3 << 20),
            Bytes::from(vec![1u8; 1 << 20]),
            Bytes::from(vec![1u8; 1 << 20]),
            Bytes::from(vec![1u8; 1 << 20]),
        ];
        let answer = call_over(answering_raw(paced, Duration::from_secs(1)), &budget)
            .await
            .unwrap();
        assert_eq!(answer.len(), 3 << 20);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_servers_windows_is_sent_as_they_open() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut small = h2::server::Builder::new();
        small.initial_window_size(1000);
        serve_with(small, server, |_, message| {
            (
                http::HeaderMap::new(),
                Some(message),
                Some(grpc_status("0")),
            )
        });
        let message = Bytes::from((0..200 << 10).map(|i| i as u8).collect::<Vec<u8>>());
        let connection = handshake(client, 1);
        let head = method_head("fn:9443", V1_RUN_FUNCTION);
        let budget = budget();
        let call = call_on(&connection, &budget, "fn", &head, &message, None);
        let answer = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("the request never went whole")
            .unwrap();
        assert_eq!(answer, message);
    }

    #[tokio::test]
    async fn a_call_the_server_went_away_before_is_made_again_on_a_new_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fn.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            // The first connection: the server reads up to the call's
            // HEADERS, then goes away having taken no stream.
            let (mut first, _) = listener.accept().await.unwrap();
            let mut read = Vec::new();
            let mut buf = [0u8; 4096];
            while !frames(read.get(24..).unwrap_or_default())
                .iter()
                .any(|&(kind, _, _)| kind == 1)
            {
                let n = first.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its call");
                read.extend_from_slice(&buf[..n]);
            }
            let settings = [0, 0, 0, 4, 0, 0, 0, 0, 0];
            let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            first
                .write_all(&[&settings[..], &goaway[..]].concat())
                .await
                .unwrap();
            // The second answers.
            let (second, _) = listener.accept().await.unwrap();
            serve(second, |_, _| {
                let answer = Some(Bytes::from_static(b"answer"));
                (http::HeaderMap::new(), answer, Some(grpc_status("0")))
            });
            let _ = first.read(&mut buf).await;
        });
        let client = Client::new("fn", Dial::Unix(path), 1, Arc::new(budget()));
        let answer =
            tokio::time::timeout(Duration::from_secs(20), client.call(&Bytes::new(), None))
                .await
                .expect("the call was never answered")
                .unwrap();
        assert_eq!(answer, Bytes::from_static(b"answer"));
    }
}
