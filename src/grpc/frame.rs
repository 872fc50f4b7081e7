//! HTTP/2's frames (RFC 9113) as both of xfn's endpoints write and bound
//! them: its server (`super::http2`) and its client of function servers
//! (`function_server::http2`). One place for the wire's numbers and the
//! few writers they share; each endpoint keeps its own state machine.
//!
//! Invariant: every bound here is what xfn announces (or the protocol's
//! default it never raises), so a peer past one is past what it was told.
use bytes::{BufMut, BytesMut};

/// The client connection preface.
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's header.
pub(crate) const FRAME_HEADER: usize = 9;
/// The largest frame xfn takes (`SETTINGS_MAX_FRAME_SIZE`'s default, never
/// raised) and the largest it sends before its peer says more.
pub(crate) const MAX_FRAME: usize = 16_384;
/// The largest header list xfn takes, counted as HPACK counts it (name,
/// value and 32 bytes per field, RFC 7541 4.1): announced as
/// `SETTINGS_MAX_HEADER_LIST_SIZE`; decoding keeps no field past it.
pub(crate) const MAX_HEADER_LIST: usize = 16 << 10;
/// Most header-block bytes (HEADERS and its CONTINUATIONs) gathered: 4
/// times the list (a table reference decodes to more), h2's own limit.
pub(crate) const MAX_BLOCK: usize = 4 * MAX_HEADER_LIST;
/// The dynamic table a peer's encoder may use (the default, announced by
/// default): one HPACK byte can name an entry of up to this size.
pub(crate) const TABLE_SIZE: usize = 4096;
/// The largest flow-control window.
pub(crate) const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The highest stream id (and the mask of a frame header's).
pub(crate) const LAST_ID: u32 = (1 << 31) - 1;

// Frame types (RFC 9113, 6).
pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PRIORITY: u8 = 0x2;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;
// Flags.
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
/// The HEADERS flag (not the frame type).
pub(crate) const PRIORITY_FLAG: u8 = 0x20;

/// A header block being gathered: a HEADERS frame without END_HEADERS,
/// then its CONTINUATIONs, never past [`MAX_BLOCK`] bytes.
pub(crate) struct Partial {
    pub(crate) stream: u32,
    pub(crate) end_stream: bool,
    pub(crate) block: BytesMut,
}

impl Partial {
    /// Adds a CONTINUATION of `stream` to the block `gathering`: the block
    /// once whole (END_HEADERS in `flags`), or the connection's error
    /// (each endpoint makes it its own).
    pub(crate) fn gather(
        gathering: &mut Option<Partial>,
        stream: u32,
        flags: u8,
        payload: &[u8],
    ) -> Result<Option<Partial>, (Reason, &'static str)> {
        let Some(partial) = gathering.as_mut() else {
            return Err((
                Reason::PROTOCOL_ERROR,
                "CONTINUATION outside a header block",
            ));
        };
        if partial.stream != stream {
            return Err((Reason::PROTOCOL_ERROR, "CONTINUATION of another stream"));
        }
        if partial.block.len() + payload.len() > MAX_BLOCK {
            return Err((
                Reason::ENHANCE_YOUR_CALM,
                "a header block larger than xfn gathers",
            ));
        }
        partial.block.extend_from_slice(payload);
        Ok(match flags & END_HEADERS != 0 {
            true => gathering.take(),
            false => None,
        })
    }
}

/// An HTTP/2 error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reason(pub(crate) u32);

impl Reason {
    pub(crate) const NO_ERROR: Reason = Reason(0);
    pub(crate) const PROTOCOL_ERROR: Reason = Reason(1);
    pub(crate) const INTERNAL_ERROR: Reason = Reason(2);
    pub(crate) const FLOW_CONTROL_ERROR: Reason = Reason(3);
    pub(crate) const STREAM_CLOSED: Reason = Reason(5);
    pub(crate) const FRAME_SIZE_ERROR: Reason = Reason(6);
    pub(crate) const REFUSED_STREAM: Reason = Reason(7);
    pub(crate) const CANCEL: Reason = Reason(8);
    pub(crate) const COMPRESSION_ERROR: Reason = Reason(9);
    pub(crate) const ENHANCE_YOUR_CALM: Reason = Reason(11);
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        match NAMES.get(self.0 as usize) {
            Some(name) => f.write_str(name),
            None => write!(f, "error code {:#x}", self.0),
        }
    }
}

pub(crate) fn frame_header(out: &mut BytesMut, length: usize, kind: u8, flags: u8, stream: u32) {
    let [_, a, b, c] = (length as u32).to_be_bytes();
    out.extend_from_slice(&[a, b, c, kind, flags]);
    out.put_u32(stream);
}

pub(crate) fn window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    if increment > 0 {
        frame_header(out, 4, WINDOW_UPDATE, 0, stream);
        out.put_u32(increment);
    }
}

