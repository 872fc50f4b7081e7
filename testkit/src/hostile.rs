//! Hostile layer blobs, some far too big to build in memory: a layer is a
//! list of [`Part`]s (forged tar blocks, long runs of one byte) compressed
//! as concatenated gzip members or zstd frames, each run compressed once
//! and its member repeated. A 10 GiB gzip bomb costs the test a few MB of
//! memory and a fraction of a second.
use std::io::Write;

use sha2::{Digest, Sha256};

use super::format::Format;
use super::layer::{sha256_digest, Compression, LayerBlob};

/// A piece of an uncompressed layer tar.
#[derive(Debug, Clone)]
pub enum Part {
    /// Bytes as they are.
    Bytes(Vec<u8>),
    /// `len` copies of `byte`.
    Run {
        /// The byte.
        byte: u8,
        /// How many.
        len: u64,
    },
    /// `count` copies of `unit` (e.g. one 512-byte header, a million times).
    Repeat {
        /// What is repeated.
        unit: Vec<u8>,
        /// How many times.
        count: u64,
    },
}

/// Bytes compressed (and hashed) per run chunk.
const CHUNK: u64 = 1 << 20;

/// A GNU header for `name` of `kind` announcing `size` bytes of body
/// (base-256 when octal cannot hold it), checksummed.
pub fn header(kind: tar::EntryType, name: &str, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_size(size);
    let bytes = h.as_mut_bytes();
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A GNU sparse (`S`) header for `name`: `map` is (offset, length) of the
/// data blocks (at most 4 here), `stored` their total, `real` the file's
/// size; `extended` says GNU sparse extension blocks follow.
pub fn sparse_header(name: &str, map: &[(u64, u64)], real: u64, extended: bool) -> Vec<u8> {
    assert!(map.len() <= 4);
    let stored = map.iter().map(|(_, l)| l).sum();
    let mut h = header(tar::EntryType::GNUSparse, name, stored);
    let octal = |field: &mut [u8], n: u64| {
        let s = format!("{n:0width$o}", width = field.len() - 1);
        field[..s.len()].copy_from_slice(s.as_bytes());
        field[s.len()..].fill(0);
    };
    for (i, (off, len)) in map.iter().enumerate() {
        let at = 386 + i * 24;
        octal(&mut h[at..at + 12], *off);
        octal(&mut h[at + 12..at + 24], *len);
    }
    h[482] = u8::from(extended);
    octal(&mut h[483..495], real);
    fix_checksum(&mut h);
    h
}

/// A GNU sparse extension block: up to 21 (offset, length) pairs.
pub fn sparse_extension(map: &[(u64, u64)], more: bool) -> Vec<u8> {
    assert!(map.len() <= 21);
    let mut b = vec![0u8; 512];
    for (i, (off, len)) in map.iter().enumerate() {
        let at = i * 24;
        let s = format!("{off:011o}");
        b[at..at + 11].copy_from_slice(s.as_bytes());
        let s = format!("{len:011o}");
        b[at + 12..at + 23].copy_from_slice(s.as_bytes());
    }
    b[504] = u8::from(more);
    b
}

fn fix_checksum(h: &mut [u8]) {
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
}

/// The parts of a PAX record `"<len> <key>=<value of n bytes of byte>\n"`
/// and its length, for a value too big to hold.
pub fn pax_record(key: &str, byte: u8, n: u64) -> (Vec<Part>, u64) {
    // The length field counts itself: find the fixpoint.
    let mut len = key.len() as u64 + n + 3;
    loop {
        let total = len.to_string().len() as u64 + key.len() as u64 + n + 3;
        if total == len {
            break;
        }
        len = total;
    }
    let parts = vec![
        Part::Bytes(format!("{len} {key}=").into_bytes()),
        Part::Run { byte, len: n },
        Part::Bytes(b"\n".to_vec()),
    ];
    (parts, len)
}

/// Zeros that pad a body of `len` bytes to whole blocks.
pub fn padding(len: u64) -> Part {
    Part::Run {
        byte: 0,
        len: (512 - len % 512) % 512,
    }
}

/// The end-of-archive marker.
pub fn end() -> Part {
    Part::Bytes(vec![0; 1024])
}

/// Total length of `parts`.
pub fn length(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match p {
            Part::Bytes(b) => b.len() as u64,
            Part::Run { len, .. } => *len,
            Part::Repeat { unit, count } => unit.len() as u64 * count,
        })
        .sum()
}

/// The compressed layer of `parts`. Its diff id is computed when
/// `real_diff_id` (streaming every byte through sha256), else a made-up
/// one: a layer refused while streaming never reaches the diff id check.
pub fn blob(parts: &[Part], compression: Compression, real_diff_id: bool) -> LayerBlob {
    let mut data = Vec::new();
    let mut hasher = Sha256::new();
    let mut chunks: std::collections::HashMap<Vec<u8>, (Vec<u8>, Vec<u8>)> = Default::default();
    let compress = |bytes: &[u8]| -> Vec<u8> {
        match compression {
            Compression::Gzip => {
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                enc.write_all(bytes).expect("gzip");
                enc.finish().expect("gzip")
            }
            Compression::Zstd => zstd::encode_all(bytes, 3).expect("zstd"),
            Compression::None => bytes.to_vec(),
        }
    };
    for part in parts {
        let (unit, count) = match part {
            Part::Bytes(b) => {
                if real_diff_id {
                    hasher.update(b);
                }
                data.extend(compress(b));
                continue;
            }
            Part::Run { byte, len } => (vec![*byte], *len),
            Part::Repeat { unit, count } => (unit.clone(), *count),
        };
        let per_chunk = (CHUNK / unit.len() as u64).max(1);
        let (raw, packed) = chunks.entry(unit.clone()).or_insert_with(|| {
            let raw = unit.repeat(per_chunk as usize);
            let packed = compress(&raw);
            (raw, packed)
        });
        for _ in 0..count / per_chunk {
            if real_diff_id {
                hasher.update(&raw[..]);
            }
            data.extend_from_slice(packed);
        }
        let rest = (count % per_chunk) as usize * unit.len();
        if rest > 0 {
            if real_diff_id {
                hasher.update(&raw[..rest]);
            }
            data.extend(compress(&raw[..rest]));
        }
    }
    let diff_id = if real_diff_id {
        format!("sha256:{}", hex::encode(hasher.finalize()))
    } else {
        sha256_digest(b"a diff id nobody checks: the layer is refused first")
    };
    LayerBlob {
        digest: sha256_digest(&data),
        data,
        media_type: Format::Oci.layer_type(compression).to_string(),
        diff_id,
        annotations: Vec::new(),
    }
}
