//! xfn's own HTTP/2 server connection (RFC 9113), in place of hyper's
//! server and the h2 crate under it, of the shape of xfn's client of
//! function servers (`function_server::http2`): one task per connection
//! reads its frames, polls its calls and writes their answers; no task,
//! channel or frame queue per call (benches/PROFILE.md, "xfn's own HTTP/2
//! server"). Each stream's waker queues only that stream ([`Shared`]).
//! - **Everything a client sends is bounded**: frames by the 16 KiB
//!   announced (larger: FRAME_SIZE_ERROR), a header block by `MAX_BLOCK`
//!   and its decoded list by [`MAX_HEADER_LIST`] (431 past it), streams by
//!   [`MAX_STREAMS`] (refused past it), request bodies not yet read by the
//!   connection's window (given back only as calls read), what xfn writes
//!   and the client does not read by [`OUT_HIGH`] (reading stops until it
//!   drains), and the streams a client makes xfn reset for its errors by
//!   [`MAX_ERROR_RESETS`] (RUSTSEC-2024-0003; past it the connection ends).
//! - **Any `:authority` is taken**: gRPC C-core clients name a Unix
//!   socket's after its path, percent-encoded, which the `http` crate
//!   refuses; such a request reads as `localhost` (callers are judged by
//!   uid or certificate, never by this name).
//! - **Answers go out as made**: HEADERS (END_STREAM when the body is
//!   already done: gRPC's trailers-only), DATA as the client's windows
//!   allow, trailers; literals never indexed, so no table is kept.
//! - **Closing is graceful**: asked to stop, it sends GOAWAY naming the
//!   last stream taken, finishes those, then closes.
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::codegen::http::{self, HeaderMap, HeaderName, HeaderValue, Request, Response};

use super::frame::{
    content, frame_header, put_frames, window_update, Partial, Reason, ACK, CONTINUATION, DATA,
    END_HEADERS, END_STREAM, FRAME_HEADER, GOAWAY, HEADERS, LAST_ID, MAX_FRAME, MAX_HEADER_LIST,
    MAX_WINDOW, PADDED, PING, PREFACE, PRIORITY, PRIORITY_FLAG, PUSH_PROMISE, RST_STREAM, SETTINGS,
    TABLE_SIZE, WINDOW_UPDATE,
};
use super::hpack::{literal, Decoder};

