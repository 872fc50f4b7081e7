//! Bounds on a layer, checked on the bytes as they stream past, *before*
//! the `tar` crate sees them.
//!
//! # Why a reader in front of `tar`
//!
//! The `tar` crate reads a GNU long name or link (`L`, `K`) and a PAX header
//! (`x`, `g`, which also carries xattrs) whole into memory before its caller
//! can look at it: a 300 MiB PAX path in a 0.3 MB gzip layer cost gigabytes
//! of RSS. [`Guard`] follows tar framing as the bytes pass (each 512-byte
//! header block, the size it announces, padding, GNU sparse extension blocks,
//! a PAX `size` record overriding the next entry's), so it refuses an
//! oversized extension header when its header block arrives, before one
//! byte of its body is read. It also counts entries, and charges every byte
//! (and every byte of a sparse file's holes, which the `tar` crate
//! materialises as zeros) to the image's [`Budget`], so a decompression
//! bomb stops at the cap instead of filling the disk or spinning the CPU.
//!
//! The `tar` crate stays the parser: where the two could disagree (a corrupt
//! header) the crate fails on its own; the guard's bounds hold either way
//! because the budget counts raw bytes, not entries.
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const BLOCK: u64 = 512;

/// How big an image may unpack to, shared by the layers of one pull, and
/// the switch that stops their extraction when the pull is abandoned.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
    cancelled: AtomicBool,
    refused: AtomicBool,
}

impl Budget {
    /// A budget of `limit` bytes of uncompressed layer data.
    pub fn new(limit: u64) -> Self {
        Budget {
            limit,
            used: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            refused: AtomicBool::new(false),
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged so far.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Stops every extraction reading under this budget at its next read.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether a layer under this budget broke a bound (its download can
    /// stop: the layer will not be used).
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Notes that `bound` was broken and returns it as an I/O error.
    fn refuse(&self, bound: Bound) -> io::Error {
        if !matches!(bound, Bound::Cancelled) {
            self.refused.store(true, Ordering::Relaxed);
        }
        bound.into()
    }

    /// Charges `n` bytes; an error once the total passes the limit or the
    /// budget was cancelled.
    pub fn charge(&self, n: u64) -> io::Result<()> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(self.refuse(Bound::Cancelled));
        }
        let used = self.used.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if used > self.limit {
            return Err(self.refuse(Bound::ImageSize { limit: self.limit }));
        }
        Ok(())
    }

    /// `reader`, with every byte read charged here.
    pub fn reader<R: Read>(&self, reader: R) -> Charged<'_, R> {
        Charged {
            inner: reader,
            budget: self,
        }
    }
}

impl Default for Budget {
    /// The default limit ([`DEFAULT_MAX_IMAGE_SIZE`]).
    fn default() -> Self {
        Budget::new(DEFAULT_MAX_IMAGE_SIZE)
    }
}

/// A reader whose bytes are charged to a [`Budget`].
pub struct Charged<'a, R> {
    inner: R,
    budget: &'a Budget,
}

impl<R: Read> Read for Charged<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget.charge(n as u64)?;
        Ok(n)
    }
}

/// Default bound on the bytes one image unpacks to: 4 GiB. Function images
/// are tens to hundreds of MB; the largest general-purpose images people
/// run (CUDA, full language toolchains) stay under this.
pub const DEFAULT_MAX_IMAGE_SIZE: u64 = 4 << 30;
/// Default bound on the entries of one layer: real layers hold at most a few
/// hundred thousand (a big `node_modules`), every entry costs an inode.
pub const DEFAULT_MAX_LAYER_ENTRIES: u64 = 1_000_000;
/// Default bound on one extension header (GNU long name/link, PAX with its
/// xattrs): paths stop at 4 KiB (`PATH_MAX`), an xattr value at 64 KiB;
/// real PAX headers are under a kilobyte.
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 1 << 20;

