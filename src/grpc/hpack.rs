//! HPACK (RFC 7541) as xfn's two HTTP/2 endpoints need it: a decoder with
//! the peer's dynamic table, and literal fields for what xfn sends (never
//! indexed, so xfn keeps no table of its own).
//!
//! Why not `loona-hpack`'s decoder: it builds a Huffman decoder (a map of
//! maps of all 257 codes) for every Huffman-coded string, some 30
//! allocations each; h2 clients send `grpc-timeout` so on every call
//! (benches/PROFILE.md, "xfn's own HTTP/2 server"). Here the canonical
//! code is arranged once, and a block decodes into buffers reused for
//! every block: no allocation but a dynamic table entry's.
//!
//! Bounded: the dynamic table by the size xfn announces (`allowed`; a
//! size update past it is an error), integers by 2^28, strings by their
//! block; what a block decodes to is the caller's to bound (its callback
//! sees every field).
use std::collections::VecDeque;
use std::sync::OnceLock;

/// A header block HPACK cannot decode: a connection error
/// (COMPRESSION_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HpackError {
    #[error("the block ends inside a field")]
    Truncated,
    #[error("an integer larger than 2^28")]
    Integer,
    #[error("index {0} names no field")]
    Index(usize),
    #[error("a Huffman-coded string that is not valid")]
    Huffman,
    #[error("a table size update past the size announced, or after a field")]
    SizeUpdate,
}

/// The static table (RFC 7541, Appendix A), from index 1.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// An entry of the dynamic table: its name and value in one allocation.
struct Entry {
    field: Box<[u8]>,
    name: usize,
}

impl Entry {
    fn size(&self) -> usize {
        self.field.len() + 32
    }
}

/// A decoder, with the dynamic table the peer's encoder fills.
pub(crate) struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// What xfn announced (`SETTINGS_HEADER_TABLE_SIZE`).
    allowed: usize,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Decoder {
    /// A decoder whose peer may use a table of up to `allowed` bytes.
    pub(crate) fn new(allowed: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max: allowed,
            allowed,
            name: Vec::with_capacity(64),
            value: Vec::with_capacity(256),
        }
    }

    /// Decodes `block`, each field handed to `field` (name, value) in
    /// order. An error leaves the table unusable: the connection ends.
    pub(crate) fn decode(
        &mut self,
        mut block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut fields = 0usize;
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = integer(&mut block, 7)?;
                let (name, value) = indexed(&self.table, index)?;
                field(name, value);
            } else if first & 0xe0 == 0x20 {
                if fields > 0 {
                    return Err(HpackError::SizeUpdate);
                }
                let max = integer(&mut block, 5)?;
                if max > self.allowed {
                    return Err(HpackError::SizeUpdate);
                }
                self.max = max;
                self.evict(0);
                continue;
            } else {
                let indexing = first & 0xc0 == 0x40;
                let index = integer(&mut block, if indexing { 6 } else { 4 })?;
                self.name.clear();
                if index == 0 {
                    string(&mut block, &mut self.name)?;
                } else {
                    let (name, _) = indexed(&self.table, index)?;
                    self.name.extend_from_slice(name);
                }
                self.value.clear();
                string(&mut block, &mut self.value)?;
                field(&self.name, &self.value);
                if indexing {
                    self.insert();
                }
            }
            fields += 1;
        }
        Ok(())
    }

    /// Makes room for `size` more bytes: oldest entries go first.
    fn evict(&mut self, size: usize) {
        while self.size + size > self.max {
            match self.table.pop_back() {
                Some(entry) => self.size -= entry.size(),
                None => break,
            }
        }
    }

    /// Adds the field just decoded (in `name` and `value`) to the table; one
    /// larger than the table empties it (RFC 7541, 4.4).
    fn insert(&mut self) {
        let size = self.name.len() + self.value.len() + 32;
        self.evict(size);
        if self.size + size > self.max {
            return;
        }
        let mut field = Vec::with_capacity(self.name.len() + self.value.len());
        field.extend_from_slice(&self.name);
        field.extend_from_slice(&self.value);
        self.table.push_front(Entry {
            field: field.into_boxed_slice(),
            name: self.name.len(),
        });
        self.size += size;
    }
}

/// The field `index` names: the static table's, then `table`'s.
fn indexed(table: &VecDeque<Entry>, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
    match index {
        0 => Err(HpackError::Index(0)),
        1..=61 => {
            let (name, value) = STATIC[index - 1];
            Ok((name.as_bytes(), value.as_bytes()))
        }
        _ => table
            .get(index - 62)
            .map(|e| e.field.split_at(e.name))
            .ok_or(HpackError::Index(index)),
    }
}