/// Each stream's window for its request body, and the connection's: what
/// tonic's server announced (1 MiB), so a client sees the same server.
const WINDOW: u32 = 1 << 20;
/// Streams open at once on one connection (announced as
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; a client past it is refused): each
/// holds its request's headers (up to [`MAX_HEADER_LIST`]) while its call
/// runs, and admission bounds the calls that do work.
pub(crate) const MAX_STREAMS: usize = 1024;
/// Bytes written and not yet taken by the client past which xfn stops
/// reading from it and polling answers' bodies: a client that does not
/// read cannot make xfn queue more.
const OUT_HIGH: usize = 256 << 10;
/// Streams a client may make xfn reset for its own errors before the
/// connection is ended (h2's `max_local_error_reset_streams`).
const MAX_ERROR_RESETS: usize = 1024;
/// Streams xfn reset recently whose DATA is still let arrive silently.
const RECENT_RESETS: usize = 32;
/// Turns of the connection's loop before it lets other tasks run.
const TURNS: usize = 32;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Http2Error {
    #[error("the connection broke")]
    Io(#[from] io::Error),
    /// xfn ended the connection for this (GOAWAY with `reason`).
    #[error("the client broke HTTP/2 ({reason}): {what}")]
    Protocol { reason: Reason, what: &'static str },
    #[error("the client sent something other than the HTTP/2 preface")]
    Preface,
}

fn protocol<T>(reason: Reason, what: &'static str) -> Result<T, Http2Error> {
    Err(Http2Error::Protocol { reason, what })
}

/// What answers the calls of a connection (the seam to the services).
pub(crate) trait Answering {
    /// A call's answer.
    type Answer: Future<Output = Response<Self::Body>> + Send + Unpin;
    /// An answer's body.
    type Body: http_body::Body<Data = Bytes, Error = tonic::Status> + Send + Unpin;
    /// The answer to `request`.
    fn answer(&self, request: Request<RequestBody>) -> Self::Answer;
}

/// The streams whose waker fired, for the connection's task to poll.
#[derive(Default)]
struct Woken {
    ids: Vec<u32>,
    /// Connection window given back by calls reading their requests.
    released: u32,
    task: Option<Waker>,
}

/// What one stream shares between the connection and its call: its waker
/// (queuing the stream) and its request body's frames.
struct Shared {
    id: u32,
    woken: Arc<Mutex<Woken>>,
    queued: AtomicBool,
    inbound: Mutex<Inbound>,
}

/// A request body's state, filled by the connection, read by its call.
#[derive(Default)]
struct Inbound {
    /// What arrived and was not read yet: a gRPC request's one frame in
    /// `first` (no allocation), what follows it in `rest`.
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
    ended: bool,
    reset: Option<Reason>,
    /// The body is gone: what arrives is given back at once.
    dropped: bool,
    /// Read since the stream's window was last given back.
    released: u32,
    waker: Option<Waker>,
}

impl Inbound {
    fn push(&mut self, data: Bytes) {
        match self.first {
            None => self.first = Some(data),
            Some(_) => self.rest.push_back(data),
        }
    }

    fn pop(&mut self) -> Option<Bytes> {
        let data = self.first.take();
        self.first = self.rest.pop_front();
        data
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic while holding it leaves nothing half-done.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn queue(&self) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut woken = lock(&self.woken);
        woken.ids.push(self.id);
        if let Some(task) = &woken.task {
            task.wake_by_ref();
        }
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.queue();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.queue();
    }
}

/// A request's body, as its call reads it: its stream's window is given
/// back as it is read.
pub(crate) struct RequestBody {
    shared: Option<Arc<Shared>>,
}

impl RequestBody {
    /// Gives back `n` bytes read: to the connection always, to the stream
    /// once half its window was read (the connection's task sends both).
    fn release(shared: &Shared, inbound: &mut Inbound, n: u32) {
        if n == 0 {
            return;
        }
        inbound.released += n;
        let stream_due = inbound.released >= WINDOW / 2 && !inbound.ended;
        let mut woken = lock(&shared.woken);
        woken.released += n;
        let due = woken.released >= WINDOW / 2;
        if stream_due && !shared.queued.swap(true, Ordering::AcqRel) {
            woken.ids.push(shared.id);
        }
        if due || stream_due {
            if let Some(task) = &woken.task {
                task.wake_by_ref();
            }
        }
    }
}

/// A stream reset by the client (or the connection's end) while its
/// request was still arriving.
#[derive(Debug, thiserror::Error)]
#[error("the stream was reset ({0})")]
pub(crate) struct StreamReset(Reason);

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = StreamReset;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, StreamReset>>> {
        let Some(shared) = &self.shared else {
            return Poll::Ready(None);
        };
        let mut inbound = lock(&shared.inbound);
        if let Some(data) = inbound.pop() {
            Self::release(shared, &mut inbound, data.len() as u32);
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        if let Some(reason) = inbound.reset {
            return Poll::Ready(Some(Err(StreamReset(reason))));
        }
        if inbound.ended {
            return Poll::Ready(None);
        }
        if !inbound
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            inbound.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.shared.as_ref().is_none_or(|shared| {
            let inbound = lock(&shared.inbound);
            inbound.ended && inbound.first.is_none()
        })
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        let mut inbound = lock(&shared.inbound);
        inbound.dropped = true;
        let mut unread = 0;
        while let Some(data) = inbound.pop() {
            unread += data.len();
        }
        // Only the connection's window: the stream's no longer matters.
        inbound.ended = true;
        Self::release(&shared, &mut inbound, unread as u32);
    }
}

/// Where a stream's answer is.
enum Stage<F, B> {
    Answering(F),
    Body(B),
    Done,
}

/// One stream, as the connection holds it.
struct Stream<F, B> {
    shared: Arc<Shared>,
    waker: Waker,
    stage: Stage<F, B>,
    /// The answer's data the client's windows do not take yet, and its
    /// trailers, sent after it.
    pending: Bytes,
    trailers: Option<HeaderMap>,
    /// The answer's body is done: END_STREAM goes with the last of
    /// `pending` (or the trailers).
    body_done: bool,
    send_window: i64,
    recv_window: i64,
    remote_ended: bool,
    /// The request's declared `content-length`, and what arrived of it.
    content_length: Option<u64>,
    received: u64,
}

impl<F, B> Stream<F, B> {
    /// The stream is gone (its call dropped with it): a request still
    /// arriving ends in `reason`.
    fn end(self, reason: Reason) {
        let mut inbound = lock(&self.shared.inbound);
        if !self.remote_ended {
            inbound.reset = Some(reason);
        }
        if let Some(waker) = inbound.waker.take() {
            waker.wake();
        }
    }
}

/// Serves HTTP/2 on `io`, every call answered by `answering`, until the
/// client closes it or, once `stop` resolves, gracefully (GOAWAY; the
/// calls taken finish).
pub(crate) async fn serve<IO, A>(
    io: IO,
    answering: A,
    stop: impl Future<Output = ()>,
) -> Result<(), Http2Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    A: Answering,
{
    let mut connection = Connection::new(io, answering);
    let mut stop = std::pin::pin!(stop);
    std::future::poll_fn(|cx| {
        if !connection.stopping && stop.as_mut().poll(cx).is_ready() {
            connection.go_away(Reason::NO_ERROR);
        }
        connection.poll(cx)
    })
    .await
}

struct Connection<IO, A: Answering> {
    io: IO,
    answering: A,
    read: BytesMut,
    out: BytesMut,
    read_closed: bool,
    preface: bool,
    settings_seen: bool,
    decoder: Decoder,
    block: Option<Partial>,
    fields: Fields,
    streams: HashMap<u32, Stream<A::Answer, A::Body>>,
    woken: Arc<Mutex<Woken>>,
    /// Streams to poll this turn (new ones, and those windows freed).
    turn: Vec<u32>,
    /// Streams whose data waits for the client's windows, and for `out`
    /// to drain.
    window_blocked: Vec<u32>,
    out_blocked: Vec<u32>,
    last_id: u32,
    send_window: i64,
    initial_send_window: i64,
    max_send_frame: usize,
    recv_window: i64,
    /// The client lowered the table size: say so in the next block.
    table_update: bool,
    /// GOAWAY sent: streams past `announced` are not taken.
    stopping: bool,
    announced: u32,
    error_resets: usize,
    recent_resets: VecDeque<u32>,
    /// A bad `:authority` was logged (once a connection).
    lenient_logged: bool,
    /// A header block being encoded (reused).
    scratch: Vec<u8>,
}

/// The fields of a decoded block, in one buffer reused for every block.
#[derive(Default)]
struct Fields {
    bytes: Vec<u8>,
    /// (name's end, value's end) in `bytes`, each field after the last.
    ends: Vec<(usize, usize)>,
    size: usize,
}

impl<IO, A> Connection<IO, A>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    A: Answering,
{
    fn new(io: IO, answering: A) -> Self {
        let mut out = BytesMut::with_capacity(16 << 10);
        let settings: [(u16, u32); 3] = [
            (0x3, MAX_STREAMS as u32),     // MAX_CONCURRENT_STREAMS
            (0x4, WINDOW),                 // INITIAL_WINDOW_SIZE
            (0x6, MAX_HEADER_LIST as u32), // MAX_HEADER_LIST_SIZE
        ];
        frame_header(&mut out, settings.len() * 6, SETTINGS, 0, 0);
        for (id, value) in settings {
            out.put_u16(id);
            out.put_u32(value);
        }
        window_update(&mut out, 0, WINDOW - 65_535);
        let decoder = Decoder::new(TABLE_SIZE);
        Self {
            io,
            answering,
            read: BytesMut::with_capacity(2 * (FRAME_HEADER + MAX_FRAME)),
            out,
            read_closed: false,
            preface: false,
            settings_seen: false,
            decoder,
            block: None,
            fields: Fields::default(),
            streams: HashMap::new(),
            woken: Arc::new(Mutex::new(Woken::default())),
            turn: Vec::new(),
            window_blocked: Vec::new(),
            out_blocked: Vec::new(),
            scratch: Vec::with_capacity(256),
            last_id: 0,
            send_window: 65_535,
            initial_send_window: 65_535,
            max_send_frame: MAX_FRAME,
            recv_window: i64::from(WINDOW),
            table_update: false,
            stopping: false,
            announced: 0,
            error_resets: 0,
            recent_resets: VecDeque::new(),
            lenient_logged: false,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Http2Error>> {
        {
            let mut woken = lock(&self.woken);
            if !woken.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                woken.task = Some(cx.waker().clone());
            }
        }
        for _ in 0..TURNS {
            let mut progressed = false;
            if !self.read_closed && self.out.len() < OUT_HIGH {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(())) => progressed = true,
                    Poll::Ready(Err(err)) => return Poll::Ready(self.fail(err)),
                    Poll::Pending => {}
                }
            }
            self.take_woken();
            if !self.turn.is_empty() {
                progressed = true;
                while let Some(id) = self.turn.pop() {
                    self.poll_stream(id);
                }
            }
            match self.poll_write(cx) {
                Poll::Ready(Ok(wrote)) => progressed |= wrote,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => {}
            }
            if self.out.len() < OUT_HIGH && !self.out_blocked.is_empty() {
                self.turn.append(&mut self.out_blocked);
                progressed = true;
            }
            let done = (self.read_closed || self.stopping) && self.streams.is_empty();
            if done && self.out.is_empty() {
                // Best effort: the client may already be gone.
                let _ = Pin::new(&mut self.io).poll_shutdown(cx);
                return Poll::Ready(Ok(()));
            }
            if !progressed {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Reads what arrived and handles every whole frame in it.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Http2Error>> {
        if self.read.capacity() - self.read.len() < FRAME_HEADER + MAX_FRAME {
            self.read.reserve(FRAME_HEADER + MAX_FRAME);
        }
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(err)) => Poll::Ready(Err(err.into())),
            Poll::Ready(Ok(0)) => {
                self.read_closed = true;
                self.end_all(Reason::CANCEL);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(_)) => Poll::Ready(self.frames()),
        }
    }

    /// Writes what is queued; `true` once some of it was written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Http2Error>> {
        let mut wrote = false;
        while !self.out.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, &self.out) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()))
                }
                Poll::Ready(Ok(n)) => {
                    self.out.advance(n);
                    wrote = true;
                }
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err.into())),
                Poll::Pending => break,
            }
        }
        if wrote || self.out.is_empty() {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err.into())),
                Poll::Ready(Ok(())) | Poll::Pending => {}
            }
        }
        if wrote {
            Poll::Ready(Ok(true))
        } else {
            Poll::Pending
        }
    }

    /// Ends the connection for `err`: a protocol error is told to the
    /// client first (GOAWAY), best effort.
    fn fail(&mut self, err: Http2Error) -> Result<(), Http2Error> {
        if let Http2Error::Preface = &err {
            tracing::debug!("a client sent no HTTP/2 preface; its connection is closed");
        }
        if let Http2Error::Protocol { reason, what } = &err {
            tracing::debug!(%reason, what, "a client broke HTTP/2; its connection is closed");
            // After what was already queued (the resets that led here).
            frame_header(&mut self.out, 8, GOAWAY, 0, 0);
            self.out.put_u32(self.last_id);
            self.out.put_u32(reason.0);
            let _ = self.poll_write(&mut Context::from_waker(Waker::noop()));
        }
        self.end_all(Reason::CANCEL);
        Err(err)
    }

    /// Sends GOAWAY: streams past the last taken are not served.
    fn go_away(&mut self, reason: Reason) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.announced = self.last_id;
        frame_header(&mut self.out, 8, GOAWAY, 0, 0);
        self.out.put_u32(self.last_id);
        self.out.put_u32(reason.0);
        // Woken to write it, and to close if nothing is in flight.
        if let Some(task) = &lock(&self.woken).task {
            task.wake_by_ref();
        }
    }

    /// Every stream's request ends in `reason`, its call dropped.
    fn end_all(&mut self, reason: Reason) {
        for (_, stream) in self.streams.drain() {
            stream.end(reason);
        }
    }

    /// Takes the streams woken, and gives the connection's window back
    /// once half of it was read.
    fn take_woken(&mut self) {
        let mut woken = lock(&self.woken);
        let released = match woken.released >= WINDOW / 2 {
            true => std::mem::take(&mut woken.released),
            false => 0,
        };
        self.turn.append(&mut woken.ids);
        drop(woken);
        if released > 0 {
            self.recv_window += i64::from(released);
            window_update(&mut self.out, 0, released);
        }
    }

    /// Streams waiting for the client's windows are polled again.
    fn unblock_windows(&mut self) {
        self.turn.append(&mut self.window_blocked);
    }

    /// Handles every whole frame read.
    fn frames(&mut self) -> Result<(), Http2Error> {
        if !self.preface {
            if self.read.len() < PREFACE.len() {
                return match PREFACE.starts_with(&self.read) {
                    true => Ok(()),
                    false => Err(Http2Error::Preface),
                };
            }
            if &self.read[..PREFACE.len()] != PREFACE {
                return Err(Http2Error::Preface);
            }
            self.read.advance(PREFACE.len());
            self.preface = true;
        }
        loop {
            if self.read.len() < FRAME_HEADER {
                return Ok(());
            }
            let head = &self.read[..FRAME_HEADER];
            let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            if length > MAX_FRAME {
                return protocol(Reason::FRAME_SIZE_ERROR, "a frame larger than xfn takes");
            }
            if self.read.len() < FRAME_HEADER + length {
                return Ok(());
            }
            let (kind, flags) = (head[3], head[4]);
            let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & LAST_ID;
            self.read.advance(FRAME_HEADER);
            let payload = self.read.split_to(length);
            if !self.settings_seen {
                if kind != SETTINGS || flags & ACK != 0 {
                    return protocol(Reason::PROTOCOL_ERROR, "a first frame other than SETTINGS");
                }
                self.settings_seen = true;
            }
            self.frame(kind, flags, id, payload)?;
        }
    }

    fn frame(&mut self, kind: u8, flags: u8, id: u32, payload: BytesMut) -> Result<(), Http2Error> {
        use Reason as R;
        if self.block.is_some() && kind != CONTINUATION {
            return protocol(R::PROTOCOL_ERROR, "a frame inside a header block");
        }
        let stream_frame = matches!(kind, DATA | HEADERS | PRIORITY | RST_STREAM | CONTINUATION);
        if stream_frame && id == 0 {
            return protocol(R::PROTOCOL_ERROR, "a stream's frame on stream 0");
        }
        if matches!(kind, SETTINGS | PING | GOAWAY) && id != 0 {
            return protocol(R::PROTOCOL_ERROR, "a connection's frame on a stream");
        }
        match kind {
            DATA => self.data(flags, id, payload),
            HEADERS => {
                let skip = if flags & PRIORITY_FLAG != 0 { 5 } else { 0 };
                let (start, end) = unpadded(flags, &payload, skip)?;
                if skip == 5 && depends_on(&payload[start - 5..start]) == id {
                    return self.stream_error(
                        id,
                        R::PROTOCOL_ERROR,
                        "a stream that depends on itself",
                    );
                }
                let end_stream = flags & END_STREAM != 0;
                let mut block = payload;
                block.truncate(end);
                block.advance(start);
                if flags & END_HEADERS != 0 {
                    return self.block_done(id, end_stream, &block);
                }
                self.block = Some(Partial {
                    stream: id,
                    end_stream,
                    block,
                });
                Ok(())
            }
            CONTINUATION => match Partial::gather(&mut self.block, id, flags, &payload) {
                Ok(Some(whole)) => self.block_done(id, whole.end_stream, &whole.block),
                Ok(None) => Ok(()),
                Err((reason, what)) => protocol(reason, what),
            },
            PRIORITY => {
                if payload.len() != 5 {
                    return self.stream_error(
                        id,
                        R::FRAME_SIZE_ERROR,
                        "a PRIORITY frame not of 5 bytes",
                    );
                }
                if depends_on(&payload) == id {
                    return self.stream_error(
                        id,
                        R::PROTOCOL_ERROR,
                        "a stream that depends on itself",
                    );
                }
                Ok(())
            }
            RST_STREAM => {
                if payload.len() != 4 {
                    return protocol(R::FRAME_SIZE_ERROR, "a RST_STREAM frame not of 4 bytes");
                }
                if self.is_idle(id) {
                    return protocol(R::PROTOCOL_ERROR, "RST_STREAM on an idle stream");
                }
                let reason = Reason(u32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]));
                if let Some(stream) = self.streams.remove(&id) {
                    stream.end(reason);
                }
                Ok(())
            }
            SETTINGS => self.settings(flags, &payload),
            PUSH_PROMISE => protocol(R::PROTOCOL_ERROR, "PUSH_PROMISE from a client"),
            PING => {
                if payload.len() != 8 {
                    return protocol(R::FRAME_SIZE_ERROR, "a PING not of 8 bytes");
                }
                if flags & ACK == 0 {
                    frame_header(&mut self.out, 8, PING, ACK, 0);
                    self.out.extend_from_slice(&payload);
                }
                Ok(())
            }
            GOAWAY => {
                if payload.len() < 8 {
                    return protocol(R::FRAME_SIZE_ERROR, "a GOAWAY shorter than 8 bytes");
                }
                // The client opens no more: finish what it opened, then
                // close.
                self.go_away(R::NO_ERROR);
                Ok(())
            }
            WINDOW_UPDATE => {
                if payload.len() != 4 {
                    return protocol(R::FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes");
                }
                let increment = i64::from(
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & LAST_ID,
                );
                if id == 0 {
                    if increment == 0 {
                        return protocol(R::PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0");
                    }
                    self.send_window += increment;
                    if self.send_window > MAX_WINDOW {
                        return protocol(R::FLOW_CONTROL_ERROR, "the window over 2^31-1");
                    }
                    self.unblock_windows();
                    return Ok(());
                }
                if self.is_idle(id) {
                    return protocol(R::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream");
                }
                if increment == 0 {
                    return self.stream_error(id, R::PROTOCOL_ERROR, "a WINDOW_UPDATE of 0");
                }
                let Some(stream) = self.streams.get_mut(&id) else {
                    return Ok(());
                };
                stream.send_window += increment;
                if stream.send_window > MAX_WINDOW {
                    return self.stream_error(id, R::FLOW_CONTROL_ERROR, "a window over 2^31-1");
                }
                if let Some(at) = self.window_blocked.iter().position(|&b| b == id) {
                    self.turn.push(self.window_blocked.swap_remove(at));
                }
                Ok(())
            }
            // Unknown frames are ignored.
            _ => Ok(()),
        }
    }

    fn is_idle(&self, id: u32) -> bool {
        id > self.last_id
    }

    fn settings(&mut self, flags: u8, payload: &[u8]) -> Result<(), Http2Error> {
        use Reason as R;
        if flags & ACK != 0 {
            return match payload.is_empty() {
                true => Ok(()),
                false => protocol(
                    R::FRAME_SIZE_ERROR,
                    "a SETTINGS acknowledgement with a payload",
                ),
            };
        }
        if payload.len() % 6 != 0 {
            return protocol(
                R::FRAME_SIZE_ERROR,
                "a SETTINGS frame not of 6-byte settings",
            );
        }
        for setting in payload.chunks_exact(6) {
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match u16::from_be_bytes([setting[0], setting[1]]) {
                0x1 if (value as usize) < TABLE_SIZE => self.table_update = true,
                0x2 if value > 1 => return protocol(R::PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1"),
                0x4 => {
                    if i64::from(value) > MAX_WINDOW {
                        return protocol(
                            R::FLOW_CONTROL_ERROR,
                            "an INITIAL_WINDOW_SIZE over 2^31-1",
                        );
                    }
                    let delta = i64::from(value) - self.initial_send_window;
                    self.initial_send_window = i64::from(value);
                    for stream in self.streams.values_mut() {
                        stream.send_window += delta;
                        if stream.send_window > MAX_WINDOW {
                            return protocol(
                                R::FLOW_CONTROL_ERROR,
                                "a stream's window over 2^31-1",
                            );
                        }
                    }
                    if delta > 0 {
                        self.unblock_windows();
                    }
                }
                0x5 if !(MAX_FRAME as u32..1 << 24).contains(&value) => {
                    return protocol(R::PROTOCOL_ERROR, "a MAX_FRAME_SIZE out of range")
                }
                0x5 => self.max_send_frame = value as usize,
                _ => {}
            }
        }
        frame_header(&mut self.out, 0, SETTINGS, ACK, 0);
        Ok(())
    }

    fn data(&mut self, flags: u8, id: u32, payload: BytesMut) -> Result<(), Http2Error> {
        use Reason as R;
        let length = payload.len() as u32;
        self.recv_window -= i64::from(length);
        if self.recv_window < 0 {
            return protocol(R::FLOW_CONTROL_ERROR, "DATA past the connection's window");
        }
        let (start, end) = unpadded(flags, &payload, 0)?;
        let end_stream = flags & END_STREAM != 0;
        let Some(stream) = self.streams.get_mut(&id) else {
            // Never buffered: given back at once.
            self.give_back(length);
            if self.is_idle(id) {
                return protocol(R::PROTOCOL_ERROR, "DATA on an idle stream");
            }
            if self.recent_resets.contains(&id) {
                return Ok(());
            }
            return self.stream_error(id, R::STREAM_CLOSED, "DATA on a closed stream");
        };
        if stream.remote_ended {
            self.give_back(length);
            return self.stream_error(id, R::STREAM_CLOSED, "DATA after its request ended");
        }
        stream.recv_window -= i64::from(length);
        if stream.recv_window < 0 {
            self.give_back(length);
            return self.stream_error(id, R::FLOW_CONTROL_ERROR, "DATA past the stream's window");
        }
        let data = payload.freeze().slice(start..end);
        stream.received += data.len() as u64;
        let over = stream.content_length.is_some_and(|declared| {
            stream.received > declared || (end_stream && stream.received != declared)
        });
        if over {
            self.give_back(length);
            return self.stream_error(id, R::PROTOCOL_ERROR, "DATA other than its content-length");
        }
        stream.remote_ended = end_stream;
        let padding = length - data.len() as u32;
        let mut inbound = lock(&stream.shared.inbound);
        let given_back = if inbound.dropped {
            length
        } else {
            if !data.is_empty() {
                inbound.push(data);
            }
            padding
        };
        inbound.ended |= end_stream;
        if let Some(waker) = inbound.waker.take() {
            waker.wake();
        }
        drop(inbound);
        // Padding, and what no call will read, counts against the
        // connection's window only until it is read here.
        self.give_back(given_back);
        Ok(())
    }

    /// Gives `n` bytes of the connection's window back at once.
    fn give_back(&mut self, n: u32) {
        if n > 0 {
            let mut woken = lock(&self.woken);
            woken.released += n;
        }
    }

    /// Resets `id` for the client's error; past [`MAX_ERROR_RESETS`] the
    /// connection ends instead.
    fn stream_error(&mut self, id: u32, reason: Reason, what: &str) -> Result<(), Http2Error> {
        tracing::debug!(stream = id, %reason, what, "a client's stream broke HTTP/2; it is reset");
        self.error_resets += 1;
        if self.error_resets > MAX_ERROR_RESETS {
            return protocol(
                Reason::ENHANCE_YOUR_CALM,
                "too many streams reset for its errors",
            );
        }
        self.reset(id, reason);
        Ok(())
    }

    /// Resets `id` (RST_STREAM), its call dropped.
    fn reset(&mut self, id: u32, reason: Reason) {
        frame_header(&mut self.out, 4, RST_STREAM, 0, id);
        self.out.put_u32(reason.0);
        if let Some(stream) = self.streams.remove(&id) {
            stream.end(reason);
        }
        self.remember_reset(id);
    }

    fn remember_reset(&mut self, id: u32) {
        if self.recent_resets.len() == RECENT_RESETS {
            self.recent_resets.pop_front();
        }
        self.recent_resets.push_back(id);
    }

    /// A whole header block: decoded (always: the table must follow the
    /// client's), then a new stream's request, or a request's trailers.
    fn block_done(&mut self, id: u32, end_stream: bool, block: &[u8]) -> Result<(), Http2Error> {
        use Reason as R;
        let fields = &mut self.fields;
        fields.bytes.clear();
        fields.ends.clear();
        fields.size = 0;
        let decoded = self.decoder.decode(block, |name, value| {
            fields.size = fields.size.saturating_add(name.len() + value.len() + 32);
            if fields.size > MAX_HEADER_LIST {
                return;
            }
            fields.bytes.extend_from_slice(name);
            let name_end = fields.bytes.len();
            fields.bytes.extend_from_slice(value);
            fields.ends.push((name_end, fields.bytes.len()));
        });
        if decoded.is_err() {
            return protocol(R::COMPRESSION_ERROR, "a header block HPACK cannot decode");
        }
        if let Some(stream) = self.streams.get_mut(&id) {
            // Trailers: they end the request.
            if stream.remote_ended {
                return self.stream_error(id, R::STREAM_CLOSED, "HEADERS after its request ended");
            }
            if !end_stream {
                return self.stream_error(id, R::PROTOCOL_ERROR, "trailers that do not end it");
            }
            stream.remote_ended = true;
            let mut inbound = lock(&stream.shared.inbound);
            inbound.ended = true;
            if let Some(waker) = inbound.waker.take() {
                waker.wake();
            }
            return Ok(());
        }
        if id % 2 == 0 {
            return protocol(R::PROTOCOL_ERROR, "HEADERS on a stream id a server opens");
        }
        if id <= self.last_id {
            if self.recent_resets.contains(&id) {
                // Sent before the client saw xfn's reset.
                return Ok(());
            }
            return protocol(R::STREAM_CLOSED, "HEADERS on a closed stream");
        }
        self.last_id = id;
        if self.stopping && id > self.announced {
            // After GOAWAY: not taken (its client makes it again); what
            // else arrives for it is let be.
            self.remember_reset(id);
            return Ok(());
        }
        if self.streams.len() >= MAX_STREAMS {
            self.reset(id, R::REFUSED_STREAM);
            return Ok(());
        }
        if self.fields.size > MAX_HEADER_LIST {
            // As h2 answers it: 431, the request never handed on.
            let status = http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
            self.headers(id, &status, &HeaderMap::new(), true);
            if !end_stream {
                self.reset(id, R::NO_ERROR);
            }
            return Ok(());
        }
        let Head {
            parts,
            content_length,
            lenient,
        } = match request_parts(&self.fields) {
            Ok(head) => head,
            Err(Malformed(what)) => return self.stream_error(id, R::PROTOCOL_ERROR, what),
        };
        if let Some(authority) = lenient.filter(|_| !self.lenient_logged) {
            // Once a connection: gRPC C-core names a Unix socket so.
            self.lenient_logged = true;
            let authority = String::from_utf8_lossy(&authority);
            tracing::debug!(%authority, "a client's :authority does not parse; read as localhost");
        }
        if end_stream && content_length.is_some_and(|n| n != 0) {
            return self.stream_error(id, R::PROTOCOL_ERROR, "a content-length but no body");
        }
        let shared = Arc::new(Shared {
            id,
            woken: Arc::clone(&self.woken),
            queued: AtomicBool::new(true),
            inbound: Mutex::new(Inbound {
                ended: end_stream,
                ..Inbound::default()
            }),
        });
        let body = RequestBody {
            shared: Some(Arc::clone(&shared)),
        };
        let answer = self.answering.answer(Request::from_parts(parts, body));
        self.streams.insert(
            id,
            Stream {
                waker: Waker::from(Arc::clone(&shared)),
                shared,
                stage: Stage::Answering(answer),
                pending: Bytes::new(),
                trailers: None,
                body_done: false,
                send_window: self.initial_send_window,
                recv_window: i64::from(WINDOW),
                remote_ended: end_stream,
                content_length,
                received: 0,
            },
        );
        self.turn.push(id);
        Ok(())
    }

    /// Polls stream `id`'s call, and sends what it answered.
    fn poll_stream(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.shared.queued.store(false, Ordering::Release);
        if !stream.remote_ended {
            let mut inbound = lock(&stream.shared.inbound);
            if inbound.released >= WINDOW / 2 {
                let released = std::mem::take(&mut inbound.released);
                stream.recv_window += i64::from(released);
                window_update(&mut self.out, id, released);
            }
        }
        let waker = stream.waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            let Some(stream) = self.streams.get_mut(&id) else {
                return;
            };
            let step = match &mut stream.stage {
                Stage::Answering(answer) => {
                    let Poll::Ready(response) = Pin::new(answer).poll(&mut cx) else {
                        return;
                    };
                    let (parts, body) = response.into_parts();
                    let ended = body.is_end_stream();
                    stream.stage = match ended {
                        true => Stage::Done,
                        false => Stage::Body(body),
                    };
                    Step::Headers(parts, ended)
                }
                Stage::Body(_) if !stream.pending.is_empty() => Step::Send,
                Stage::Body(_) if self.out.len() >= OUT_HIGH => {
                    self.out_blocked.push(id);
                    return;
                }
                Stage::Body(body) => match Pin::new(body).poll_frame(&mut cx) {
                    Poll::Pending => return,
                    Poll::Ready(Some(Ok(frame))) => {
                        match frame.into_data() {
                            Ok(data) => stream.pending = data,
                            Err(frame) => {
                                stream.trailers = frame.into_trailers().ok();
                                stream.body_done = true;
                                stream.stage = Stage::Done;
                            }
                        }
                        Step::Send
                    }
                    Poll::Ready(None) => {
                        stream.body_done = true;
                        stream.stage = Stage::Done;
                        Step::Send
                    }
                    Poll::Ready(Some(Err(status))) => Step::Failed(status),
                },
                Stage::Done => Step::Send,
            };
            match step {
                Step::Headers(parts, ended) => {
                    self.headers(id, &parts.status, &parts.headers, ended);
                    if ended {
                        return self.ended(id);
                    }
                }
                Step::Send => {
                    if !self.send_pending(id) {
                        return;
                    }
                    let answered = self.streams.get(&id).is_some_and(|s| {
                        matches!(s.stage, Stage::Done) && s.pending.is_empty() && !s.body_done
                    });
                    if answered {
                        return self.ended(id);
                    }
                }
                Step::Failed(status) => {
                    tracing::debug!(code = ?status.code(), "an answer's body failed; its stream is reset");
                    return self.reset(id, Reason::INTERNAL_ERROR);
                }
            }
        }
    }

    /// Sends what the windows take of `id`'s pending data, and its end
    /// once all of it went; `false` while some waits (the stream is then
    /// polled again once windows or `out` free up).
    fn send_pending(&mut self, id: u32) -> bool {
        let Some(stream) = self.streams.get_mut(&id) else {
            return false;
        };
        if self.out.len() >= OUT_HIGH {
            self.out_blocked.push(id);
            return false;
        }
        if !stream.pending.is_empty() {
            let window = stream.send_window.min(self.send_window).max(0) as usize;
            // No more than `out` has room for, whatever window the client
            // gives: what is copied to `out` no longer holds the answer's
            // room in the response budget, and a client that reads slowly
            // would hold it there.
            let room = window.min(OUT_HIGH - self.out.len());
            let now = stream.pending.split_to(room.min(stream.pending.len()));
            let last = stream.body_done && stream.pending.is_empty() && stream.trailers.is_none();
            if !now.is_empty() {
                let flags = if last { END_STREAM } else { 0 };
                put_frames(
                    &mut self.out,
                    id,
                    (DATA, DATA),
                    &[&now],
                    self.max_send_frame,
                    flags,
                );
                stream.send_window -= now.len() as i64;
                self.send_window -= now.len() as i64;
                if last {
                    stream.body_done = false;
                    return true;
                }
            }
            if !stream.pending.is_empty() {
                if room < window {
                    self.out_blocked.push(id);
                } else {
                    self.window_blocked.push(id);
                }
                return false;
            }
        }
        if stream.body_done {
            stream.body_done = false;
            match stream.trailers.take() {
                Some(trailers) => self.block(id, None, &trailers, true),
                None => frame_header(&mut self.out, 0, DATA, END_STREAM, id),
            }
        }
        true
    }

    /// `id`'s answer was sent whole: the stream closes once its request
    /// ended too; until then the client is told to stop sending it.
    fn ended(&mut self, id: u32) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        if stream.remote_ended {
            self.streams.remove(&id);
        } else {
            self.reset(id, Reason::NO_ERROR);
        }
    }

    /// An answer's HEADERS (`end`: the answer is only these).
    fn headers(&mut self, id: u32, status: &http::StatusCode, headers: &HeaderMap, end: bool) {
        self.block(id, Some(status), headers, end);
    }

    /// A header block of `id`'s answer: its HEADERS (with `status`) or its
    /// trailers (without), ending the stream when `end`.
    fn block(&mut self, id: u32, status: Option<&http::StatusCode>, fields: &HeaderMap, end: bool) {
        let mut block = std::mem::take(&mut self.scratch);
        block.clear();
        if std::mem::take(&mut self.table_update) {
            block.push(0x20); // a dynamic table size update, to 0
        }
        match status.map(http::StatusCode::as_u16) {
            None => {}
            Some(200) => block.push(0x80 | 8), // :status 200 (static 8)
            Some(_) => {
                let status = status.map_or("", |s| s.as_str());
                literal(&mut block, 8, b"", status.as_bytes());
            }
        }
        encode_fields(&mut block, fields);
        let flags = if end {
            END_HEADERS | END_STREAM
        } else {
            END_HEADERS
        };
        put_frames(
            &mut self.out,
            id,
            (HEADERS, CONTINUATION),
            &[&block],
            self.max_send_frame,
            flags,
        );
        self.scratch = block;
    }
}

