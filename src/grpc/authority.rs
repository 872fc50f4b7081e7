//! Accepting any gRPC client's `:authority` on a Unix socket.
//!
//! gRPC C-core clients (grpcio, Ruby, PHP, C++) name a Unix socket's
//! `:authority` after its path, percent-encoded (`crossplane%2Ffn%2F…`).
//! The `http` crate refuses a `%` there, so h2 resets every such stream
//! (`INTERNAL: Stream removed`); h2 has no option to relax it
//! (hyperium/h2#487) and neither hyper nor tonic reach it. grpc-go sends
//! `localhost`, so Crossplane itself is not affected.
//!
//! Choice: xfn reads a Unix connection's first header block before h2.
//! When its `:authority` parses (or is absent), the connection goes to h2
//! untouched, byte for byte. When not, every header block of it is decoded
//! (HPACK, `loona-hpack`, with the client's dynamic table) and re-encoded
//! as literals that never touch h2's table, `:authority` as `localhost`;
//! other frames pass unchanged. Patching h2 would pin a private copy of
//! the crate that carries the HTTP/2 security fixes.
//!
//! Bounded as h2 is: one HPACK byte can name a 4 KiB table entry, so a
//! block decodes to up to 4,000 times its size. A block is gathered up to
//! 64 KiB and its fields kept up to [`MAX_HEADER_LIST`] (what h2 announces);
//! past either it goes to h2 unchanged, which refuses it (431, or the
//! connection); once blocks are re-encoded, a list past the bound is sent
//! on over it (431), a block past 64 KiB fails the connection.
//! The authority is only a name: callers are judged by uid (gatekeeper).
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
/// The frame size h2 allows by default (`SETTINGS_MAX_FRAME_SIZE`); a larger
/// frame is h2's to refuse, so it passes through.
const MAX_FRAME: usize = 16_384;
/// The largest header list xfn takes, counted as HPACK counts it (name,
/// value and 32 bytes per field, RFC 7541 4.1): what h2 announces as
/// `SETTINGS_MAX_HEADER_LIST_SIZE` (`serve` sets it from here) and refuses
/// past, and where decoding here stops keeping fields.
pub(crate) const MAX_HEADER_LIST: usize = 16 << 10;
/// Most header-block bytes gathered for one request before it goes to h2
/// as it came (or, once blocks are re-encoded, the connection fails): h2's
/// own limit for a list it will not even skip over (4 × the list).
const MAX_BLOCK: usize = 4 * MAX_HEADER_LIST;
/// The dynamic table size h2 announces (`SETTINGS_HEADER_TABLE_SIZE`
/// default): the client's encoder may use no more.
const TABLE_SIZE: usize = 4096;
/// The field that makes a re-encoded list over the bound read as over it.
const OVERSIZE_NAME: &[u8] = b"x-xfn-header-list-over-bound";
/// What a bad authority becomes.
const REPLACEMENT: &[u8] = b"localhost";

// HTTP/2 frame types and flags (RFC 9113, 6), also read by xfn's client
// of function servers (`function_server::http2`).
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const CONTINUATION: u8 = 0x9;
pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
/// The HEADERS flag (not the frame type).
pub(crate) const PRIORITY: u8 = 0x20;

/// Where the reader is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before the 24-byte preface.
    Preface,
    /// At a frame boundary.
    Frame,
    /// Inside a frame that passes unchanged: this many bytes left.
    Forward(usize),
    /// Decided: everything from here passes unchanged.
    Passthrough,
}

/// A header block being gathered (HEADERS and its CONTINUATIONs).
#[derive(Debug)]
struct Block {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as received, to pass on unchanged.
    raw: Vec<u8>,
}

/// A Unix connection's socket, with the client's header blocks fixed up
/// before h2 reads them (see the module).
pub(crate) struct LenientAuthority<IO> {
    io: IO,
    stage: Stage,
    /// Raw bytes read and not yet handled.
    pending: Vec<u8>,
    /// Bytes ready for h2, and how many it has taken.
    out: Vec<u8>,
    taken: usize,
    block: Option<Block>,
    /// The client's HPACK state, once its authority needed replacing.
    rewriting: Option<loona_hpack::Decoder<'static>>,
    /// Read buffer.
    chunk: Box<[u8]>,
    eof: bool,
}

