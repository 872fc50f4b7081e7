//! xfn's own HTTP/2 client connection to a function server: unary gRPC
//! calls only, and only what they need (RFC 9113), in place of the h2
//! crate's client and its shared machinery (its streams' lock, frame
//! queues, connection task: benches/PROFILE.md, "xfn's own HTTP/2 client").
//! - **A caller writes its own request**: HEADERS and DATA are framed into
//!   the output under the connection's lock (so stream ids go out in
//!   order) and written there, one `write`; what the socket does not take
//!   waits for the reader, which writes it once the socket is writable.
//! - **One reader per connection** (a task spawned where the connection
//!   was made) parses the server's frames into each stream's [`Slot`] and
//!   wakes its caller: no task, channel or allocation per call beyond the
//!   answer's buffer.
//! - **Everything the server sends is bounded**: frames by the 16 KiB
//!   announced (larger: FRAME_SIZE_ERROR), a header block by `MAX_BLOCK`
//!   and its decoded list by [`MAX_HEADER_LIST`] (HPACK with the server's
//!   dynamic table, `grpc::hpack`), a stream's unread bytes by its window
//!   (more: the stream is reset), streams by the caller (push refused),
//!   and the replies it provokes (SETTINGS and PING acknowledgements) by
//!   [`MAX_CONTROL_PENDING`] queued unwritten: past it, the connection is
//!   closed.
//! - **A stream's unread bytes never block another's**: the connection's
//!   window is given back as data arrives, each stream's as its caller
//!   reads (a response waiting for room in the budget only fills its own).
//! - **A call dropped is reset on the wire** (RST_STREAM CANCEL).
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::AsyncRead;
use tonic::codegen::http;
use tonic::Code;

use crate::grpc::frame::{
    content, frame_header, put_frames, window_update, Partial, Reason, ACK, CONTINUATION, DATA,
    END_HEADERS, END_STREAM, FRAME_HEADER, GOAWAY, HEADERS, LAST_ID, MAX_FRAME, MAX_HEADER_LIST,
    MAX_WINDOW, PING, PREFACE, PRIORITY, PRIORITY_FLAG, PUSH_PROMISE, RST_STREAM, SETTINGS,
    TABLE_SIZE, WINDOW_UPDATE,
};
use crate::grpc::hpack::{literal, Decoder};
use crate::grpc::raw::PREFIX;

/// What each stream may have received and not yet been read (h2's default
/// window, `SETTINGS_INITIAL_WINDOW_SIZE` announced).
pub(super) const STREAM_WINDOW: u32 = 65_535;
/// Bytes of frames xfn queues unwritten while the server does not read
/// (its acknowledgements, window updates, resets): a server flooding
/// PINGs or SETTINGS it never reads the answers to is cut off here.
pub(super) const MAX_CONTROL_PENDING: usize = 64 << 10;

/// Why a call on a connection failed (a lost call's status keeps it as its
/// source).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Http2Error {
    #[error("the connection broke")]
    Io(#[source] Arc<io::Error>),
    #[error("the server closed the connection")]
    Closed,
    /// The server went away (GOAWAY) before taking the stream, or the
    /// connection can open no more: it never saw the call, which may be
    /// made again on a new connection.
    #[error("the server took no more calls on the connection ({0})")]
    Unprocessed(Reason),
    #[error("the server went away ({0})")]
    GoAway(Reason),
    #[error("the server reset the stream ({0})")]
    Reset(Reason),
    /// xfn ended the connection, or reset the stream, for this.
    #[error("the server broke HTTP/2 ({reason}): {what}")]
    Protocol { reason: Reason, what: &'static str },
    #[error("its header list is larger than xfn reads ({MAX_HEADER_LIST} bytes)")]
    HeaderList,
}

impl Http2Error {
    /// The status code of a call lost to it (tonic's mapping of h2's).
    pub(crate) fn code(&self) -> Code {
        match self {
            Http2Error::Reset(Reason::CANCEL) => Code::Cancelled,
            Http2Error::Reset(Reason::REFUSED_STREAM) => Code::Unavailable,
            Http2Error::Reset(Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
            Http2Error::Reset(_) | Http2Error::Protocol { .. } => Code::Internal,
            Http2Error::HeaderList => Code::ResourceExhausted,
            _ => Code::Unavailable,
        }
    }

    fn protocol(reason: Reason, what: &'static str) -> Self {
        Http2Error::Protocol { reason, what }
    }
}

/// The write side of a connection's socket.
pub(super) trait Writer: Send + Sync + 'static {
    /// Writes what the socket takes now (`WouldBlock`: nothing).
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize>;
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Ends the connection both ways (the server reads its end).
    fn shutdown(&self);
}

/// A socket a connection is made over: its read and write sides.
pub(super) trait Socket {
    fn split(self) -> (Box<dyn AsyncRead + Send + Unpin>, Box<dyn Writer>);
}

macro_rules! socket {
    ($stream:ty, $write:ty) => {
        impl Writer for $write {
            fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
                self.as_ref().try_write(bytes)
            }
            fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.as_ref().poll_write_ready(cx)
            }
            fn shutdown(&self) {
                use std::os::fd::AsFd;
                let fd = self.as_ref().as_fd();
                let _ = nix::sys::socket::shutdown(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    nix::sys::socket::Shutdown::Both,
                );
            }
        }

        impl Socket for $stream {
            fn split(self) -> (Box<dyn AsyncRead + Send + Unpin>, Box<dyn Writer>) {
                let (read, write) = self.into_split();
                (Box::new(read), Box::new(write))
            }
        }
    };
}
socket!(tokio::net::TcpStream, tokio::net::tcp::OwnedWriteHalf);
socket!(tokio::net::UnixStream, tokio::net::unix::OwnedWriteHalf);

/// A method's request header block, encoded once per client: HPACK
/// literals never indexed (no table to keep), `grpc-timeout` added per
/// call.
#[derive(Debug, Clone)]
pub(super) struct RequestHead {
    block: Bytes,
}