/// What polling a stream's call came to.
enum Step {
    Headers(http::response::Parts, bool),
    Send,
    Failed(tonic::Status),
}

/// `headers` as literals never indexed, the static table's name where it
/// has one.
fn encode_fields(block: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        let index = match name.as_str() {
            "content-type" => 31,
            "content-length" => 28,
            "date" => 33,
            "server" => 54,
            _ => 0,
        };
        literal(block, index, name.as_str().as_bytes(), value.as_bytes());
    }
}

/// The stream a PRIORITY (or HEADERS' priority) says it depends on.
fn depends_on(priority: &[u8]) -> u32 {
    u32::from_be_bytes([priority[0], priority[1], priority[2], priority[3]]) & LAST_ID
}

/// Where a frame's content is in `payload` ([`content`]); a padded frame
/// too short for its pad length is a FRAME_SIZE_ERROR.
fn unpadded(flags: u8, payload: &[u8], skip: usize) -> Result<(usize, usize), Http2Error> {
    if flags & PADDED != 0 && payload.is_empty() {
        return protocol(
            Reason::FRAME_SIZE_ERROR,
            "a padded frame without its length",
        );
    }
    match content(flags, payload, skip) {
        Some(range) => Ok(range),
        None => protocol(Reason::PROTOCOL_ERROR, "padding longer than its frame"),
    }
}