/// A bound a layer broke, carried inside an `io::Error` from the guard up
/// through the `tar` crate, then turned into an [`super::ExtractError`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum Bound {
    /// The image unpacks to more than the budget.
    #[error("the image unpacks to more than {limit} bytes (the --max-image-size bound)")]
    ImageSize {
        /// The budget.
        limit: u64,
    },
    /// A layer has more entries than allowed.
    #[error("the layer has more than {limit} entries")]
    Entries {
        /// The bound.
        limit: u64,
    },
    /// An extension header is bigger than allowed.
    #[error("a {kind} header of {size} bytes (at most {limit} are accepted)")]
    Header {
        /// `PAX`, `GNU long name`, …
        kind: &'static str,
        /// Its announced size.
        size: u64,
        /// The bound.
        limit: u64,
    },
    /// A sparse file claims more bytes than the whole image may have.
    #[error("a sparse file of {size} bytes (the image may unpack to at most {limit})")]
    Sparse {
        /// Its apparent size.
        size: u64,
        /// The budget.
        limit: u64,
    },
    /// The pull was abandoned.
    #[error("extraction cancelled")]
    Cancelled,
}

impl From<Bound> for io::Error {
    fn from(b: Bound) -> Self {
        io::Error::other(b)
    }
}

impl Bound {
    /// The bound inside `e`, when `e` is one.
    pub fn of(e: &io::Error) -> Option<&Bound> {
        e.get_ref().and_then(|inner| inner.downcast_ref::<Bound>())
    }
}

/// Per-layer bounds (the byte budget is per image: [`Budget`]).
#[derive(Debug, Clone, Copy)]
pub struct LayerBounds {
    /// Most entries in one layer.
    pub max_entries: u64,
    /// Most bytes in one extension header.
    pub max_header_bytes: u64,
}

impl Default for LayerBounds {
    fn default() -> Self {
        LayerBounds {
            max_entries: DEFAULT_MAX_LAYER_ENTRIES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }
}

/// What the next header block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Header,
    /// A GNU sparse extension block; then `data` bytes of the entry.
    SparseExt {
        data: u64,
    },
}

/// Follows tar framing over `inner`, enforcing [`LayerBounds`] and charging
/// a [`Budget`]. See the module docs.
pub struct Guard<'a, R> {
    inner: R,
    budget: &'a Budget,
    bounds: LayerBounds,
    block: [u8; BLOCK as usize],
    /// Bytes of `block` filled from `inner` / handed to the reader.
    filled: usize,
    served: usize,
    /// Body bytes (with padding) left before the next header.
    body_left: u64,
    next: Next,
    /// After the end-of-archive block: bytes pass unparsed (still charged).
    ended: bool,
    entries: u64,
    /// The body of a PAX `x` header being read, for its `size` record.
    pax: Option<Vec<u8>>,
    pax_size: Option<u64>,
    /// Bytes of GNU sparse extension blocks of the current entry.
    sparse_map: u64,
}

impl<'a, R: Read> Guard<'a, R> {
    /// Guards `inner` (an uncompressed layer tar).
    pub fn new(inner: R, budget: &'a Budget, bounds: LayerBounds) -> Self {
        Guard {
            inner,
            budget,
            bounds,
            block: [0; BLOCK as usize],
            filled: 0,
            served: 0,
            body_left: 0,
            next: Next::Header,
            ended: false,
            entries: 0,
            pax: None,
            pax_size: None,
            sparse_map: 0,
        }
    }

    /// Entries seen so far (extension headers not counted).
    pub fn entries(&self) -> u64 {
        self.entries
    }