impl RequestHead {
    pub(super) fn new(authority: &str, path: &str) -> Self {
        let mut block = vec![
            0x80 | 3, // :method POST (static 3)
            0x80 | 6, // :scheme http (static 6)
        ];
        literal(&mut block, 4, b"", path.as_bytes()); // :path
        literal(&mut block, 1, b"", authority.as_bytes()); // :authority
        literal(&mut block, 31, b"", b"application/grpc"); // content-type
        literal(&mut block, 0, b"te", b"trailers");
        Self {
            block: Bytes::from(block),
        }
    }
}

/// A header block of the answer, as the call reads it.
#[derive(Debug)]
pub(super) enum Block {
    /// Response headers: their `:status`, no `grpc-status`.
    Head(u16),
    /// Trailers of `grpc-status: 0`.
    Ok,
    /// Any other block (trailers-only, a failure's trailers), whole.
    Fields(Box<http::HeaderMap>),
}

/// One stream's state, filled by the reader and read by its call.
#[derive(Debug, Default)]
struct Slot {
    head: Option<Block>,
    /// Header blocks received (the second is the trailers).
    blocks: u8,
    data: BytesMut,
    trailers: Option<Block>,
    remote_ended: bool,
    local_ended: bool,
    error: Option<Http2Error>,
    waker: Option<Waker>,
    /// What the server may still send before xfn's next WINDOW_UPDATE, and
    /// what its call read and has not given back yet.
    recv_window: i64,
    released: u32,
    send_window: i64,
    /// The request's bytes (framed) waiting for the server's windows.
    unsent: Bytes,
}

impl Slot {
    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn fail(&mut self, err: Http2Error) {
        self.error.get_or_insert(err);
        self.remote_ended = true;
        self.local_ended = true;
        self.unsent = Bytes::new();
        self.wake();
    }
}

#[derive(Debug)]
struct State {
    streams: HashMap<u32, Slot>,
    next_id: u32,
    /// Frames not yet written.
    out: BytesMut,
    /// Control frames queued since `out` was last empty.
    control: usize,
    /// A write waits for the socket (the reader writes `out` when it can).
    write_blocked: bool,
    failed: Option<Http2Error>,
    going_away: bool,
    /// The server's settings.
    max_streams: usize,
    initial_send_window: i64,
    max_send_frame: usize,
    send_window: i64,
    /// Connection-level: what the server may send, and what arrived and
    /// was not yet given back.
    recv_window: i64,
    recv_unacked: u32,
    /// Streams whose request waits for window, in the order they opened.
    blocked: Vec<u32>,
    reader: Option<Waker>,
}

/// A client connection to a function server (see the module header).
pub(super) struct Connection {
    state: Mutex<State>,
    writer: Box<dyn Writer>,
    /// Told when a stream ends or the connection fails (calls waiting for
    /// the server's MAX_CONCURRENT_STREAMS).
    freed: tokio::sync::Notify,
    window: u32,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The reader ends once nothing else holds the connection.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(reader) = state.reader.take() {
            reader.wake();
        }
    }
}

/// A connection over `socket` for at most `streams` calls at once, its
/// reader spawned on this thread. Its preface and settings are queued
/// (written now when the socket takes them); calls may follow at once.
///
/// The connection's window holds every stream's and one more, and is given
/// back as data arrives: a response waiting for room in the budget stops
/// being read, and its unread bytes must never use up the window of the
/// response being read (the one that will give the room back).
pub(super) fn handshake(socket: impl Socket, streams: usize) -> Arc<Connection> {
    let (read, writer) = socket.split();
    let streams = u32::try_from(streams.max(1)).unwrap_or(u32::MAX);
    let window = STREAM_WINDOW
        .saturating_mul(streams.saturating_add(1))
        .min(MAX_WINDOW as u32);
    let mut out = BytesMut::with_capacity(4096);
    out.extend_from_slice(PREFACE);
    let settings: [(u16, u32); 3] = [
        (0x2, 0),             // ENABLE_PUSH
        (0x4, STREAM_WINDOW), // INITIAL_WINDOW_SIZE
        (0x6, MAX_HEADER_LIST as u32),
    ];
    frame_header(&mut out, settings.len() * 6, SETTINGS, 0, 0);
    for (id, value) in settings {
        out.put_u16(id);
        out.put_u32(value);
    }
    window_update(&mut out, 0, window - STREAM_WINDOW);
    let connection = Arc::new(Connection {
        state: Mutex::new(State {
            streams: HashMap::with_capacity(streams as usize),
            next_id: 1,
            out,
            control: 0,
            write_blocked: false,
            failed: None,
            going_away: false,
            max_streams: usize::MAX,
            initial_send_window: i64::from(STREAM_WINDOW),
            max_send_frame: MAX_FRAME,
            send_window: i64::from(STREAM_WINDOW),
            recv_window: i64::from(window),
            recv_unacked: 0,
            blocked: Vec::new(),
            reader: None,
        }),
        writer,
        freed: tokio::sync::Notify::new(),
        window,
    });
    {
        let mut state = connection.lock();
        connection.flush(&mut state);
    }
    tokio::spawn(Reader {
        connection: Arc::downgrade(&connection),
        io: read,
        buf: BytesMut::with_capacity(2 * (FRAME_HEADER + MAX_FRAME)),
        decoder: Decoder::new(TABLE_SIZE),
        block: None,
        fields: Fields::default(),
    });
    connection
}

impl Connection {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a new call may go over it.
    pub(super) fn is_open(&self) -> bool {
        let state = self.lock();
        state.failed.is_none() && !state.going_away && state.next_id <= LAST_ID
    }