/// A request header list HTTP/2 calls malformed (RFC 9113, 8.1.1), and
/// how.
struct Malformed(&'static str);

/// A request's head, from its decoded fields.
struct Head {
    parts: http::request::Parts,
    content_length: Option<u64>,
    /// An `:authority` that does not parse, read as `localhost`.
    lenient: Option<Bytes>,
}

/// A request's head from its decoded fields.
fn request_parts(fields: &Fields) -> Result<Head, Malformed> {
    let bytes = Bytes::copy_from_slice(&fields.bytes);
    let (mut method, mut scheme, mut authority, mut path) = (None, None, None, None);
    let mut headers = HeaderMap::with_capacity(fields.ends.len());
    let mut content_length = None;
    let mut start = 0;
    let mut regular = false;
    for &(name_end, value_end) in &fields.ends {
        let name = &bytes[start..name_end];
        let value = bytes.slice(name_end..value_end);
        start = value_end;
        if let Some(pseudo) = name.strip_prefix(b":") {
            if regular {
                return Err(Malformed("a pseudo-header after a regular field"));
            }
            let slot = match pseudo {
                b"method" => &mut method,
                b"scheme" => &mut scheme,
                b"authority" => &mut authority,
                b"path" => &mut path,
                _ => return Err(Malformed("an unknown pseudo-header")),
            };
            if slot.replace(value).is_some() {
                return Err(Malformed("a pseudo-header repeated"));
            }
            continue;
        }
        regular = true;
        if name.iter().any(u8::is_ascii_uppercase) {
            return Err(Malformed("an uppercase field name"));
        }
        let name = HeaderName::from_bytes(name).map_err(|_| Malformed("a field name not valid"))?;
        match name.as_str() {
            "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" => {
                return Err(Malformed("a connection-specific field"))
            }
            "te" if value != "trailers" => return Err(Malformed("a te other than trailers")),
            "content-length" => {
                let parsed = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(Malformed("a content-length not a number"))?;
                if content_length
                    .replace(parsed)
                    .is_some_and(|was| was != parsed)
                {
                    return Err(Malformed("content-lengths that differ"));
                }
            }
            _ => {}
        }
        let value = HeaderValue::from_maybe_shared(value)
            .map_err(|_| Malformed("a field value not valid"))?;
        headers.append(name, value);
    }
    let method = method.ok_or(Malformed("missing :method"))?;
    let scheme = scheme.ok_or(Malformed("missing :scheme"))?;
    let path = path.ok_or(Malformed("missing :path"))?;
    if path.is_empty() {
        return Err(Malformed("an empty :path"));
    }
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(
        http::uri::Scheme::try_from(&scheme[..]).map_err(|_| Malformed("a :scheme not valid"))?,
    );
    let mut lenient = None;
    uri.authority = Some(match authority {
        Some(authority) => match http::uri::Authority::from_maybe_shared(authority.clone()) {
            Ok(parsed) => parsed,
            Err(_) => {
                lenient = Some(authority);
                http::uri::Authority::from_static("localhost")
            }
        },
        None => http::uri::Authority::from_static("localhost"),
    });
    uri.path_and_query = Some(
        http::uri::PathAndQuery::from_maybe_shared(path)
            .map_err(|_| Malformed("a :path not valid"))?,
    );
    let uri = http::Uri::from_parts(uri).map_err(|_| Malformed("a URI not valid"))?;
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method =
        http::Method::from_bytes(&method).map_err(|_| Malformed("a :method not valid"))?;
    parts.uri = uri;
    parts.version = http::Version::HTTP_2;
    parts.headers = headers;
    Ok(Head {
        parts,
        content_length,
        lenient,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;
    use crate::grpc::frame::MAX_BLOCK;

    /// An answer's body: one message, then `grpc-status: 0`.
    struct Answered {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    }

    impl http_body::Body for Answered {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
            if let Some(data) = self.data.take() {
                return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
            }
            Poll::Ready(
                self.trailers
                    .take()
                    .map(|t| Ok(http_body::Frame::trailers(t))),
            )
        }

        fn is_end_stream(&self) -> bool {
            self.data.is_none() && self.trailers.is_none()
        }
    }

    type Answer = Pin<Box<dyn Future<Output = Response<Answered>> + Send>>;

    /// The seam's fake: by path, `/echo` answers the request's body whole,
    /// `/authority` its authority, `/big/N` N bytes, `/drop` drops the body
    /// unread, `/wait` waits for `release`, `/never` never answers.
    #[derive(Clone, Default)]
    struct Fake {
        release: Arc<tokio::sync::Notify>,
    }

    fn answered(data: Bytes) -> Response<Answered> {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let mut response = Response::new(Answered {
            data: Some(data),
            trailers: Some(trailers),
        });
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        response
    }

    impl Answering for Fake {
        type Answer = Answer;
        type Body = Answered;

        fn answer(&self, request: Request<RequestBody>) -> Answer {
            let release = Arc::clone(&self.release);
            Box::pin(async move {
                let path = request.uri().path().to_owned();
                let authority = request.uri().authority().map(|a| a.to_string());
                let mut body = request.into_body();
                match path.as_str() {
                    "/echo" => {
                        let mut whole = BytesMut::new();
                        while let Some(frame) =
                            std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                        {
                            if let Ok(data) = frame.map(|f| f.into_data()) {
                                whole.extend_from_slice(&data.unwrap_or_default());
                            }
                        }
                        answered(whole.freeze())
                    }
                    "/authority" => answered(Bytes::from(authority.unwrap_or_default())),
                    "/drop" => {
                        drop(body);
                        answered(Bytes::from_static(b"dropped"))
                    }
                    "/wait" => {
                        release.notified().await;
                        answered(Bytes::from_static(b"released"))
                    }
                    "/never" => std::future::pending().await,
                    big => {
                        let n = big.strip_prefix("/big/").and_then(|n| n.parse().ok());
                        answered(Bytes::from(vec![b'x'; n.unwrap_or(0)]))
                    }
                }
            })
        }
    }

    /// A server on one end of a pipe, stopped when `stop` is notified.
    fn server(
        fake: Fake,
        buffer: usize,
    ) -> (
        DuplexStream,
        Arc<tokio::sync::Notify>,
        tokio::task::JoinHandle<Result<(), Http2Error>>,
    ) {
        let (client, server) = tokio::io::duplex(buffer);
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            serve(server, fake, async move { stopped.notified().await }).await
        });
        (client, stop, task)
    }

    async fn h2_client(io: DuplexStream, window: u32) -> h2::client::SendRequest<Bytes> {
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(window)
            .handshake(io)
            .await
            .expect("a handshake with xfn's server");
        tokio::spawn(connection);
        client
    }

    /// A call of `path` with `body`: the answer's status, body and
    /// `grpc-status`.
    async fn call(
        client: &mut h2::client::SendRequest<Bytes>,
        path: &str,
        body: Bytes,
    ) -> (u16, Bytes, Option<String>) {
        let request = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a request");
        let mut client = client.clone().ready().await.expect("ready");
        let (response, mut send) = client.send_request(request, false).expect("sent");
        send.reserve_capacity(body.len());
        send.send_data(body, true).expect("its body sent");
        let response = response.await.expect("an answer");
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut whole = BytesMut::new();
        while let Some(data) = body.data().await {
            let data = data.expect("its data");
            body.flow_control()
                .release_capacity(data.len())
                .expect("released");
            whole.extend_from_slice(&data);
        }
        let trailers = body.trailers().await.expect("its trailers");
        let grpc_status = trailers
            .and_then(|t| t.get("grpc-status").cloned())
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        (status, whole.freeze(), grpc_status)
    }

    #[tokio::test]
    async fn a_call_is_answered_with_its_headers_data_and_trailers() {
        let (io, _stop, _task) = server(Fake::default(), 64 << 10);
        let mut client = h2_client(io, 65_535).await;
        let asked = Bytes::from_static(b"\0\0\0\0\x05hello");
        let (status, body, grpc_status) = call(&mut client, "/echo", asked.clone()).await;
        assert_eq!(
            (status, body, grpc_status.as_deref()),
            (200, asked, Some("0"))
        );
    }

    #[tokio::test]
    async fn calls_larger_than_every_window_go_both_ways_whole() {
        let (io, _stop, _task) = server(Fake::default(), 64 << 10);
        // The client's window (1000 bytes) holds back the answer; the
        // request is three times xfn's windows.
        let mut client = h2_client(io, 1000).await;
        let (_, body, _) = call(&mut client, "/big/300000", Bytes::new()).await;
        assert_eq!(body.len(), 300_000);
        let asked = Bytes::from(vec![7u8; 3 * WINDOW as usize]);
        let (_, body, _) = call(&mut client, "/echo", asked.clone()).await;
        assert_eq!(body, asked);
    }

    #[tokio::test]
    async fn request_bodies_dropped_unread_give_the_connections_window_back() {
        let (io, _stop, _task) = server(Fake::default(), 64 << 10);
        let mut client = h2_client(io, 65_535).await;
        // Four times the connection's window, never read by a call.
        for _ in 0..8 {
            let asked = Bytes::from(vec![1u8; WINDOW as usize / 2]);
            let (_, body, status) = call(&mut client, "/drop", asked).await;
            assert_eq!((&body[..], status.as_deref()), (&b"dropped"[..], Some("0")));
        }
    }

    #[tokio::test]
    async fn calls_in_flight_do_not_hold_back_other_calls() {
        let fake = Fake::default();
        let (io, _stop, _task) = server(fake.clone(), 64 << 10);
        let mut client = h2_client(io, 65_535).await;
        let mut waiting = client.clone();
        let first = tokio::spawn(async move { call(&mut waiting, "/wait", Bytes::new()).await });
        let (_, body, _) = call(&mut client, "/echo", Bytes::from_static(b"later")).await;
        assert_eq!(&body[..], b"later");
        fake.release.notify_one();
        let (_, body, _) = first.await.expect("the first call");
        assert_eq!(&body[..], b"released");
    }

    #[tokio::test]
    async fn asked_to_stop_it_finishes_the_calls_it_took_then_closes() {
        let fake = Fake::default();
        let (io, stop, task) = server(fake.clone(), 64 << 10);
        let client = h2_client(io, 65_535).await;
        let mut waiting = client.clone();
        let first = tokio::spawn(async move { call(&mut waiting, "/wait", Bytes::new()).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A call after GOAWAY is not taken.
        let request = http::Request::post("http://localhost/echo")
            .body(())
            .expect("request");
        let refused = match client.ready().await {
            Ok(mut ready) => match ready.send_request(request, true) {
                Ok((response, _)) => response.await.is_err(),
                Err(_) => true,
            },
            Err(_) => true,
        };
        assert!(refused, "a call made after GOAWAY was served");
        fake.release.notify_one();
        let (_, body, _) = first.await.expect("the call taken");
        assert_eq!(&body[..], b"released");
        let served = tokio::time::timeout(Duration::from_secs(5), task).await;
        assert!(matches!(served, Ok(Ok(Ok(())))), "{served:?}");
    }

    /// Raw HTTP/2: what a hostile client writes.
    fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out.to_vec()
    }

    fn request_block(path: &str, authority: &[u8], extra: usize) -> Vec<u8> {
        let mut block = vec![0x80 | 3, 0x80 | 6]; // POST, http
        literal(&mut block, 4, b"", path.as_bytes());
        literal(&mut block, 1, b"", authority);
        if extra > 0 {
            literal(&mut block, 0, b"x-padding", &vec![b'p'; extra]);
        }
        block
    }

    fn opened() -> Vec<u8> {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(raw(SETTINGS, 0, 0, &[]));
        bytes
    }

    /// What the server sent until it closed or `until` said enough: each
    /// frame's kind, flags, stream and payload.
    async fn frames_read(
        io: &mut DuplexStream,
        until: impl Fn(&[(u8, u8, u32, Vec<u8>)]) -> bool,
    ) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut buf = Vec::new();
        let mut frames = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                while buf.len() >= FRAME_HEADER {
                    let length = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                    if buf.len() < FRAME_HEADER + length {
                        break;
                    }
                    let id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]);
                    let payload = buf[FRAME_HEADER..FRAME_HEADER + length].to_vec();
                    frames.push((buf[3], buf[4], id, payload));
                    buf.drain(..FRAME_HEADER + length);
                }
                if until(&frames) {
                    return;
                }
                let mut chunk = [0u8; 16 << 10];
                match io.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the server neither answered nor closed");
        frames
    }

    fn goaway_of(frames: &[(u8, u8, u32, Vec<u8>)]) -> Option<Reason> {
        frames
            .iter()
            .find(|f| f.0 == GOAWAY)
            .map(|f| Reason(u32::from_be_bytes([f.3[4], f.3[5], f.3[6], f.3[7]])))
    }

    fn has_goaway(frames: &[(u8, u8, u32, Vec<u8>)]) -> bool {
        goaway_of(frames).is_some()
    }

    #[tokio::test]
    async fn a_percent_encoded_authority_is_served_as_localhost() {
        let (mut io, _stop, _task) = server(Fake::default(), 64 << 10);
        let mut bytes = opened();
        let block = request_block("/authority", b"crossplane%2Ffn%2Fdefault.sock", 0);
        bytes.extend(raw(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        io.write_all(&bytes).await.expect("written");
        let frames = frames_read(&mut io, |f| f.iter().any(|f| f.0 == DATA)).await;
        let data = frames.iter().find(|f| f.0 == DATA).expect("an answer");
        assert_eq!(&data.3[..], b"localhost");
    }

    #[tokio::test]
    async fn a_header_list_over_the_bound_is_answered_431_and_the_next_call_served() {
        let (mut io, _stop, _task) = server(Fake::default(), 64 << 10);
        let mut bytes = opened();
        let block = request_block("/echo", b"localhost", MAX_HEADER_LIST);
        // A block over one frame: HEADERS, then CONTINUATIONs.
        put_frames_vec(&mut bytes, 1, &block);
        bytes.extend(raw(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &request_block("/big/3", b"localhost", 0),
        ));
        io.write_all(&bytes).await.expect("written");
        let frames = frames_read(&mut io, |f| f.iter().any(|f| f.0 == DATA && f.2 == 3)).await;
        let mut decoder = loona_hpack::Decoder::new();
        let first = frames
            .iter()
            .find(|f| f.0 == HEADERS && f.2 == 1)
            .expect("431");
        let fields = decoder.decode(&first.3).expect("xfn's HPACK");
        assert_eq!(fields[0], (b":status".to_vec(), b"431".to_vec()));
        assert_ne!(first.1 & END_STREAM, 0);
    }

    fn put_frames_vec(bytes: &mut Vec<u8>, id: u32, block: &[u8]) {
        let mut out = BytesMut::new();
        put_frames(
            &mut out,
            id,
            (HEADERS, CONTINUATION),
            &[block],
            MAX_FRAME,
            END_HEADERS | END_STREAM,
        );
        bytes.extend_from_slice(&out);
    }

    #[tokio::test]
    async fn frames_and_blocks_past_their_bounds_end_the_connection() {
        let block = request_block("/echo", b"localhost", 0);
        let mut too_long_block = raw(HEADERS, 0, 1, &block);
        for _ in 0..=MAX_BLOCK / MAX_FRAME {
            too_long_block.extend(raw(CONTINUATION, 0, 1, &vec![0x80 | 2; MAX_FRAME]));
        }
        for (attack, frames, expected) in [
            (
                "a frame over 16 KiB",
                raw(DATA, 0, 1, &vec![0; MAX_FRAME + 1]),
                Reason::FRAME_SIZE_ERROR,
            ),
            (
                "a header block over 64 KiB",
                too_long_block,
                Reason::ENHANCE_YOUR_CALM,
            ),
            (
                "a first frame not SETTINGS",
                raw(PING, 0, 0, &[0; 8]),
                Reason::PROTOCOL_ERROR,
            ),
        ] {
            let (mut io, _stop, task) = server(Fake::default(), 1 << 20);
            let mut bytes = match attack {
                "a first frame not SETTINGS" => PREFACE.to_vec(),
                _ => opened(),
            };
            bytes.extend(frames);
            let _ = io.write_all(&bytes).await;
            let frames = frames_read(&mut io, has_goaway).await;
            assert_eq!(goaway_of(&frames), Some(expected), "{attack}");
            let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
            assert!(matches!(ended, Ok(Ok(Err(_)))), "{attack}: {ended:?}");
        }
    }

    #[tokio::test]
    async fn data_past_the_connections_window_ends_the_connection() {
        let (mut io, _stop, _task) = server(Fake::default(), 4 << 20);
        let mut bytes = opened();
        // `/never` never reads its body: nothing is given back.
        bytes.extend(raw(
            HEADERS,
            END_HEADERS,
            1,
            &request_block("/never", b"localhost", 0),
        ));
        for _ in 0..=WINDOW as usize / MAX_FRAME {
            bytes.extend(raw(DATA, 0, 1, &vec![0; MAX_FRAME]));
        }
        let _ = io.write_all(&bytes).await;
        let frames = frames_read(&mut io, has_goaway).await;
        assert_eq!(goaway_of(&frames), Some(Reason::FLOW_CONTROL_ERROR));
    }

    #[tokio::test]
    async fn streams_past_the_announced_maximum_are_refused() {
        let (mut io, _stop, _task) = server(Fake::default(), 1 << 20);
        let mut bytes = opened();
        let block = request_block("/never", b"localhost", 0);
        for n in 0..=MAX_STREAMS as u32 {
            bytes.extend(raw(HEADERS, END_HEADERS | END_STREAM, 2 * n + 1, &block));
        }
        let last = 2 * MAX_STREAMS as u32 + 1;
        let writer = tokio::spawn(async move {
            io.write_all(&bytes).await.expect("written");
            io
        });
        let mut io = writer.await.expect("the writer");
        let frames = frames_read(&mut io, |f| f.iter().any(|f| f.0 == RST_STREAM)).await;
        let resets: Vec<_> = frames.iter().filter(|f| f.0 == RST_STREAM).collect();
        assert_eq!(resets.len(), 1);
        assert_eq!(resets[0].2, last);
        assert_eq!(resets[0].3, Reason::REFUSED_STREAM.0.to_be_bytes());
    }

    #[tokio::test]
    async fn a_client_making_xfn_reset_streams_for_its_errors_is_cut_off() {
        let (mut io, _stop, _task) = server(Fake::default(), 1 << 20);
        let mut bytes = opened();
        // No :path: each a malformed request, reset.
        let block = [0x80 | 3, 0x80 | 6];
        for n in 0..=MAX_ERROR_RESETS as u32 {
            bytes.extend(raw(HEADERS, END_HEADERS | END_STREAM, 2 * n + 1, &block));
        }
        let writer = tokio::spawn(async move {
            let _ = io.write_all(&bytes).await;
            io
        });
        let mut io = writer.await.expect("the writer");
        let frames = frames_read(&mut io, has_goaway).await;
        let resets = frames.iter().filter(|f| f.0 == RST_STREAM).count();
        assert_eq!(resets, MAX_ERROR_RESETS);
        assert_eq!(goaway_of(&frames), Some(Reason::ENHANCE_YOUR_CALM));
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_is_no_longer_read_from() {
        // 64 KiB of pipe each way: a server that kept reading would queue
        // the acknowledgements of every PING.
        let (mut io, _stop, _task) = server(Fake::default(), 64 << 10);
        let mut bytes = opened();
        let ping = raw(PING, 0, 0, &[1; 8]);
        for _ in 0..(16 << 20) / ping.len() {
            bytes.extend_from_slice(&ping);
        }
        let flood = tokio::time::timeout(Duration::from_secs(3), io.write_all(&bytes)).await;
        assert!(
            flood.is_err(),
            "xfn read 16 MiB of PINGs whose answers were never read"
        );
    }
}