    fn read_inner(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = loop {
            match self.inner.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        self.budget.charge(n as u64)?;
        Ok(n)
    }

    /// Reads the next header block whole (or what is left before EOF) and
    /// checks it. Returns false at EOF.
    fn next_block(&mut self) -> io::Result<bool> {
        self.filled = 0;
        self.served = 0;
        while self.filled < BLOCK as usize {
            let mut tmp = [0u8; BLOCK as usize];
            let want = BLOCK as usize - self.filled;
            let n = self.read_inner(&mut tmp[..want])?;
            if n == 0 {
                break;
            }
            self.block[self.filled..self.filled + n].copy_from_slice(&tmp[..n]);
            self.filled += n;
        }
        if self.filled < BLOCK as usize {
            // Truncated: hand over what there is; `tar` reports it.
            self.ended = true;
            return Ok(self.filled > 0);
        }
        self.inspect()?;
        Ok(true)
    }

    fn inspect(&mut self) -> io::Result<()> {
        let b = &self.block;
        if let Next::SparseExt { data } = self.next {
            // `tar` keeps the whole sparse map in memory: bounded like an
            // extension header.
            self.sparse_map += BLOCK;
            if self.sparse_map > self.bounds.max_header_bytes {
                return Err(self.budget.refuse(Bound::Header {
                    kind: "GNU sparse map",
                    size: self.sparse_map,
                    limit: self.bounds.max_header_bytes,
                }));
            }
            if b[504] == 0 {
                self.next = Next::Header;
                self.body_left = padded(data)?;
            }
            return Ok(());
        }
        if b.iter().all(|&x| x == 0) {
            // `tar` stops at the first zero block (ignore_zeros is off).
            self.ended = true;
            return Ok(());
        }
        let kind = b[156];
        let mut size = number(&b[124..136]);
        let extension = match kind {
            b'x' => Some("PAX"),
            b'g' => Some("PAX global"),
            b'L' => Some("GNU long name"),
            b'K' => Some("GNU long link"),
            _ => None,
        };
        if let Some(kind_name) = extension {
            let limit = self.bounds.max_header_bytes;
            if size > limit {
                return Err(self.budget.refuse(Bound::Header {
                    kind: kind_name,
                    size,
                    limit,
                }));
            }
            if kind == b'x' {
                self.pax = Some(Vec::with_capacity(size as usize));
            }
        } else {
            self.entries += 1;
            if self.entries > self.bounds.max_entries {
                return Err(self.budget.refuse(Bound::Entries {
                    limit: self.bounds.max_entries,
                }));
            }
            if let Some(pax) = self.pax_size.take() {
                size = pax;
            }
        }
        if kind == b'S' {
            // GNU sparse: `size` bytes are stored, the file is `real` bytes
            // long; the holes are read as zeros, so they are charged too.
            let real = number(&b[483..495]);
            let limit = self.budget.limit();
            if real > limit {
                return Err(self.budget.refuse(Bound::Sparse { size: real, limit }));
            }
            self.budget.charge(real.saturating_sub(size))?;
            if b[482] != 0 {
                self.sparse_map = 0;
                self.next = Next::SparseExt { data: size };
                return Ok(());
            }
        }
        self.body_left = padded(size)?;
        if self.body_left == 0 {
            self.end_of_body();
        }
        Ok(())
    }

    fn end_of_body(&mut self) {
        if let Some(pax) = self.pax.take() {
            if let Some(size) = pax_size(&pax) {
                self.pax_size = Some(size);
            }
        }
    }
}

impl<R: Read> Read for Guard<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.served < self.filled {
                let n = (self.filled - self.served).min(buf.len());
                buf[..n].copy_from_slice(&self.block[self.served..self.served + n]);
                self.served += n;
                return Ok(n);
            }
            if self.ended {
                return self.read_inner(buf);
            }
            if self.body_left > 0 {
                let want = (buf.len() as u64).min(self.body_left) as usize;
                let n = self.read_inner(&mut buf[..want])?;
                self.body_left -= n as u64;
                if let Some(pax) = &mut self.pax {
                    let room = (self.bounds.max_header_bytes as usize).saturating_sub(pax.len());
                    pax.extend_from_slice(&buf[..n.min(room)]);
                }
                if self.body_left == 0 {
                    self.end_of_body();
                }
                return Ok(n);
            }
            if !self.next_block()? {
                return Ok(0);
            }
        }
    }
}

/// `size` rounded up to whole blocks.
fn padded(size: u64) -> io::Result<u64> {
    size.checked_add(BLOCK - 1)
        .map(|s| s & !(BLOCK - 1))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "tar entry size overflows"))
}