    /// Sends a call of `message` (after its gRPC `prefix`) with `head`
    /// (and `timeout`, as `grpc-timeout`), once the server's
    /// MAX_CONCURRENT_STREAMS lets it.
    pub(super) async fn open(
        self: &Arc<Self>,
        head: &RequestHead,
        timeout: Option<&[u8]>,
        prefix: [u8; PREFIX],
        message: &Bytes,
    ) -> Result<Stream, Http2Error> {
        // Told of a stream freed only when none is free: most calls never
        // wait, and never touch the waiters' list.
        let mut waiting = None;
        loop {
            {
                let mut state = self.lock();
                if let Some(err) = &state.failed {
                    return Err(err.clone());
                }
                if state.going_away || state.next_id > LAST_ID {
                    return Err(Http2Error::Unprocessed(Reason::NO_ERROR));
                }
                if state.streams.len() < state.max_streams {
                    let id = self.start(&mut state, head, timeout, prefix, message);
                    return Ok(Stream {
                        connection: Arc::clone(self),
                        id,
                    });
                }
            }
            match waiting.take() {
                // Listening before the next look, so no stream freed after
                // it goes unseen.
                None => {
                    let mut notified = Box::pin(self.freed.notified());
                    notified.as_mut().enable();
                    waiting = Some(notified);
                }
                Some(notified) => notified.await,
            }
        }
    }

    /// Frames the call's HEADERS and as much of its DATA as the windows
    /// take, and writes them.
    fn start(
        &self,
        state: &mut State,
        head: &RequestHead,
        timeout: Option<&[u8]>,
        prefix: [u8; PREFIX],
        message: &Bytes,
    ) -> u32 {
        let id = state.next_id;
        state.next_id += 2;
        let mut slot = Slot {
            recv_window: i64::from(STREAM_WINDOW),
            send_window: state.initial_send_window,
            ..Slot::default()
        };
        // The block: the method's, then `grpc-timeout`.
        let mut extra = [0u8; 32];
        let extra = match timeout {
            Some(value) if value.len() <= 16 => {
                extra[0] = 0x00;
                extra[1] = 12;
                extra[2..14].copy_from_slice(b"grpc-timeout");
                extra[14] = value.len() as u8;
                extra[15..15 + value.len()].copy_from_slice(value);
                &extra[..15 + value.len()]
            }
            _ => &extra[..0],
        };
        let max_frame = state.max_send_frame;
        let out = &mut state.out;
        // The block in frames: HEADERS, then CONTINUATIONs.
        let block = [&head.block[..], extra];
        put_frames(
            out,
            id,
            (HEADERS, CONTINUATION),
            &block,
            max_frame,
            END_HEADERS,
        );
        let framed_len = PREFIX + message.len();
        let room = slot.send_window.min(state.send_window).max(0) as usize;
        if framed_len <= room {
            put_frames(
                out,
                id,
                (DATA, DATA),
                &[&prefix, message],
                max_frame,
                END_STREAM,
            );
            slot.local_ended = true;
            state.send_window -= framed_len as i64;
            slot.send_window -= framed_len as i64;
        } else {
            // Copied once, in this rare case only: sent as the server's
            // windows grow.
            let mut rest = BytesMut::with_capacity(framed_len);
            rest.extend_from_slice(&prefix);
            rest.extend_from_slice(message);
            let mut rest = rest.freeze();
            let now = rest.split_to(room);
            put_frames(out, id, (DATA, DATA), &[&now], max_frame, 0);
            state.send_window -= room as i64;
            slot.send_window -= room as i64;
            slot.unsent = rest;
            state.blocked.push(id);
        }
        state.streams.insert(id, slot);
        self.flush(state);
        id
    }