/// An integer with an `n`-bit prefix (RFC 7541, 5.1), taken off `block`.
fn integer(block: &mut &[u8], n: u32) -> Result<usize, HpackError> {
    let (&first, mut rest) = block.split_first().ok_or(HpackError::Truncated)?;
    let mask = (1usize << n) - 1;
    let mut value = usize::from(first) & mask;
    if value == mask {
        let mut shift = 0;
        loop {
            let (&byte, after) = rest.split_first().ok_or(HpackError::Truncated)?;
            rest = after;
            if shift > 28 {
                // Zero bytes that go on: still too long.
                return Err(HpackError::Integer);
            }
            value += usize::from(byte & 0x7f) << shift;
            shift += 7;
            if value > 1 << 28 {
                return Err(HpackError::Integer);
            }
            if byte & 0x80 == 0 {
                break;
            }
        }
    }
    *block = rest;
    Ok(value)
}

/// A string literal (RFC 7541, 5.2), taken off `block` and appended to `to`.
fn string(block: &mut &[u8], to: &mut Vec<u8>) -> Result<(), HpackError> {
    let huffman = block.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let length = integer(block, 7)?;
    if length > block.len() {
        return Err(HpackError::Truncated);
    }
    let (bytes, rest) = block.split_at(length);
    *block = rest;
    match huffman {
        true => huffman_decode(bytes, to),
        false => {
            to.extend_from_slice(bytes);
            Ok(())
        }
    }
}

/// HPACK's canonical Huffman code, arranged for decoding by length.
struct Code {
    /// By length: the first code, how many codes, and where their
    /// symbols start in `symbols`.
    first: [u32; 31],
    count: [u32; 31],
    start: [usize; 31],
    /// Symbols ordered by (length, code).
    symbols: [u16; 257],
}

fn code() -> &'static Code {
    static CODE: OnceLock<Code> = OnceLock::new();
    CODE.get_or_init(|| {
        let table = &httlib_huffman::encoder::table::ENCODE_TABLE;
        let mut order: Vec<u16> = (0..257).collect();
        order.sort_by_key(|&s| {
            let (length, code) = table[usize::from(s)];
            (length, code)
        });
        let mut arranged = Code {
            first: [0; 31],
            count: [0; 31],
            start: [0; 31],
            symbols: [0; 257],
        };
        for (at, &symbol) in order.iter().enumerate() {
            let (length, code) = table[usize::from(symbol)];
            let length = usize::from(length);
            if arranged.count[length] == 0 {
                arranged.first[length] = code;
                arranged.start[length] = at;
            }
            arranged.count[length] += 1;
            arranged.symbols[at] = symbol;
        }
        arranged
    })
}

/// Decodes a Huffman-coded string (RFC 7541, 5.2 and Appendix B):
/// padding of at most 7 bits, all ones; EOS never decoded.
fn huffman_decode(bytes: &[u8], to: &mut Vec<u8>) -> Result<(), HpackError> {
    let code = code();
    let (mut bits, mut length) = (0u32, 0usize);
    for &byte in bytes {
        for shift in (0..8).rev() {
            bits = bits << 1 | u32::from(byte >> shift & 1);
            length += 1;
            let at = bits.wrapping_sub(code.first[length]);
            if at < code.count[length] {
                let symbol = code.symbols[code.start[length] + at as usize];
                if symbol == 256 {
                    return Err(HpackError::Huffman);
                }
                to.push(symbol as u8);
                (bits, length) = (0, 0);
            } else if length == 30 {
                return Err(HpackError::Huffman);
            }
        }
    }
    if length > 7 || bits != (1 << length) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(())
}