impl<IO> std::fmt::Debug for LenientAuthority<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LenientAuthority")
            .field("stage", &self.stage)
            .field("rewriting", &self.rewriting.is_some())
            .finish_non_exhaustive()
    }
}

impl<IO> LenientAuthority<IO> {
    /// Wraps a connection's socket.
    pub(crate) fn new(io: IO) -> Self {
        Self {
            io,
            stage: Stage::Preface,
            pending: Vec::new(),
            out: Vec::new(),
            taken: 0,
            block: None,
            rewriting: None,
            chunk: vec![0; MAX_FRAME + FRAME_HEADER_LEN].into_boxed_slice(),
            eof: false,
        }
    }

    /// Moves `n` pending bytes to the output.
    fn forward(&mut self, n: usize) {
        self.out.extend(self.pending.drain(..n));
    }

    /// Handles as much of `pending` as is complete.
    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.stage {
                Stage::Passthrough => {
                    let n = self.pending.len();
                    self.forward(n);
                    return Ok(());
                }
                Stage::Preface => {
                    if self.pending.len() < PREFACE_LEN {
                        return Ok(());
                    }
                    self.forward(PREFACE_LEN);
                    self.stage = Stage::Frame;
                }
                Stage::Forward(left) => {
                    let n = left.min(self.pending.len());
                    self.forward(n);
                    if n < left {
                        self.stage = Stage::Forward(left - n);
                        return Ok(());
                    }
                    self.stage = Stage::Frame;
                }
                Stage::Frame => {
                    if self.pending.len() < FRAME_HEADER_LEN {
                        return Ok(());
                    }
                    let header = &self.pending[..FRAME_HEADER_LEN];
                    let len = usize::from(header[0]) << 16
                        | usize::from(header[1]) << 8
                        | usize::from(header[2]);
                    let kind = header[3];
                    let is_block =
                        kind == HEADERS || (kind == CONTINUATION && self.block.is_some());
                    if !is_block {
                        if self.block.is_some() {
                            // A header block interrupted: h2's error is the
                            // right one, and only unchanged bytes give it.
                            self.give_up("a header block interrupted by another frame")?;
                            continue;
                        }
                        self.forward(FRAME_HEADER_LEN);
                        self.stage = Stage::Forward(len);
                        continue;
                    }
                    if len > MAX_FRAME {
                        // A header frame h2 refuses (FRAME_SIZE_ERROR).
                        self.give_up("a header frame over 16 KiB")?;
                        continue;
                    }
                    if self.pending.len() < FRAME_HEADER_LEN + len {
                        return Ok(());
                    }
                    let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER_LEN + len).collect();
                    if let Some(done) = self.gather(&frame)? {
                        self.finish(done)?;
                    }
                }
            }
        }
    }

    /// Adds a HEADERS or CONTINUATION frame to the block; the block once
    /// it ends.
    fn gather(&mut self, frame: &[u8]) -> io::Result<Option<Block>> {
        let flags = frame[4];
        let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let mut payload = &frame[FRAME_HEADER_LEN..];
        let block = match self.block.take() {
            Some(block) => block,
            None => {
                let mut priority = None;
                if flags & PADDED != 0 {
                    let Some((&pad, rest)) = payload.split_first() else {
                        return Err(malformed("a padded HEADERS frame without its pad length"));
                    };
                    let Some(rest) = rest.len().checked_sub(usize::from(pad)).map(|n| &rest[..n])
                    else {
                        return Err(malformed("HEADERS padding longer than the frame"));
                    };
                    payload = rest;
                }
                if flags & PRIORITY != 0 {
                    let Some((fields, rest)) = payload.split_first_chunk::<5>() else {
                        return Err(malformed("a HEADERS frame shorter than its priority"));
                    };
                    priority = Some(*fields);
                    payload = rest;
                }
                Block {
                    stream_id,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment: Vec::new(),
                    raw: Vec::new(),
                }
            }
        };
        let mut block = block;
        block.fragment.extend_from_slice(payload);
        block.raw.extend_from_slice(frame);
        let done = flags & END_HEADERS != 0;
        self.block = Some(block);
        if self.block.as_ref().is_some_and(|b| b.raw.len() > MAX_BLOCK) {
            // h2 bounds what it reads of it (its CONTINUATION count, its
            // decoded list) and refuses it.
            self.give_up("a header block over 64 KiB")?;
            return Ok(None);
        }
        Ok(if done { self.block.take() } else { None })
    }

    /// Passes a finished block on: unchanged (and everything after it, when
    /// its authority is good), or re-encoded.
    fn finish(&mut self, block: Block) -> io::Result<()> {
        let rewriting = self.rewriting.is_some();
        let mut decoder = self.rewriting.take().unwrap_or_else(|| {
            let mut decoder = loona_hpack::Decoder::new();
            decoder.set_max_allowed_table_size(TABLE_SIZE);
            decoder
        });
        // Decoded under the bound: a one-byte reference to a 4 KiB table
        // entry decodes to 4 KiB, so a block's list may be 4,000 times its
        // size. Past the bound, fields are decoded (the table must follow
        // the client's) but not kept.
        let mut size = 0usize;
        let mut headers = Vec::new();
        let decoded = decoder.decode_with_cb(&block.fragment, |name, value| {
            size = size.saturating_add(name.len() + value.len() + 32);
            if size <= MAX_HEADER_LIST {
                headers.push((name.into_owned(), value.into_owned()));
            }
        });
        let headers = match decoded {
            // Re-encoded, with a field that takes it past h2's bound (and
            // not past 4 times it): h2 refuses the stream alone (431), as
            // it would have the client's block.
            Ok(()) if size > MAX_HEADER_LIST && rewriting => {
                tracing::debug!(
                    size,
                    "a header list over the bound: re-encoded for h2 to refuse"
                );
                headers.push((OVERSIZE_NAME.to_vec(), vec![b'x'; MAX_HEADER_LIST]));
                headers
            }
            Ok(()) if size > MAX_HEADER_LIST => {
                // Unchanged, h2 refuses it (431, or the connection when
                // far over) with its own bounded decoder.
                tracing::debug!(size, "a header list over the bound: passed to h2 to refuse");
                self.out.extend_from_slice(&block.raw);
                self.stage = Stage::Passthrough;
                return Ok(());
            }
            Ok(()) => headers,
            Err(err) if !rewriting => {
                // Unchanged, h2 says what is wrong with it.
                tracing::debug!(
                    ?err,
                    "a header block xfn cannot decode: passed to h2 as it is"
                );
                self.out.extend_from_slice(&block.raw);
                self.stage = Stage::Passthrough;
                return Ok(());
            }
            Err(err) => return Err(malformed(&format!("HPACK: {err:?}"))),
        };
        let bad = headers
            .iter()
            .find(|(name, value)| {
                name == b":authority"
                    && tonic::codegen::http::uri::Authority::try_from(value.as_slice()).is_err()
            })
            .map(|(_, value)| String::from_utf8_lossy(value).into_owned());
        if !rewriting {
            let Some(authority) = &bad else {
                self.out.extend_from_slice(&block.raw);
                self.stage = Stage::Passthrough;
                return Ok(());
            };
            tracing::debug!(
                %authority,
                "the caller names the socket with an :authority h2 refuses: read as localhost"
            );
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        for (name, value) in &headers {
            let value: &[u8] = if name == b":authority" && bad.is_some() {
                REPLACEMENT
            } else {
                value
            };
            encode_literal(&mut encoded, name, value);
        }
        write_block(&mut self.out, &block, &encoded);
        self.rewriting = Some(decoder);
        Ok(())
    }

    /// Passes what is gathered unchanged, and everything after it; fails
    /// when header blocks were already re-encoded (h2's HPACK state no
    /// longer matches the client's).
    fn give_up(&mut self, what: &str) -> io::Result<()> {
        if self.rewriting.is_some() {
            return Err(malformed(&format!(
                "{what}, which h2 would refuse, after re-encoded blocks"
            )));
        }
        if let Some(block) = self.block.take() {
            self.out.extend_from_slice(&block.raw);
        }
        self.stage = Stage::Passthrough;
        Ok(())
    }
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 from the caller: {what}"),
    )
}