    /// Writes what is queued, unless a write already waits for the socket
    /// (the reader writes it then).
    fn flush(&self, state: &mut State) {
        while !state.out.is_empty() && !state.write_blocked && state.failed.is_none() {
            match self.writer.try_write(&state.out) {
                Ok(0) => self.fail(
                    state,
                    Http2Error::Io(Arc::new(io::ErrorKind::WriteZero.into())),
                ),
                Ok(n) => state.out.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    state.write_blocked = true;
                    if let Some(reader) = &state.reader {
                        reader.wake_by_ref();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.fail(state, Http2Error::Io(Arc::new(e))),
            }
        }
        if state.out.is_empty() {
            state.control = 0;
        }
    }

    /// Every stream not answered whole fails with `err`; no call opens here
    /// again.
    fn fail(&self, state: &mut State, err: Http2Error) {
        if state.failed.is_some() {
            return;
        }
        tracing::debug!(error = %crate::chain::Chain(&err), "connection to a function server ended");
        for slot in state.streams.values_mut() {
            if !slot.remote_ended {
                slot.fail(err.clone());
            }
        }
        state.blocked.clear();
        state.out.clear();
        state.failed = Some(err);
        self.freed.notify_waiters();
        if let Some(reader) = &state.reader {
            reader.wake_by_ref();
        }
    }

    /// Queues a frame of the reader's (or a reset) that the server's
    /// behaviour asked for; past [`MAX_CONTROL_PENDING`] unwritten, the
    /// connection is given up.
    fn control(
        &self,
        state: &mut State,
        frame: impl FnOnce(&mut BytesMut),
    ) -> Result<(), Http2Error> {
        let before = state.out.len();
        frame(&mut state.out);
        state.control += state.out.len() - before;
        if state.control > MAX_CONTROL_PENDING {
            return Err(Http2Error::protocol(
                Reason::ENHANCE_YOUR_CALM,
                "it provokes frames faster than it reads them",
            ));
        }
        Ok(())
    }

    /// Resets `id` for `reason`: its call fails with `err`.
    fn reset(
        &self,
        state: &mut State,
        id: u32,
        reason: Reason,
        err: Http2Error,
    ) -> Result<(), Http2Error> {
        if let Some(slot) = state.streams.get_mut(&id) {
            slot.fail(err);
        }
        state.blocked.retain(|&b| b != id);
        self.control(state, |out| {
            frame_header(out, 4, RST_STREAM, 0, id);
            out.put_u32(reason.0);
        })
    }

    /// Sends what the windows now take of requests waiting for them.
    fn send_unsent(&self, state: &mut State) {
        let State {
            streams,
            blocked,
            out,
            send_window,
            max_send_frame,
            ..
        } = state;
        blocked.retain(|id| {
            let Some(slot) = streams.get_mut(id) else {
                return false;
            };
            let room = slot.send_window.min(*send_window).max(0) as usize;
            let now = slot.unsent.split_to(room.min(slot.unsent.len()));
            let end = slot.unsent.is_empty();
            if !now.is_empty() {
                let last = if end { END_STREAM } else { 0 };
                put_frames(out, *id, (DATA, DATA), &[&now], *max_send_frame, last);
                *send_window -= now.len() as i64;
                slot.send_window -= now.len() as i64;
            }
            slot.local_ended = end;
            !end
        });
    }
}

/// One call's stream: its answer read through it; dropped, the stream is
/// reset unless it ended both ways.
pub(super) struct Stream {
    connection: Arc<Connection>,
    id: u32,
}

impl Stream {
    fn poll<T>(&self, cx: &mut Context<'_>, take: impl FnOnce(&mut Slot) -> Option<T>) -> Poll<T> {
        let mut state = self.connection.lock();
        let Some(slot) = state.streams.get_mut(&self.id) else {
            // Never: the slot lives as long as the stream.
            return Poll::Pending;
        };
        match take(slot) {
            Some(taken) => Poll::Ready(taken),
            None => {
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    slot.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    /// The answer's first header block.
    pub(super) fn head(&self) -> impl Future<Output = Result<Block, Http2Error>> + '_ {
        std::future::poll_fn(|cx| {
            self.poll(cx, |slot| match (slot.head.take(), &slot.error) {
                (Some(head), _) => Some(Ok(head)),
                (None, Some(err)) => Some(Err(err.clone())),
                (None, None) if slot.remote_ended => Some(Err(Http2Error::protocol(
                    Reason::PROTOCOL_ERROR,
                    "a stream ended without headers",
                ))),
                (None, None) => None,
            })
        })
    }

    /// What arrived of the answer's body since the last call (`None` once
    /// it ended), its window given back as it is read.
    pub(super) fn data(&self) -> impl Future<Output = Result<Option<BytesMut>, Http2Error>> + '_ {
        std::future::poll_fn(|cx| {
            let mut release = 0;
            let read = self.poll(cx, |slot| {
                if !slot.data.is_empty() {
                    let data = slot.data.split();
                    if !slot.remote_ended {
                        slot.released += data.len() as u32;
                        if slot.released >= STREAM_WINDOW / 2 {
                            release = std::mem::take(&mut slot.released);
                            slot.recv_window += i64::from(release);
                        }
                    }
                    return Some(Ok(Some(data)));
                }
                match &slot.error {
                    Some(err) => Some(Err(err.clone())),
                    None if slot.remote_ended => Some(Ok(None)),
                    None => None,
                }
            });
            if release > 0 {
                let mut state = self.connection.lock();
                if state.failed.is_none() {
                    window_update(&mut state.out, self.id, release);
                    self.connection.flush(&mut state);
                }
            }
            read
        })
    }

    /// The answer's trailers, once [`Stream::data`] said it ended.
    pub(super) fn trailers(&self) -> Option<Block> {
        let mut state = self.connection.lock();
        state.streams.get_mut(&self.id)?.trailers.take()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let connection = &self.connection;
        let mut state = connection.lock();
        if let Some(slot) = state.streams.remove(&self.id) {
            if !(slot.remote_ended && slot.local_ended) && state.failed.is_none() {
                state.blocked.retain(|&b| b != self.id);
                frame_header(&mut state.out, 4, RST_STREAM, 0, self.id);
                state.out.put_u32(Reason::CANCEL.0);
                connection.flush(&mut state);
            }
        }
        drop(state);
        connection.freed.notify_one();
    }
}

/// The fields of a decoded block, kept in one buffer reused for every
/// block.
#[derive(Default)]
struct Fields {
    bytes: Vec<u8>,
    /// (name's end, value's end) in `bytes`, each field after the last.
    ends: Vec<(usize, usize)>,
}

/// The connection's reader task (see the module header).
struct Reader {
    connection: Weak<Connection>,
    io: Box<dyn AsyncRead + Send + Unpin>,
    buf: BytesMut,
    decoder: Decoder,
    block: Option<Partial>,
    fields: Fields,
}

impl Future for Reader {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            let Some(connection) = this.connection.upgrade() else {
                return Poll::Ready(());
            };
            {
                let mut state = connection.lock();
                if state.failed.is_some() {
                    return Poll::Ready(());
                }
                if !state
                    .reader
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    state.reader = Some(cx.waker().clone());
                }
                if state.write_blocked {
                    match connection.writer.poll_write_ready(cx) {
                        Poll::Ready(Ok(())) => {
                            state.write_blocked = false;
                            connection.flush(&mut state);
                        }
                        Poll::Ready(Err(e)) => {
                            connection.fail(&mut state, Http2Error::Io(Arc::new(e)));
                            return Poll::Ready(());
                        }
                        Poll::Pending => {}
                    }
                }
            }
            if this.buf.capacity() - this.buf.len() < FRAME_HEADER + MAX_FRAME {
                this.buf.reserve(FRAME_HEADER + MAX_FRAME);
            }
            let read =
                match tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut this.buf) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(0)) => Err(Http2Error::Closed),
                    Poll::Ready(Ok(_)) => Ok(()),
                    Poll::Ready(Err(e)) => Err(Http2Error::Io(Arc::new(e))),
                };
            let mut state = connection.lock();
            let parsed = read.and_then(|()| this.frames(&connection, &mut state));
            if let Err(err) = parsed {
                if let Http2Error::Protocol { reason, .. } = &err {
                    // Told to the server, best effort, then closed.
                    state.out.clear();
                    state.write_blocked = false;
                    frame_header(&mut state.out, 8, GOAWAY, 0, 0);
                    state.out.put_u32(0);
                    state.out.put_u32(reason.0);
                    connection.flush(&mut state);
                    connection.writer.shutdown();
                }
                connection.fail(&mut state, err);
                return Poll::Ready(());
            }
            connection.flush(&mut state);
        }
    }
}

