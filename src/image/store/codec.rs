//! Layer byte streams: decompression by media type or magic bytes, hashing
//! of what passes through, the blocking reader an extractor uses while the
//! download goes on, and extraction checked against the diff id.
use std::io::{BufRead, Read};
use std::path::Path;

use sha2::{Digest as _, Sha256};

use super::super::extract::{
    extract_layer_bounded, Budget, ExtractError, ExtractOptions, WhiteoutMode,
};
use super::ImageError;

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    Plain,
    Gzip,
    Zstd,
}

/// The codec a media type names, if it names one.
fn codec_of_media_type(media_type: &str) -> Option<Codec> {
    if media_type.ends_with("+gzip") || media_type.ends_with(".tar.gzip") {
        Some(Codec::Gzip)
    } else if media_type.ends_with("+zstd") {
        Some(Codec::Zstd)
    } else {
        None
    }
}

/// A reader of the uncompressed tar: by media type, else by magic bytes
/// (gzip `1f 8b`, zstd `28 b5 2f fd`), else plain.
pub(crate) fn decompressor<R: BufRead + Send + 'static>(
    mut reader: R,
    media_type: &str,
) -> std::io::Result<Box<dyn Read + Send>> {
    let codec = match codec_of_media_type(media_type) {
        Some(codec) => codec,
        None => {
            let head = reader.fill_buf()?;
            if head.starts_with(&[0x1f, 0x8b]) {
                Codec::Gzip
            } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                Codec::Zstd
            } else {
                Codec::Plain
            }
        }
    };
    Ok(match codec {
        Codec::Plain => Box::new(reader),
        // MultiGzDecoder: a layer may be several concatenated gzip members.
        Codec::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
        Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(reader)?),
    })
}

/// Hashes what passes through.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Reads the chunks an async task sends, blocking: the extractor's side of
/// a download that is extracted as it arrives. The end of the stream is
/// when the sender is dropped.
pub(crate) struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl ChannelReader {
    pub(crate) fn new(rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Self {
        ChannelReader {
            rx,
            current: bytes::Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Extracts a layer blob's bytes into `dest` (overlay whiteouts) and checks
/// the uncompressed stream against the config's diff id. Every uncompressed
/// byte, the ones after the tar's end included, is charged to `budget`.
pub(crate) fn extract_verified<R: BufRead + Send + 'static>(
    blob: R,
    media_type: &str,
    digest: &str,
    diff_id: &str,
    dest: &Path,
    options: ExtractOptions,
    budget: &Budget,
) -> Result<(), ImageError> {
    let reader = decompressor(blob, media_type).map_err(|e| ImageError::BadContent {
        image: digest.to_string(),
        what: "the layer does not decompress",
        source: e.into(),
    })?;
    let mut hashing = HashingReader {
        inner: reader,
        hasher: Sha256::new(),
    };
    let extract_err = |source| ImageError::Extract {
        digest: digest.to_string(),
        source,
    };
    extract_layer_bounded(&mut hashing, dest, WhiteoutMode::Overlay, options, budget)
        .map_err(extract_err)?;
    // The tar reader stops at the end-of-archive marker; hash the rest,
    // still within the budget (a bomb may hide after the marker).
    std::io::copy(&mut budget.reader(&mut hashing), &mut std::io::sink()).map_err(|e| {
        match super::super::extract::Bound::of(&e) {
            Some(bound) => extract_err(ExtractError::Bound {
                after: "(the end of the archive)".to_string(),
                bound: bound.clone(),
            }),
            None => ImageError::BadContent {
                image: digest.to_string(),
                what: "the layer does not decompress",
                source: e.into(),
            },
        }
    })?;
    let actual = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
    if actual != diff_id {
        return Err(ImageError::Corrupt {
            image: digest.to_string(),
            reason: format!("uncompressed layer is {actual}, config says diff id {diff_id}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn decompress_all(data: Vec<u8>, media_type: &str) -> Vec<u8> {
        let mut out = Vec::new();
        decompressor(std::io::Cursor::new(data), media_type)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn decompresses_by_media_type_or_magic() {
        let plain = b"hello tar".to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::encode_all(plain.as_slice(), 1).unwrap();
        let gzip_type = "application/vnd.oci.image.layer.v1.tar+gzip";
        let docker_tar = "application/vnd.docker.image.rootfs.diff.tar";
        assert_eq!(decompress_all(gz.clone(), gzip_type), plain);
        assert_eq!(decompress_all(gz, docker_tar), plain);
        assert_eq!(
            decompress_all(zst.clone(), "application/octet-stream"),
            plain
        );
        assert_eq!(
            decompress_all(zst, "application/vnd.oci.image.layer.v1.tar+zstd"),
            plain
        );
        assert_eq!(decompress_all(plain.clone(), docker_tar), plain);
    }
}
