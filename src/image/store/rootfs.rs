//! Flattened rootfs: every layer of an image applied in one directory,
//! built once from the kept blobs; the source of copy-mode rootfs.
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use super::codec::decompressor;
use super::{io_err, ContentStore, ImageError, PulledImage};
use crate::image::error::join_err;
use crate::image::extract::{extract_layer_bounded, WhiteoutMode};

impl ContentStore {
    /// The flattened rootfs of a pulled image, built once and cached.
    pub async fn flattened_rootfs(&self, image: &PulledImage) -> Result<PathBuf, ImageError> {
        let dest = self.rootfs_dir(&image.digest)?;
        if dest.is_dir() {
            return Ok(dest);
        }
        let _guard = self.lock(&format!("rootfs {}", image.digest)).await?;
        if dest.is_dir() {
            return Ok(dest);
        }
        let mut blobs = Vec::with_capacity(image.layers.len());
        for layer in &image.layers {
            // A layer dir is named by its blob's hex.
            let hex = layer
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            let digest = format!("sha256:{hex}");
            let blob = self.blob_path(&digest)?;
            blobs.push((digest, blob));
        }
        let work = self.tmp_dir("rootfs")?;
        let store = self.clone();
        let dest2 = dest.clone();
        let budget = self.budget();
        let (budget2, options) = (budget.0.clone(), self.extract_options());
        tokio::task::spawn_blocking(move || -> Result<(), ImageError> {
            for (digest, blob) in &blobs {
                let file = File::open(blob).map_err(io_err(blob))?;
                // The media type was checked at pull time; sniff here.
                let reader = decompressor(BufReader::with_capacity(1 << 20, file), "")
                    .map_err(io_err(blob))?;
                extract_layer_bounded(
                    reader,
                    work.path(),
                    WhiteoutMode::Flatten,
                    options,
                    &budget2,
                )
                .map_err(|source| ImageError::Extract {
                    digest: digest.clone(),
                    source,
                })?;
            }
            store.publish_dir(work, &dest2)
        })
        .await
        .map_err(join_err)??;
        Ok(dest)
    }
}