impl Reader {
    /// Handles every whole frame read.
    fn frames(&mut self, connection: &Connection, state: &mut State) -> Result<(), Http2Error> {
        let buf = std::mem::take(&mut self.buf);
        let mut at = 0;
        let result = loop {
            let rest = &buf[at..];
            if rest.len() < FRAME_HEADER {
                break Ok(());
            }
            let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            if length > MAX_FRAME {
                break Err(Http2Error::protocol(
                    Reason::FRAME_SIZE_ERROR,
                    "a frame larger than xfn takes",
                ));
            }
            if rest.len() < FRAME_HEADER + length {
                break Ok(());
            }
            let (kind, flags) = (rest[3], rest[4]);
            let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & LAST_ID;
            let payload = &rest[FRAME_HEADER..FRAME_HEADER + length];
            at += FRAME_HEADER + length;
            if let Err(err) = self.frame(connection, state, kind, flags, id, payload) {
                break Err(err);
            }
        };
        self.buf = buf;
        self.buf.advance(at);
        result
    }

    fn frame(
        &mut self,
        connection: &Connection,
        state: &mut State,
        kind: u8,
        flags: u8,
        id: u32,
        payload: &[u8],
    ) -> Result<(), Http2Error> {
        let protocol = |what| Err(Http2Error::protocol(Reason::PROTOCOL_ERROR, what));
        let frame_size = |what| Err(Http2Error::protocol(Reason::FRAME_SIZE_ERROR, what));
        if self.block.is_some() && kind != CONTINUATION {
            return protocol("a frame inside a header block");
        }
        // A stream xfn never opened.
        let on_stream = matches!(kind, DATA | HEADERS | RST_STREAM | WINDOW_UPDATE);
        if on_stream && id != 0 && (id % 2 == 0 || id >= state.next_id) {
            return protocol("a frame on a stream xfn did not open");
        }
        match kind {
            DATA => {
                if id == 0 {
                    return protocol("DATA on stream 0");
                }
                let length = payload.len() as u32;
                state.recv_window -= i64::from(length);
                if state.recv_window < 0 {
                    return Err(Http2Error::protocol(
                        Reason::FLOW_CONTROL_ERROR,
                        "it sent past the connection's window",
                    ));
                }
                state.recv_unacked += length;
                if state.recv_unacked >= connection.window / 2 {
                    let increment = std::mem::take(&mut state.recv_unacked);
                    state.recv_window += i64::from(increment);
                    connection.control(state, |out| window_update(out, 0, increment))?;
                }
                let data = unpadded(flags, payload, 0)?;
                let Some(slot) = state.streams.get_mut(&id) else {
                    return Ok(());
                };
                if slot.remote_ended {
                    return connection.reset(
                        state,
                        id,
                        Reason::STREAM_CLOSED,
                        Http2Error::protocol(Reason::STREAM_CLOSED, "DATA after the stream ended"),
                    );
                }
                slot.recv_window -= i64::from(length);
                if slot.recv_window < 0 {
                    return connection.reset(
                        state,
                        id,
                        Reason::FLOW_CONTROL_ERROR,
                        Http2Error::protocol(
                            Reason::FLOW_CONTROL_ERROR,
                            "it sent past the stream's window",
                        ),
                    );
                }
                // Padding is given back with what the call reads.
                slot.released += length - data.len() as u32;
                slot.data.extend_from_slice(data);
                slot.remote_ended = flags & END_STREAM != 0;
                slot.wake();
                Ok(())
            }
            HEADERS => {
                if id == 0 {
                    return protocol("HEADERS on stream 0");
                }
                let skip = if flags & PRIORITY_FLAG != 0 { 5 } else { 0 };
                let fragment = unpadded(flags, payload, skip)?;
                let end_stream = flags & END_STREAM != 0;
                if flags & END_HEADERS != 0 {
                    return self.block_done(connection, state, id, end_stream, fragment);
                }
                let mut block = BytesMut::with_capacity(2 * fragment.len());
                block.extend_from_slice(fragment);
                self.block = Some(Partial {
                    stream: id,
                    end_stream,
                    block,
                });
                Ok(())
            }
            CONTINUATION => match Partial::gather(&mut self.block, id, flags, payload) {
                Ok(Some(whole)) => {
                    self.block_done(connection, state, id, whole.end_stream, &whole.block)
                }
                Ok(None) => Ok(()),
                Err((reason, what)) => Err(Http2Error::protocol(reason, what)),
            },
            PRIORITY if payload.len() != 5 => frame_size("a PRIORITY frame not of 5 bytes"),
            RST_STREAM => {
                if id == 0 {
                    return protocol("RST_STREAM on stream 0");
                }
                let [a, b, c, d] = payload else {
                    return frame_size("a RST_STREAM frame not of 4 bytes");
                };
                let reason = Reason(u32::from_be_bytes([*a, *b, *c, *d]));
                state.blocked.retain(|&b| b != id);
                if let Some(slot) = state.streams.get_mut(&id) {
                    if !slot.remote_ended {
                        slot.fail(Http2Error::Reset(reason));
                    }
                    slot.local_ended = true;
                    slot.unsent = Bytes::new();
                }
                Ok(())
            }
            SETTINGS => {
                if id != 0 {
                    return protocol("SETTINGS on a stream");
                }
                if flags & ACK != 0 {
                    return match payload.is_empty() {
                        true => Ok(()),
                        false => frame_size("a SETTINGS acknowledgement with a payload"),
                    };
                }
                if payload.len() % 6 != 0 {
                    return frame_size("a SETTINGS frame not of 6-byte settings");
                }
                for setting in payload.chunks_exact(6) {
                    let value =
                        u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                    match u16::from_be_bytes([setting[0], setting[1]]) {
                        0x2 if value > 1 => return protocol("ENABLE_PUSH not 0 or 1"),
                        0x3 => state.max_streams = value as usize,
                        0x4 => {
                            if i64::from(value) > MAX_WINDOW {
                                return Err(Http2Error::protocol(
                                    Reason::FLOW_CONTROL_ERROR,
                                    "an INITIAL_WINDOW_SIZE over 2^31-1",
                                ));
                            }
                            let delta = i64::from(value) - state.initial_send_window;
                            state.initial_send_window = i64::from(value);
                            for slot in state.streams.values_mut() {
                                slot.send_window += delta;
                                if slot.send_window > MAX_WINDOW {
                                    return Err(Http2Error::protocol(
                                        Reason::FLOW_CONTROL_ERROR,
                                        "a stream's window over 2^31-1",
                                    ));
                                }
                            }
                        }
                        0x5 if !(MAX_FRAME as u32..1 << 24).contains(&value) => {
                            return protocol("a MAX_FRAME_SIZE out of range")
                        }
                        0x5 => state.max_send_frame = value as usize,
                        _ => {}
                    }
                }
                connection.control(state, |out| frame_header(out, 0, SETTINGS, ACK, 0))?;
                connection.send_unsent(state);
                connection.freed.notify_waiters();
                Ok(())
            }
            PUSH_PROMISE => protocol("PUSH_PROMISE, push being off"),
            PING => {
                if id != 0 {
                    return protocol("PING on a stream");
                }
                if payload.len() != 8 {
                    return frame_size("a PING not of 8 bytes");
                }
                if flags & ACK != 0 {
                    return Ok(());
                }
                connection.control(state, |out| {
                    frame_header(out, 8, PING, ACK, 0);
                    out.extend_from_slice(payload);
                })
            }
            GOAWAY => {
                if id != 0 {
                    return protocol("GOAWAY on a stream");
                }
                if payload.len() < 8 {
                    return frame_size("a GOAWAY shorter than 8 bytes");
                }
                let last =
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & LAST_ID;
                let reason = Reason(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
                state.going_away = true;
                for (&stream, slot) in state.streams.iter_mut() {
                    if stream > last {
                        slot.fail(Http2Error::Unprocessed(reason));
                    } else if reason != Reason::NO_ERROR && !slot.remote_ended {
                        slot.fail(Http2Error::GoAway(reason));
                    }
                }
                state.blocked.retain(|&b| b <= last);
                connection.freed.notify_waiters();
                Ok(())
            }
            WINDOW_UPDATE => {
                let [a, b, c, d] = payload else {
                    return frame_size("a WINDOW_UPDATE not of 4 bytes");
                };
                let increment = i64::from(u32::from_be_bytes([*a, *b, *c, *d]) & LAST_ID);
                if id == 0 {
                    if increment == 0 {
                        return protocol("a connection WINDOW_UPDATE of 0");
                    }
                    state.send_window += increment;
                    if state.send_window > MAX_WINDOW {
                        return Err(Http2Error::protocol(
                            Reason::FLOW_CONTROL_ERROR,
                            "the connection's window over 2^31-1",
                        ));
                    }
                } else if let Some(slot) = state.streams.get_mut(&id) {
                    slot.send_window += increment;
                    if increment == 0 || slot.send_window > MAX_WINDOW {
                        let err = Http2Error::protocol(
                            Reason::FLOW_CONTROL_ERROR,
                            "a stream WINDOW_UPDATE out of range",
                        );
                        return connection.reset(state, id, Reason::FLOW_CONTROL_ERROR, err);
                    }
                }
                connection.send_unsent(state);
                Ok(())
            }
            // PRIORITY and unknown frames are ignored.
            _ => Ok(()),
        }
    }

    /// A whole header block: decoded (always: the table must follow the
    /// server's), then given to its stream.
    fn block_done(
        &mut self,
        connection: &Connection,
        state: &mut State,
        id: u32,
        end_stream: bool,
        block: &[u8],
    ) -> Result<(), Http2Error> {
        let trailers = state.streams.get(&id).is_some_and(|slot| slot.blocks > 0);
        let Fields { bytes, ends } = &mut self.fields;
        bytes.clear();
        ends.clear();
        let mut size = 0usize;
        let mut status = None;
        let mut grpc_status = None;
        let decoded = self.decoder.decode(block, |name: &[u8], value: &[u8]| {
            size = size.saturating_add(name.len() + value.len() + 32);
            if size > MAX_HEADER_LIST {
                return;
            }
            match name {
                b":status" => {
                    status = std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse::<u16>().ok())
                }
                name if name.starts_with(b":") => {}
                name => {
                    if name == b"grpc-status" {
                        grpc_status = Some(value == b"0");
                    }
                    bytes.extend_from_slice(name);
                    let name_end = bytes.len();
                    bytes.extend_from_slice(value);
                    ends.push((name_end, bytes.len()));
                }
            }
        });
        if decoded.is_err() {
            return Err(Http2Error::protocol(
                Reason::COMPRESSION_ERROR,
                "a header block xfn cannot decode",
            ));
        }
        let Some(slot) = state.streams.get_mut(&id) else {
            return Ok(());
        };
        if slot.remote_ended {
            let err = Http2Error::protocol(Reason::STREAM_CLOSED, "HEADERS after the stream ended");
            return connection.reset(state, id, Reason::STREAM_CLOSED, err);
        }
        if size > MAX_HEADER_LIST {
            return connection.reset(state, id, Reason::CANCEL, Http2Error::HeaderList);
        }
        if status.is_some_and(|s| (100..200).contains(&s)) && !trailers {
            // An informational answer: the real one follows.
            return Ok(());
        }
        let block = match (trailers, grpc_status) {
            (false, None) => match status {
                Some(status) => Block::Head(status),
                None => {
                    let err = Http2Error::protocol(
                        Reason::PROTOCOL_ERROR,
                        "response headers without :status",
                    );
                    return connection.reset(state, id, Reason::PROTOCOL_ERROR, err);
                }
            },
            (true, Some(true)) => Block::Ok,
            _ => Block::Fields(Box::new(self.fields.map())),
        };
        if !trailers {
            slot.head = Some(block);
        } else if end_stream {
            slot.trailers = Some(block);
        } else {
            let err =
                Http2Error::protocol(Reason::PROTOCOL_ERROR, "trailers not ending the stream");
            return connection.reset(state, id, Reason::PROTOCOL_ERROR, err);
        }
        slot.blocks = slot.blocks.saturating_add(1);
        slot.remote_ended |= end_stream;
        slot.wake();
        Ok(())
    }
}