/// An integer with an `n`-bit prefix, `first`'s other bits set.
pub(crate) fn encode_integer(block: &mut Vec<u8>, first: u8, n: u32, value: usize) {
    let mask = (1usize << n) - 1;
    if value < mask {
        block.push(first | value as u8);
        return;
    }
    block.push(first | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        block.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    block.push(rest as u8);
}

/// A field as a literal without indexing (no table state), its name the
/// static table's `index` or (0) `name`.
pub(crate) fn literal(block: &mut Vec<u8>, index: usize, name: &[u8], value: &[u8]) {
    encode_integer(block, 0x00, 4, index);
    if index == 0 {
        encode_integer(block, 0x00, 7, name.len());
        block.extend_from_slice(name);
    }
    encode_integer(block, 0x00, 7, value.len());
    block.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn decoded(decoder: &mut Decoder, block: &[u8]) -> Result<Fields, HpackError> {
        let mut fields = Vec::new();
        decoder.decode(block, |n, v| fields.push((n.to_vec(), v.to_vec())))?;
        Ok(fields)
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn the_huffman_code_is_canonical_so_each_length_decodes_by_arithmetic() {
        let code = code();
        let mut next = 0u32;
        for length in 1..31 {
            next <<= 1;
            if code.count[length] > 0 {
                assert_eq!(code.first[length], next, "length {length}");
                next += code.count[length];
            }
        }
        assert_eq!(code.count.iter().sum::<u32>(), 257);
    }

    #[test]
    fn rfc_7541_c_4_requests_with_huffman_decode_with_their_table() {
        let mut decoder = Decoder::new(4096);
        let first = decoded(
            &mut decoder,
            &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        )
        .unwrap();
        let as_text: Vec<(String, String)> = first
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into(),
                    String::from_utf8_lossy(v).into(),
                )
            })
            .collect();
        assert_eq!(
            as_text,
            [
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ]
            .map(|(n, v)| (n.to_string(), v.to_string()))
        );
        // C.4.2: the authority now from the dynamic table (index 62).
        let second = decoded(&mut decoder, &hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(
            second[3],
            (b":authority".to_vec(), b"www.example.com".to_vec())
        );
        assert_eq!(second[4], (b"cache-control".to_vec(), b"no-cache".to_vec()));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for (block, error) in [
            (hex("80"), HpackError::Index(0)),
            (hex("be"), HpackError::Index(62)),
            (hex("3fe2 1f"), HpackError::SizeUpdate),
            (hex("82 20"), HpackError::SizeUpdate),
            (hex("0f"), HpackError::Truncated),
            (hex("00 85 ff"), HpackError::Truncated),
            (hex("ff ff ff ff ff 7f"), HpackError::Integer),
            (
                hex("ff 80 80 80 80 80 80 80 80 80 80 80 00"),
                HpackError::Integer,
            ),
            // A name of one byte, Huffman: 8 ones is padding too long;
            // 30 ones is EOS.
            (hex("00 81 ff 00"), HpackError::Huffman),
            (hex("00 84 ff ff ff ff 00"), HpackError::Huffman),
        ] {
            let mut decoder = Decoder::new(4096);
            assert_eq!(decoded(&mut decoder, &block), Err(error), "{block:02x?}");
        }
    }

    #[test]
    fn the_table_keeps_to_the_size_the_peer_set() {
        let mut decoder = Decoder::new(4096);
        // Size update to 64, then a field of 32 + 4 + 28 bytes (fits
        // exactly), then another: the first is evicted.
        let mut block = vec![0x3f, 0x21];
        for value in [b"a".repeat(28), b"b".repeat(28)] {
            block.push(0x40);
            encode_integer(&mut block, 0, 7, 4);
            block.extend_from_slice(b"name");
            encode_integer(&mut block, 0, 7, value.len());
            block.extend_from_slice(&value);
        }
        decoded(&mut decoder, &block).unwrap();
        assert_eq!((decoder.size, decoder.table.len()), (64, 1));
        assert_eq!(
            decoded(&mut decoder, &[0xbe]).unwrap()[0].1,
            b"b".repeat(28)
        );
    }

    proptest! {
        /// Whatever the encoder (indexing, the table, Huffman), the fields
        /// decode as `loona-hpack` decodes them, and as they were.
        #[test]
        fn blocks_decode_as_the_oracle_decodes_them(
            lists in proptest::collection::vec(
                proptest::collection::vec(("[a-z-]{1,12}", "[ -~]{0,40}", any::<bool>()), 0..8),
                1..6,
            ),
        ) {
            let mut encoder = loona_hpack::Encoder::new();
            let mut ours = Decoder::new(4096);
            let mut oracle = loona_hpack::Decoder::new();
            for list in &lists {
                let mut block = Vec::new();
                for (name, value, huffman) in list {
                    if *huffman {
                        // A literal without indexing (the oracle's encoder
                        // keeps the table), both strings Huffman-coded.
                        block.push(0x00);
                        for s in [name.as_bytes(), value.as_bytes()] {
                            let mut coded = Vec::new();
                            httlib_huffman::encode(s, &mut coded).unwrap();
                            encode_integer(&mut block, 0x80, 7, coded.len());
                            block.extend_from_slice(&coded);
                        }
                    } else {
                        let fields = [(name.as_bytes(), value.as_bytes())];
                        encoder.encode_into(fields.iter().copied(), &mut block).unwrap();
                    }
                }
                let expected: Fields = list
                    .iter()
                    .map(|(n, v, _)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect();
                let by_oracle = oracle.decode(&block).unwrap();
                prop_assert_eq!(&by_oracle, &expected);
                prop_assert_eq!(decoded(&mut ours, &block).unwrap(), expected);
            }
        }
    }
}
