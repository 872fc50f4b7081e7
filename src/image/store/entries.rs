//! Refs, manifests and configs: writing them, reading them back, and
//! finding an image that is whole in the store.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::pin::Found;
use super::{io_err, ContentStore, ImageError, ImagePin};
use crate::image::descriptor::{sha256_digest, Manifest};

/// An image that is whole in the store: config read, every layer extracted.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The reference it was asked for by.
    pub reference: String,
    /// The manifest digest (`sha256:…`).
    pub digest: String,
    /// The image config.
    pub config: oci_spec::image::ImageConfiguration,
    /// The extracted layer directories, bottom layer first: overlay lower dirs.
    pub layers: Vec<PathBuf>,
    /// Keeps the image from being collected while this (or a clone) lives.
    pub pin: ImagePin,
}

/// The content of a `refs/` file.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RefEntry {
    pub(super) reference: String,
    pub(super) digest: String,
}

impl ContentStore {
    /// Points the normalised reference `key` at a manifest digest.
    pub(crate) fn write_ref(&self, key: &str, digest: &str) -> Result<(), ImageError> {
        let entry = serde_json::to_vec(&RefEntry {
            reference: key.to_string(),
            digest: digest.to_string(),
        })
        .map_err(|e| ImageError::BadContent {
            image: key.to_string(),
            what: "its reference entry does not encode",
            source: e.into(),
        })?;
        self.publish_bytes(&self.ref_path(key), &entry)
    }

    /// The manifest digest `key` points at, if it has a readable ref.
    fn read_ref(&self, key: &str) -> Option<String> {
        let data = std::fs::read(self.ref_path(key)).ok()?;
        serde_json::from_slice::<RefEntry>(&data)
            .ok()
            .map(|entry| entry.digest)
    }

    /// The cached image `key` names (or, without a ref, the digest it is
    /// pinned to, which may have been pulled under another name), or
    /// `None` when anything is missing.
    pub(crate) fn cached(
        &self,
        key: &str,
        pinned: Option<&str>,
        asked: &str,
    ) -> Result<Option<(PulledImage, Manifest)>, ImageError> {
        let Some(digest) = self.read_ref(key).or_else(|| pinned.map(str::to_string)) else {
            return Ok(None);
        };
        // Pinned before looking: a collection cannot take it from under us.
        let pin = self.pin(&digest, None)?;
        let found = match pin.found().cloned() {
            Some(found) => found,
            None => {
                let Some(found) = self.read_whole(key, &digest)? else {
                    return Ok(None);
                };
                pin.keep(found.clone());
                found
            }
        };
        self.mark_used(key);
        Ok(Some((
            PulledImage {
                reference: asked.to_string(),
                digest,
                config: found.config,
                layers: found.layers,
                pin,
            },
            found.manifest,
        )))
    }

    /// The image `digest` names as the disk has it, each file verified,
    /// or `None` when anything is missing (`key` names it in errors).
    fn read_whole(&self, key: &str, digest: &str) -> Result<Option<Found>, ImageError> {
        let Some(manifest) = self.read_manifest(digest)? else {
            return Ok(None);
        };
        let Some(config_bytes) = self.read_config(&manifest.config.digest)? else {
            return Ok(None);
        };
        let config = parse_config(key, &config_bytes)?;
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for layer in &manifest.layers {
            let dir = self.layer_dir(&layer.digest)?;
            if !dir.is_dir() {
                return Ok(None);
            }
            layers.push(dir);
        }
        Ok(Some(Found {
            manifest,
            config,
            layers,
        }))
    }

    /// Marks the ref `key` used now (its mtime: the collector's last use),
    /// at most once a minute per process: a run costs no write.
    fn mark_used(&self, key: &str) {
        const EVERY: std::time::Duration = std::time::Duration::from_secs(60);
        let path = self.ref_path(key);
        {
            let mut touched = self.touched_memo();
            if touched.get(&path).is_some_and(|at| at.elapsed() < EVERY) {
                return;
            }
            touched.insert(path.clone(), std::time::Instant::now());
        }
        // No ref (a digest found under another name): nothing to mark.
        let _ = filetime::set_file_mtime(&path, filetime::FileTime::now());
    }

    /// The stored manifest `digest` names, parsed for what the store uses;
    /// `None` when absent or torn (see [`ContentStore::read_verified`]).
    pub(crate) fn read_manifest(&self, digest: &str) -> Result<Option<Manifest>, ImageError> {
        let path = self.manifest_path(digest)?;
        let Some(bytes) = self.read_verified(&path, digest)? else {
            return Ok(None);
        };
        match Manifest::parse(&bytes) {
            Ok(manifest) => Ok(Some(manifest)),
            // Verified bytes that do not parse were never a manifest we
            // took (resolving parses first): treat them as torn too.
            Err(e) => {
                self.discard_torn(&path, &format!("does not parse: {e}"));
                Ok(None)
            }
        }
    }

    /// The stored config `digest` names, as bytes; `None` when absent or torn.
    pub(crate) fn read_config(&self, digest: &str) -> Result<Option<Vec<u8>>, ImageError> {
        self.read_verified(&self.config_path(digest)?, digest)
    }

    /// The bytes of a content-addressed file, or `None` when it is absent
    /// or does not hash to its name: a file torn by a power loss under a
    /// cache written before entries were fsynced, or damaged since. A torn
    /// file is removed, so the next pull fetches it again instead of
    /// failing on it forever.
    fn read_verified(&self, path: &Path, digest: &str) -> Result<Option<Vec<u8>>, ImageError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path)(e)),
        };
        let actual = sha256_digest(&bytes);
        if actual != digest {
            self.discard_torn(path, &format!("hashes to {actual}"));
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    fn discard_torn(&self, path: &Path, why: &str) {
        tracing::warn!(path = %path.display(), "a cached entry is torn ({why}); fetching it again");
        let _ = std::fs::remove_file(path);
    }
}

/// An image config, parsed.
pub(crate) fn parse_config(
    image: &str,
    bytes: &[u8],
) -> Result<oci_spec::image::ImageConfiguration, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::BadContent {
        image: image.to_string(),
        what: "the image config does not parse",
        source: e.into(),
    })
}