impl Fields {
    /// The fields as a header map (those no map takes left out).
    fn map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::with_capacity(self.ends.len());
        let mut start = 0;
        for &(name_end, value_end) in &self.ends {
            let name = http::HeaderName::from_bytes(&self.bytes[start..name_end]);
            let value = http::HeaderValue::from_bytes(&self.bytes[name_end..value_end]);
            if let (Ok(name), Ok(value)) = (name, value) {
                map.append(name, value);
            }
            start = value_end;
        }
        map
    }
}

/// A DATA or HEADERS payload without its padding (and `skip` bytes of
/// priority after the pad length).
fn unpadded(flags: u8, payload: &[u8], skip: usize) -> Result<&[u8], Http2Error> {
    match content(flags, payload, skip) {
        Some((start, end)) => Ok(&payload[start..end]),
        None => Err(Http2Error::protocol(
            Reason::PROTOCOL_ERROR,
            "padding longer than its frame",
        )),
    }
}

#[cfg(test)]
mod tests {
    //! Each bound, attacked by a server written frame by frame.
    use super::*;
    use crate::grpc::frame::MAX_BLOCK;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream as RawStream;
    use std::time::Duration;

    /// A function server's end, written and read frame by frame (blocking,
    /// on a thread of its own; a read gives up after 20 s rather than hang
    /// a broken client's test).
    struct Raw(RawStream);