/// A numeric header field as `tar` reads it: base-256 when the high bit of
/// the first byte is set, else octal between spaces and NULs. Unparsable
/// reads as 0 (`tar` then fails on it itself).
fn number(field: &[u8]) -> u64 {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut n: u64 = 0;
        for (i, &b) in field.iter().enumerate() {
            let b = if i == 0 { b & 0x7f } else { b };
            n = n.checked_shl(8).map_or(u64::MAX, |v| v | u64::from(b));
            if n > u64::MAX >> 8 && i + 1 < field.len() {
                return u64::MAX;
            }
        }
        return n;
    }
    let trimmed: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    std::str::from_utf8(&trimmed)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 8).ok())
        .unwrap_or(0)
}

/// The `size` record of a PAX header body (`"<len> size=<n>\n"` records).
fn pax_size(mut body: &[u8]) -> Option<u64> {
    let mut found = None;
    while let Some(space) = body.iter().position(|&b| b == b' ') {
        let len: usize = std::str::from_utf8(&body[..space]).ok()?.parse().ok()?;
        if len <= space || len > body.len() {
            return found;
        }
        let record = &body[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(value) = record.strip_prefix(b"size=") {
            found = std::str::from_utf8(value).ok()?.parse().ok();
        }
        body = &body[len..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u8, size: u64) -> [u8; 512] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_size(size);
        h.set_path("x").unwrap();
        h.set_cksum();
        *h.as_bytes()
    }

    fn read_all(data: &[u8], budget: &Budget, bounds: LayerBounds) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        Guard::new(data, budget, bounds).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn numbers_read_as_tar_reads_them() {
        assert_eq!(number(b"0000644\0"), 0o644);
        assert_eq!(number(b"  17 \0\0"), 0o17);
        assert_eq!(number(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]), 256);
        assert_eq!(number(b"zz"), 0);
    }

    #[test]
    fn pax_size_records_are_found() {
        assert_eq!(pax_size(b"12 size=100\n"), Some(100));
        assert_eq!(pax_size(b"13 path=abcd\n12 size=100\n"), Some(100));
        assert_eq!(pax_size(b"99 size=1\n"), None);
    }

    #[test]
    fn bytes_pass_unchanged() {
        let tar = {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_size(3);
            b.append_data(&mut h, "a/".repeat(80) + "f", &b"abc"[..])
                .unwrap();
            b.into_inner().unwrap()
        };
        let out = read_all(&tar, &Budget::new(1 << 20), LayerBounds::default()).unwrap();
        assert_eq!(out, tar);
    }

    #[test]
    fn an_oversized_extension_header_is_refused_at_its_header_block() {
        let mut data = header(b'x', 10 << 20).to_vec();
        data.extend(std::iter::repeat_n(b'a', 4096));
        let err = read_all(&data, &Budget::new(u64::MAX), LayerBounds::default()).unwrap_err();
        assert!(matches!(
            Bound::of(&err),
            Some(Bound::Header { kind: "PAX", .. })
        ));
    }

    #[test]
    fn the_budget_stops_a_stream_and_cancel_stops_it_too() {
        let data = vec![0u8; 8192];
        let budget = Budget::new(4096);
        let err = read_all(&data, &budget, LayerBounds::default()).unwrap_err();
        assert!(matches!(
            Bound::of(&err),
            Some(Bound::ImageSize { limit: 4096 })
        ));
        let budget = Budget::new(u64::MAX);
        budget.cancel();
        let err = read_all(&data, &budget, LayerBounds::default()).unwrap_err();
        assert!(matches!(Bound::of(&err), Some(Bound::Cancelled)));
    }

    #[test]
    fn entries_are_counted() {
        let mut data = Vec::new();
        for _ in 0..3 {
            data.extend_from_slice(&header(b'0', 0));
        }
        let bounds = LayerBounds {
            max_entries: 2,
            ..Default::default()
        };
        let err = read_all(&data, &Budget::new(u64::MAX), bounds).unwrap_err();
        assert!(matches!(Bound::of(&err), Some(Bound::Entries { limit: 2 })));
    }
}
