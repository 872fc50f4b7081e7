//! One layer of a pull: downloaded unless its blob is cached, extracted
//! while it downloads, verified (blob digest, diff id) and published.
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::PullProgress;
use crate::image::descriptor::BlobRef;
use crate::image::error::{io_err, join_err, ImageError};
use crate::image::extract::{Budget, ExtractOptions};
use crate::image::pull::Puller;
use crate::image::reference::ImageReference;
use crate::image::store::{extract_verified, file_digest, ChannelReader, ContentStore};
use crate::image::ImageErrorKind;

/// What one pull's layers downloaded, summed.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Layer blobs downloaded.
    pub(super) layers: AtomicU64,
    /// Their bytes.
    pub(super) bytes: AtomicU64,
}

/// One layer to make whole, and the pull it belongs to.
pub(super) struct LayerJob<'a> {
    pub(super) puller: &'a Puller,
    pub(super) reference: &'a ImageReference,
    pub(super) blob: &'a BlobRef,
    pub(super) diff_id: &'a str,
    pub(super) progress: Option<&'a dyn PullProgress>,
    pub(super) counters: &'a Counters,
    pub(super) budget: &'a Arc<Budget>,
}

/// Where and how one layer blob is extracted, whatever it is read from
/// (the cached blob, or the download as it arrives).
struct Extraction {
    media_type: String,
    digest: String,
    diff_id: String,
    dest: PathBuf,
    options: ExtractOptions,
    budget: Arc<Budget>,
}

impl Extraction {
    /// Extracts the blob `reader` yields into `dest`, verified.
    fn from<R: BufRead + Send + 'static>(self, reader: R) -> Result<(), ImageError> {
        extract_verified(
            reader,
            &self.media_type,
            &self.digest,
            &self.diff_id,
            &self.dest,
            self.options,
            &self.budget,
        )
    }
}

/// Makes one layer's directory exist: download (unless the blob is
/// cached), verify, extract, verify the diff id, publish.
pub(super) async fn ensure_layer(
    store: &ContentStore,
    job: LayerJob<'_>,
) -> Result<PathBuf, ImageError> {
    let blob = job.blob;
    let dest = store.layer_dir(&blob.digest)?;
    let report_cached = || {
        if let Some(p) = job.progress {
            p.advanced(blob.size);
        }
    };
    if dest.is_dir() {
        report_cached();
        return Ok(dest);
    }
    let _guard = store.lock(&format!("layer {}", blob.digest)).await?;
    if dest.is_dir() {
        report_cached();
        return Ok(dest);
    }
    let blob_path = store.blob_path(&blob.digest)?;
    let work = store.tmp_dir("layer")?;
    let work_path = work.path().to_path_buf();
    let extraction = Extraction {
        media_type: blob.media_type.clone(),
        digest: blob.digest.clone(),
        diff_id: job.diff_id.to_string(),
        dest: work_path.clone(),
        options: store.extract_options(),
        budget: job.budget.clone(),
    };
    if blob_path.is_file() && cached_blob_is_whole(&blob_path, &blob.digest).await? {
        report_cached();
        let blob_path = blob_path.clone();
        tokio::task::spawn_blocking(move || {
            let file = File::open(&blob_path).map_err(io_err(&blob_path))?;
            extraction.from(BufReader::with_capacity(1 << 20, file))
        })
        .await
        .map_err(join_err)??;
    } else {
        // Extract while downloading: the extractor reads a copy of the
        // chunks as they arrive, into a temp dir that is only published
        // once the blob's digest and the diff id both match.
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let extractor = tokio::task::spawn_blocking(move || {
            extraction.from(BufReader::with_capacity(1 << 20, ChannelReader::new(rx)))
        });
        let tmp = store.tmp_file("blob")?;
        let on_bytes = |n: u64| {
            if let Some(p) = job.progress {
                p.advanced(n);
            }
        };
        // A layer refused for a bound is not downloaded further.
        let stop = || job.budget.refused();
        let fetched = job
            .puller
            .fetch_blob_to_file(
                job.reference,
                blob,
                tmp.as_ref(),
                &on_bytes,
                &stop,
                Some(tx),
            )
            .await;
        // The sender is gone now: the extractor sees the end of the stream.
        let extracted = extractor.await.map_err(join_err)?;
        if let Err(e @ ImageError::Extract { .. }) = &extracted {
            if e.kind() == ImageErrorKind::TooLarge {
                return extracted.map(|_| dest);
            }
        }
        let n = fetched?;
        extracted?;
        store.publish_file(tmp, &blob_path)?;
        job.counters.layers.fetch_add(1, Ordering::Relaxed);
        job.counters.bytes.fetch_add(n, Ordering::Relaxed);
        store
            .stats()
            .blobs_downloaded
            .fetch_add(1, Ordering::Relaxed);
    }
    store.publish_dir(work, &dest)?;
    store
        .stats()
        .layers_extracted
        .fetch_add(1, Ordering::Relaxed);
    Ok(dest)
}

/// Whether a kept blob still hashes to its digest; one that does not (torn
/// by a power loss before blobs were fsynced, or damaged since) is removed
/// and downloaded again instead of failing the layer forever.
async fn cached_blob_is_whole(path: &Path, digest: &str) -> Result<bool, ImageError> {
    let (path, digest) = (path.to_path_buf(), digest.to_string());
    tokio::task::spawn_blocking(move || {
        let actual = file_digest(&path)?;
        if actual == digest {
            return Ok(true);
        }
        tracing::warn!(path = %path.display(), %actual, "a kept layer blob is torn; downloading it again");
        let _ = std::fs::remove_file(&path);
        Ok(false)
    })
    .await
    .map_err(join_err)?
}