/// Frames of `stream` carrying `parts` one after the other, each at most
/// `max_frame` (one empty frame when there is nothing): the first of kind
/// `kinds.0`, the rest of `kinds.1` (a header block's CONTINUATIONs), the
/// last one flagged `last` (END_HEADERS, or END_STREAM when it ends).
pub(crate) fn put_frames(
    out: &mut BytesMut,
    stream: u32,
    kinds: (u8, u8),
    parts: &[&[u8]],
    max_frame: usize,
    last: u8,
) {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let (mut part, mut offset, mut left, mut kind) = (0, 0, total, kinds.0);
    loop {
        let length = left.min(max_frame);
        left -= length;
        let flags = if left == 0 { last } else { 0 };
        frame_header(out, length, kind, flags, stream);
        kind = kinds.1;
        let mut need = length;
        while need > 0 {
            let take = (parts[part].len() - offset).min(need);
            out.extend_from_slice(&parts[part][offset..offset + take]);
            (offset, need) = (offset + take, need - take);
            if offset == parts[part].len() {
                (part, offset) = (part + 1, 0);
            }
        }
        if left == 0 {
            return;
        }
    }
}

/// Where a frame's content is in `payload` (`start..end`), past its
/// padding (PADDED) and `skip` bytes of priority; `None` when the padding
/// does not fit the frame. Both endpoints read DATA and HEADERS by it.
pub(crate) fn content(flags: u8, payload: &[u8], skip: usize) -> Option<(usize, usize)> {
    let (start, pad) = match flags & PADDED != 0 {
        true => (1, usize::from(*payload.first()?)),
        false => (0, 0),
    };
    let start = start + skip;
    (start + pad <= payload.len()).then_some((start, payload.len() - pad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_longer_than_a_frame_goes_as_headers_then_continuations() {
        let mut out = BytesMut::new();
        let block = [7u8; 5];
        put_frames(
            &mut out,
            3,
            (HEADERS, CONTINUATION),
            &[&block[..3], &block[3..]],
            2,
            END_HEADERS,
        );
        // Three frames of 2, 2 and 1 bytes; only the last ends the block.
        let kinds: Vec<(u8, u8, usize)> = [0, 11, 22]
            .iter()
            .map(|&at| (out[at + 3], out[at + 4], usize::from(out[at + 2])))
            .collect();
        assert_eq!(
            kinds,
            [
                (HEADERS, 0, 2),
                (CONTINUATION, 0, 2),
                (CONTINUATION, END_HEADERS, 1)
            ]
        );
        assert_eq!(out.len(), 3 * FRAME_HEADER + 5);
    }

    #[test]
    fn nothing_to_send_still_makes_one_empty_frame_with_its_flags() {
        let mut out = BytesMut::new();
        put_frames(&mut out, 1, (DATA, DATA), &[], MAX_FRAME, END_STREAM);
        assert_eq!(&out[..], &[0, 0, 0, DATA, END_STREAM, 0, 0, 0, 1]);
    }

    fn gathering(stream: u32, block: &[u8]) -> Option<Partial> {
        Some(Partial {
            stream,
            end_stream: true,
            block: BytesMut::from(block),
        })
    }

    #[test]
    fn a_header_block_is_whole_at_the_continuation_that_ends_it() {
        let mut block = gathering(3, b"ab");
        assert!(matches!(Partial::gather(&mut block, 3, 0, b"cd"), Ok(None)));
        let whole = Partial::gather(&mut block, 3, END_HEADERS, b"e").unwrap();
        let whole = whole.expect("END_HEADERS did not end the block");
        assert_eq!((whole.stream, whole.end_stream), (3, true));
        assert_eq!(&whole.block[..], b"abcde");
        assert!(block.is_none(), "a whole block is still being gathered");
    }

    #[test]
    fn a_continuation_out_of_place_or_past_the_bound_ends_the_connection() {
        let reason = |gathering: &mut Option<Partial>, stream, payload: &[u8]| match Partial::gather(
            gathering,
            stream,
            END_HEADERS,
            payload,
        ) {
            Err((reason, _)) => reason,
            Ok(_) => panic!("gathered"),
        };
        assert_eq!(reason(&mut None, 1, b"a"), Reason::PROTOCOL_ERROR);
        assert_eq!(
            reason(&mut gathering(1, b""), 3, b"a"),
            Reason::PROTOCOL_ERROR
        );
        let full = vec![0u8; MAX_BLOCK];
        assert_eq!(
            reason(&mut gathering(1, &full), 1, b"a"),
            Reason::ENHANCE_YOUR_CALM
        );
        // Up to the bound is gathered.
        let mut block = gathering(1, &full[1..]);
        assert!(matches!(
            Partial::gather(&mut block, 1, END_HEADERS, b"a"),
            Ok(Some(_))
        ));
    }
}