/// An HPACK integer with an `n`-bit prefix whose upper bits are `first`.
fn encode_integer(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A "literal header field without indexing — new name" (RFC 7541 6.2.2),
/// neither string Huffman-coded: it leaves the receiver's table alone.
fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    encode_integer(out, 0x00, 7, name.len());
    out.extend_from_slice(name);
    encode_integer(out, 0x00, 7, value.len());
    out.extend_from_slice(value);
}

/// HEADERS (+ CONTINUATION) frames carrying `encoded` for `block`'s stream.
fn write_block(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let mut first = true;
    let mut rest = encoded;
    loop {
        let room = if first && block.priority.is_some() {
            MAX_FRAME - 5
        } else {
            MAX_FRAME
        };
        let (chunk, after) = rest.split_at(rest.len().min(room));
        let mut flags = 0;
        let kind = if first { HEADERS } else { CONTINUATION };
        if first && block.end_stream {
            flags |= END_STREAM;
        }
        if after.is_empty() {
            flags |= END_HEADERS;
        }
        let priority: &[u8] = match (first, &block.priority) {
            (true, Some(fields)) => {
                flags |= PRIORITY;
                fields
            }
            _ => &[],
        };
        let len = priority.len() + chunk.len();
        out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        out.extend_from_slice(&block.stream_id.to_be_bytes());
        out.extend_from_slice(priority);
        out.extend_from_slice(chunk);
        if after.is_empty() {
            return;
        }
        rest = after;
        first = false;
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for LenientAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.taken);
                buf.put_slice(&this.out[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.out.len() {
                    this.out.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof || (this.stage == Stage::Passthrough && this.pending.is_empty()) {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            let mut chunk = ReadBuf::new(&mut this.chunk[..]);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut chunk))?;
            let read = chunk.filled().len();
            if read == 0 {
                // End of input: what was gathered goes as it came, and h2
                // sees the truncation.
                this.eof = true;
                let n = this.pending.len();
                this.forward(n);
                if let Some(block) = this.block.take() {
                    this.out.extend_from_slice(&block.raw);
                }
                continue;
            }
            this.pending.extend_from_slice(&this.chunk[..read]);
            this.process()?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for LenientAuthority<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: AsRawFd> AsRawFd for LenientAuthority<IO> {
    fn as_raw_fd(&self) -> RawFd {
        self.io.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn request(authority: &[u8], encoder: &mut loona_hpack::Encoder<'_>) -> Vec<u8> {
        let path =
            "/apiextensions.fn.proto.v1alpha1.ContainerizedFunctionRunnerService/RunFunction";
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method".as_slice(), b"POST".as_slice()),
            (b":scheme".as_slice(), b"http".as_slice()),
            (b":path".as_slice(), path.as_bytes()),
            (b":authority".as_slice(), authority),
            (b"te".as_slice(), b"trailers".as_slice()),
        ];
        encoder.encode(headers)
    }

    /// What h2 would read from `input`, through the wrapper.
    async fn through(input: Vec<u8>) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(&input).await.unwrap();
        drop(client);
        let mut read = Vec::new();
        LenientAuthority::new(server)
            .read_to_end(&mut read)
            .await
            .unwrap();
        read
    }

    /// The header lists of the header blocks (HEADERS and their
    /// CONTINUATIONs, no padding or priority) in `bytes` (after the preface).
    fn header_lists(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut decoder = loona_hpack::Decoder::new();
        let mut lists = Vec::new();
        let mut block = Vec::new();
        let mut rest = &bytes[PREFACE.len()..];
        while rest.len() >= FRAME_HEADER_LEN {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            if rest[3] == HEADERS || rest[3] == CONTINUATION {
                block.extend_from_slice(&rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len]);
                if rest[4] & END_HEADERS != 0 {
                    lists.push(decoder.decode(&block).unwrap());
                    block.clear();
                }
            }
            rest = &rest[FRAME_HEADER_LEN + len..];
        }
        lists
    }

    #[tokio::test]
    async fn a_connection_whose_authority_parses_passes_byte_for_byte() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &request(b"localhost", &mut encoder),
        ));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\x05hello"));
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &request(b"crossplane%2Ffn", &mut encoder),
        ));
        assert_eq!(through(input.clone()).await, input);
    }

    #[tokio::test]
    async fn a_percent_encoded_authority_reads_as_localhost_on_every_request() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        // Split over a CONTINUATION, as a client may.
        let block = request(b"crossplane%2Ffn%2Fdefault.sock", &mut encoder);
        let (first, second) = block.split_at(block.len() / 2);
        input.extend(frame(HEADERS, 0, 1, first));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, second));
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\x05hello");
        input.extend(&data);
        // The second request may refer to the first's dynamic table entries.
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &request(b"crossplane%2Ffn%2Fdefault.sock", &mut encoder),
        ));
        let output = through(input).await;
        let lists = header_lists(&output);
        assert_eq!(lists.len(), 2);
        for list in &lists {
            let authority = list.iter().find(|(n, _)| n == b":authority").unwrap();
            assert_eq!(authority.1, b"localhost");
            assert!(list.iter().any(|(n, v)| n == b"te" && v == b"trailers"));
            assert_eq!(list[0], (b":method".to_vec(), b"POST".to_vec()));
        }
        // The DATA frame passes unchanged.
        assert!(output.windows(data.len()).any(|w| w == data));
    }

    /// A block that adds a 4,000-byte field to the dynamic table, then
    /// refers to it until the block is `size` bytes: its list decodes to
    /// about 4 KiB per byte.
    fn bomb(authority: &[u8], size: usize, encoder: &mut loona_hpack::Encoder<'_>) -> Vec<u8> {
        let mut block = request(authority, encoder);
        block.push(0x40);
        encode_integer(&mut block, 0, 7, 6);
        block.extend_from_slice(b"x-bomb");
        encode_integer(&mut block, 0, 7, 4000);
        block.extend_from_slice(&[b'b'; 4000]);
        // The newest dynamic-table entry: 62 in the encoder's table.
        block.resize(size, 0x80 | 62);
        block
    }

    fn frames(stream: u32, block: &[u8]) -> Vec<u8> {
        let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i + 1 == chunks.len() {
                END_HEADERS
            } else {
                0
            };
            out.extend(frame(kind, flags, stream, chunk));
        }
        out
    }

    #[tokio::test]
    async fn a_first_block_over_the_header_list_bound_goes_to_h2_as_it_came() {
        for authority in [b"localhost".as_slice(), b"crossplane%2Ffn"] {
            // At the gathering bound, and over it.
            for size in [MAX_BLOCK - 64, 4 * MAX_BLOCK] {
                let mut encoder = loona_hpack::Encoder::new();
                let mut input = PREFACE.to_vec();
                input.extend(frames(1, &bomb(authority, size, &mut encoder)));
                assert_eq!(through(input.clone()).await, input, "{size}");
            }
        }
    }

    #[tokio::test]
    async fn a_list_over_the_bound_after_re_encoded_blocks_reaches_h2_over_it_and_no_larger() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frames(1, &request(b"crossplane%2Ffn", &mut encoder)));
        input.extend(frames(
            3,
            &bomb(b"crossplane%2Ffn", MAX_BLOCK - 64, &mut encoder),
        ));
        let lists = header_lists(&through(input).await);
        assert_eq!(lists.len(), 2);
        let size = |list: &Vec<(Vec<u8>, Vec<u8>)>| {
            list.iter()
                .map(|(n, v)| n.len() + v.len() + 32)
                .sum::<usize>()
        };
        assert!(size(&lists[1]) > MAX_HEADER_LIST, "{}", size(&lists[1]));
        assert!(size(&lists[1]) < 4 * MAX_HEADER_LIST, "{}", size(&lists[1]));
        let authority = lists[1].iter().find(|(n, _)| n == b":authority").unwrap();
        assert_eq!(authority.1, b"localhost");
    }

    #[tokio::test]
    async fn a_block_past_the_gathering_bound_after_re_encoded_ones_fails_the_connection() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frames(1, &request(b"crossplane%2Ffn", &mut encoder)));
        input.extend(frames(
            3,
            &bomb(b"crossplane%2Ffn", 4 * MAX_BLOCK, &mut encoder),
        ));
        let (mut client, server) = tokio::io::duplex(8 << 20);
        client.write_all(&input).await.unwrap();
        drop(client);
        let mut read = Vec::new();
        let err = LenientAuthority::new(server)
            .read_to_end(&mut read)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        // The first block was re-encoded and passed on.
        assert_eq!(header_lists(&read).len(), 1);
    }
}
