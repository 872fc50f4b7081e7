//! What a caller speaking hostile HTTP/2 cannot do to the real `xfn start`:
//! a header block that HPACK expands (every field a one-byte reference to
//! a 4 KiB dynamic-table entry) is refused with a stream or connection
//! error within a bounded peak memory, whether its `:authority` parses or
//! is gRPC C-core's percent-encoded one (read as `localhost` by
//! `src/grpc/http2.rs`), and other calls are served meanwhile and after.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use xfn_testkit::*;
use xfn_testkit::{peak_memory, NONROOT};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
/// The frame size every HTTP/2 peer accepts.
const MAX_FRAME: usize = 16_384;
/// The most header-block bytes `xfn start` gathers before failing the
/// connection (`MAX_BLOCK`, src/grpc/frame.rs).
const MAX_BLOCK: usize = 64 << 10;
/// What the daemon's peak resident memory may grow by under every attack
/// of a test at once (each decoded whole would cost at least 256 MiB).
const BUDGET: u64 = 96 << 20;
const PATH: &str =
    "/apiextensions.fn.proto.v1alpha1.ContainerizedFunctionRunnerService/RunFunction";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix whose upper bits are `first`.
fn integer(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
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

/// A literal field (`prefix`: 0x40 indexed into the dynamic table, 0x00
/// not), its name by static-table index when `index` is non-zero.
fn literal(out: &mut Vec<u8>, prefix: u8, index: usize, name: &[u8], value: &[u8]) {
    if index == 0 {
        out.push(prefix);
        integer(out, 0, 7, name.len());
        out.extend_from_slice(name);
    } else {
        integer(out, prefix, if prefix == 0x40 { 6 } else { 4 }, index);
    }
    integer(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// A request's header block: `:authority` as given, the fields gRPC
/// requires, then (unless `refs` is 0) a 4,000-byte field added to the
/// dynamic table and `refs` one-byte references to it.
fn header_block(authority: &[u8], refs: usize) -> Vec<u8> {
    let mut out = vec![0x83, 0x86]; // :method POST, :scheme http
    literal(&mut out, 0x00, 4, b"", PATH.as_bytes());
    literal(&mut out, 0x00, 1, b"", authority);
    literal(&mut out, 0x00, 0, b"te", b"trailers");
    literal(&mut out, 0x00, 0, b"content-type", b"application/grpc");
    if refs > 0 {
        literal(&mut out, 0x40, 0, b"x-bomb", &[b'b'; 4000]);
        // Index 62: the newest dynamic-table entry.
        out.resize(out.len() + refs, 0x80 | 62);
    }
    out
}

/// `block` as a HEADERS frame and CONTINUATIONs, as a client may send it.
fn header_frames(stream: u32, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
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

/// How the daemon answered a stream.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Response headers for the stream: its `:status` and `grpc-status`.
    Headers(String, Option<String>),
    /// RST_STREAM with this error code.
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
    /// The connection ended without either.
    Closed,
}

/// Sends the preface and `frames` (a write the daemon cut short is part of
/// the answer), then reads frames until the daemon answers `stream`.
async fn send_and_read(daemon: &Daemon, frames: Vec<u8>, stream: u32) -> Answer {
    let conn = daemon.connect_raw(Some(NONROOT)).await.expect("connect");
    let (mut read, mut write) = conn.into_split();
    let writer = tokio::spawn(async move {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        bytes.extend(frames);
        // The daemon may close the connection before it read everything.
        let _ = write.write_all(&bytes).await;
        write
    });
    let mut buf = Vec::new();
    let mut hpack = loona_hpack::Decoder::new();
    let answer = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            while buf.len() >= 9 {
                let len =
                    usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, id) = (buf[3], u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]));
                let payload = &buf[9..9 + len];
                let code = |at: usize| {
                    payload
                        .get(at..at + 4)
                        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                };
                if kind == HEADERS {
                    let fields = hpack.decode(payload).expect("the daemon's HPACK");
                    if id == stream {
                        let field = |name: &[u8]| {
                            fields
                                .iter()
                                .find(|(n, _)| n == name)
                                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                        };
                        return Answer::Headers(
                            field(b":status").unwrap_or_default(),
                            field(b"grpc-status"),
                        );
                    }
                }
                match kind {
                    DATA if id == stream => panic!("the bomb's request was served"),
                    RST_STREAM if id == stream => return Answer::Reset(code(0)),
                    GOAWAY => return Answer::GoAway(code(4)),
                    _ => {}
                }
                buf.drain(..9 + len);
            }
            let mut chunk = [0; 4096];
            match read.read(&mut chunk).await {
                Ok(0) | Err(_) => return Answer::Closed,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .expect("the daemon answers a hostile header block");
    writer.abort();
    answer
}

/// A call the daemon answers without pulling: FailedPrecondition.
async fn call_answered(daemon: &Daemon) {
    let mut req = request("registry.invalid/absent:v1", FUNCTION_IO);
    req.image_pull_config = Some(xfn_testkit::pb::ImagePullConfig {
        pull_policy: xfn_testkit::pb::ImagePullPolicy::Never as i32,
        auth: None,
    });
    let status = daemon.client().await.run_function(req).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
}

/// Sends every attack of `attacks` (frames, and the stream the bomb is on)
/// on a connection of its own, all at once, and checks each was refused,
/// the daemon's peak grew by less than [`BUDGET`], and calls are served
/// after.
async fn refused_within_budget(daemon: &Daemon, attacks: Vec<(&str, Vec<u8>, u32)>) {
    call_answered(daemon).await;
    let before = peak_memory(daemon.xfn_pid());
    let mut sent = Vec::new();
    for (name, frames, stream) in attacks {
        sent.push((
            name,
            async move { send_and_read(daemon, frames, stream).await },
        ));
    }
    let answers = futures::future::join_all(
        sent.into_iter()
            .map(|(name, f)| async move { (name, f.await) }),
    )
    .await;
    let after = peak_memory(daemon.xfn_pid());
    eprintln!(
        "peak resident memory of xfn: {} MiB before, {} MiB after the attacks",
        before >> 20,
        after >> 20
    );
    for (name, answer) in &answers {
        eprintln!("{name}: {answer:?}");
        // Refused: 431 (the answer to a header list over its bound), a
        // stream reset or the connection's end; never a call.
        match answer {
            Answer::Headers(status, None) => assert_eq!(status, "431", "{name}"),
            Answer::Reset(code) | Answer::GoAway(code) => assert_ne!(*code, 0, "{name}"),
            Answer::Closed => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(
        after - before < BUDGET,
        "xfn's peak grew by {} MiB",
        (after - before) >> 20
    );
    call_answered(daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_header_block_that_hpack_expands_is_refused_within_the_memory_budget() {
    let daemon = Daemon::start(&[]).await;
    let mut attacks = Vec::new();
    for (authority, path) in [
        (b"localhost".as_slice(), "an authority that parses"),
        (
            b"crossplane%2Ffn%2Fdefault.sock".as_slice(),
            "a percent-encoded authority",
        ),
    ] {
        // Just over the list bound (five 4 KiB fields: the stream alone is
        // refused), the largest block xfn decodes, and one far larger
        // than any it takes.
        for refs in [5, MAX_BLOCK - 4300, 1 << 20] {
            let block = header_block(authority, refs);
            let name = format!("{}-byte first block, {path}", block.len());
            attacks.push((name, header_frames(1, &block), 1));
        }
        // The bomb in the second block, after a plain first request.
        let mut frames = header_frames(1, &header_block(authority, 0));
        frames.extend(header_frames(3, &header_block(authority, MAX_BLOCK - 4300)));
        attacks.push((format!("second block, {path}"), frames, 3));
    }
    let attacks = attacks
        .iter()
        .map(|(name, frames, stream)| (name.as_str(), frames.clone(), *stream))
        .collect();
    refused_within_budget(&daemon, attacks).await;
}