    impl Raw {
        fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> io::Result<()> {
            let mut frame = BytesMut::new();
            frame_header(&mut frame, payload.len(), kind, flags, stream);
            frame.extend_from_slice(payload);
            self.0.write_all(&frame)
        }

        /// The next frame: (type, flags, stream, payload).
        fn next(&mut self) -> io::Result<(u8, u8, u32, Vec<u8>)> {
            let mut header = [0u8; FRAME_HEADER];
            self.0.read_exact(&mut header)?;
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let mut payload = vec![0u8; length];
            self.0.read_exact(&mut payload)?;
            let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
            Ok((header[3], header[4], stream, payload))
        }

        /// The payload of the next frame of `kind` on `stream`.
        fn until(&mut self, kind: u8, stream: u32) -> io::Result<Vec<u8>> {
            loop {
                let (k, _, s, payload) = self.next()?;
                if k == kind && s == stream {
                    return Ok(payload);
                }
            }
        }

        /// The error code of the connection's GOAWAY.
        fn goaway(&mut self) -> io::Result<u32> {
            let payload = self.until(GOAWAY, 0)?;
            Ok(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]))
        }

        /// The error code of `stream`'s RST_STREAM.
        fn reset(&mut self, stream: u32) -> io::Result<u32> {
            let payload = self.until(RST_STREAM, stream)?;
            Ok(u32::from_be_bytes([
                payload[0], payload[1], payload[2], payload[3],
            ]))
        }

        /// Reads the client's preface, sends `settings`, and reads up to
        /// the first request's HEADERS.
        fn accept(&mut self, settings: &[u8]) -> io::Result<()> {
            let mut preface = [0u8; PREFACE.len()];
            self.0.read_exact(&mut preface)?;
            assert_eq!(preface, PREFACE);
            self.frame(SETTINGS, 0, 0, settings)?;
            self.until(HEADERS, 1).map(drop)
        }
    }

    /// A connection to a raw server running `server` on its own thread.
    fn raw<T: Send + 'static>(
        server: impl FnOnce(Raw) -> io::Result<T> + Send + 'static,
    ) -> (Arc<Connection>, std::thread::JoinHandle<io::Result<T>>) {
        let (client, server_end) = RawStream::pair().unwrap();
        server_end
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        client.set_nonblocking(true).unwrap();
        let client = tokio::net::UnixStream::from_std(client).unwrap();
        let thread = std::thread::spawn(move || server(Raw(server_end)));
        (handshake(client, 1), thread)
    }

    /// What the raw server's thread ended with, waited for off this
    /// (single) thread, which the client's reader needs.
    async fn ended<T: Send + 'static>(server: std::thread::JoinHandle<io::Result<T>>) -> T {
        tokio::task::spawn_blocking(move || server.join().unwrap().unwrap())
            .await
            .unwrap()
    }

    async fn call(connection: &Arc<Connection>) -> Stream {
        let head = RequestHead::new("fn:9443", "/fn/Run");
        connection
            .open(&head, None, [0; PREFIX], &Bytes::new())
            .await
            .unwrap()
    }

    /// A header block of `:status 200`.
    const STATUS_200: &[u8] = &[0x88];

    fn protocol_reason(err: Http2Error) -> Reason {
        match err {
            Http2Error::Protocol { reason, .. } => reason,
            other => panic!("not a protocol error: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_frame_larger_than_xfn_announced_ends_the_connection() {
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            raw.frame(HEADERS, END_HEADERS, 1, STATUS_200)?;
            raw.frame(DATA, 0, 1, &vec![0u8; MAX_FRAME + 1])?;
            raw.goaway()
        });
        let stream = call(&connection).await;
        assert!(matches!(stream.head().await, Ok(Block::Head(200))));
        let err = stream.data().await.unwrap_err();
        assert_eq!(protocol_reason(err), Reason::FRAME_SIZE_ERROR);
        assert_eq!(ended(server).await, Reason::FRAME_SIZE_ERROR.0);
        assert!(!connection.is_open());
    }

    #[tokio::test]
    async fn a_header_list_decoding_past_its_bound_fails_the_call_and_resets_its_stream() {
        // One 4 KiB field put in the server's table, then referenced by
        // one byte each: a block of 4 KiB decoding to 6 times that.
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            let mut block = vec![0x88, 0x40, 1, b'x', 0x7f];
            let value = 4000;
            // Its length past the 7-bit prefix (127): 3873 = 33 + 30 × 128.
            block.extend_from_slice(&[0x80 | 33, 30]);
            block.extend_from_slice(&vec![b'a'; value]);
            block.extend_from_slice(&[0x80 | 62; 5]);
            raw.frame(HEADERS, END_HEADERS, 1, &block)?;
            let reset = raw.reset(1)?;
            // Kept open until the client is done.
            let _ = raw.next();
            Ok(reset)
        });
        let stream = call(&connection).await;
        let err = stream.head().await.unwrap_err();
        assert!(matches!(err, Http2Error::HeaderList), "{err:?}");
        // The stream alone: the connection takes calls still.
        assert!(connection.is_open());
        drop((stream, connection));
        assert_eq!(ended(server).await, Reason::CANCEL.0);
    }

    #[tokio::test]
    async fn a_header_block_past_its_bound_ends_the_connection() {
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            raw.frame(HEADERS, 0, 1, STATUS_200)?;
            for _ in 0..=MAX_BLOCK / MAX_FRAME {
                // Never ended: the block grows until xfn stops it.
                let _ = raw.frame(CONTINUATION, 0, 1, &[0x88; MAX_FRAME]);
            }
            raw.goaway()
        });
        let stream = call(&connection).await;
        let err = stream.head().await.unwrap_err();
        assert_eq!(protocol_reason(err), Reason::ENHANCE_YOUR_CALM);
        assert_eq!(ended(server).await, Reason::ENHANCE_YOUR_CALM.0);
    }

    #[tokio::test]
    async fn data_past_a_streams_window_resets_it_with_at_most_the_window_held() {
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            raw.frame(HEADERS, END_HEADERS, 1, STATUS_200)?;
            for _ in 0..5 {
                raw.frame(DATA, 0, 1, &[7u8; 14_000])?;
            }
            raw.reset(1)
        });
        let stream = call(&connection).await;
        assert!(matches!(stream.head().await, Ok(Block::Head(200))));
        assert_eq!(ended(server).await, Reason::FLOW_CONTROL_ERROR.0);
        // Unread until now: what it holds is what the window let in.
        let held = stream.data().await.unwrap().unwrap();
        assert!(held.len() <= STREAM_WINDOW as usize, "{}", held.len());
        let err = stream.data().await.unwrap_err();
        assert_eq!(protocol_reason(err), Reason::FLOW_CONTROL_ERROR);
    }

    #[tokio::test]
    async fn a_flood_of_pings_or_settings_never_read_closes_the_connection() {
        for (kind, payload) in [(PING, &[0u8; 8][..]), (SETTINGS, &[][..])] {
            // 2 MiB of frames asking for answers the server never reads.
            let frames = (2 << 20) / (FRAME_HEADER + payload.len());
            let (connection, server) = raw(move |mut raw| {
                let mut preface = [0u8; PREFACE.len()];
                raw.0.read_exact(&mut preface)?;
                let mut sent = 0;
                while sent < frames && raw.frame(kind, 0, 0, payload).is_ok() {
                    sent += 1;
                }
                Ok(sent)
            });
            let sent = ended(server).await;
            assert!(sent < frames, "all {frames} frames were taken");
            assert!(!connection.is_open());
        }
    }

    #[tokio::test]
    async fn a_push_promise_ends_the_connection() {
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            raw.frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2, 0x82])?;
            raw.goaway()
        });
        let stream = call(&connection).await;
        let err = stream.head().await.unwrap_err();
        assert_eq!(protocol_reason(err), Reason::PROTOCOL_ERROR);
        assert_eq!(ended(server).await, Reason::PROTOCOL_ERROR.0);
    }

    #[tokio::test]
    async fn a_call_the_server_went_away_before_is_unprocessed_and_the_connection_closed_to_calls()
    {
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            raw.frame(GOAWAY, 0, 0, &[0; 8])?;
            // Kept open until the client is done.
            raw.next().map(drop)
        });
        let stream = call(&connection).await;
        let err = stream.head().await.unwrap_err();
        assert!(matches!(err, Http2Error::Unprocessed(_)), "{err:?}");
        assert!(!connection.is_open());
        drop((stream, connection));
        let _ = tokio::task::spawn_blocking(move || server.join()).await;
    }

    #[tokio::test]
    async fn a_call_dropped_is_reset_on_the_wire() {
        let (connection, server) = raw(|mut raw| {
            raw.accept(&[])?;
            raw.reset(1)
        });
        drop(call(&connection).await);
        assert_eq!(ended(server).await, Reason::CANCEL.0);
    }

    #[tokio::test]
    async fn a_call_waits_for_a_stream_the_servers_max_concurrent_streams_frees() {
        let (acked, settings_acked) = std::sync::mpsc::channel();
        let (connection, server) = raw(move |mut raw| {
            let mut preface = [0u8; PREFACE.len()];
            raw.0.read_exact(&mut preface)?;
            raw.frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 1])?;
            loop {
                let (kind, flags, _, _) = raw.next()?;
                if kind == SETTINGS && flags & ACK != 0 {
                    break;
                }
            }
            let _ = acked.send(());
            raw.reset(1)?;
            raw.until(HEADERS, 3).map(drop)
        });
        tokio::task::spawn_blocking(move || settings_acked.recv().unwrap())
            .await
            .unwrap();
        let first = call(&connection).await;
        let mut second = Box::pin(call(&connection));
        assert!(futures::poll!(second.as_mut()).is_pending());
        drop(first);
        let _second = second.await;
        ended(server).await;
    }
}
