//! Importing an image from a file instead of a registry: an OCI image layout
//! directory, or a tarball as `docker save` writes it (gzipped or not; a
//! Docker `manifest.json` archive or an OCI layout inside a tar).
//!
//! Every blob is checked against its digest, every layer extracted with the
//! same verified extraction a pull uses (diff ids checked), and the entries
//! are committed the same way (temp, then rename), so an imported image is
//! indistinguishable from a pulled one: `ensure(reference, Never)` finds it.
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::codec::{decompressor, extract_verified};
use super::layout::hex_of;
use super::{io_err, ContentStore, ImageError, MAX_LAYERS};
use crate::image::descriptor::{is_sha256_digest, BlobRef};
use crate::image::error::{join_err, ContentError};
use crate::image::ImageReference;

/// Where an imported image comes from.
#[derive(Debug, Clone)]
pub enum ImportSource {
    /// An OCI image layout directory (`oci-layout`, `index.json`, `blobs/`).
    Layout(PathBuf),
    /// A tar (optionally gzipped): `docker save` output or an OCI layout.
    Tarball(PathBuf),
}

/// One image found in a source: its manifest bytes and where its blobs are.
struct Found {
    manifest: Vec<u8>,
    config: BlobRef,
    layers: Vec<BlobRef>,
    blob_files: Vec<PathBuf>,
    config_file: PathBuf,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct OciManifest {
    config: BlobRef,
    layers: Vec<BlobRef>,
}

/// One entry of a `docker save` `manifest.json`.
#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct ConfigRootfs {
    rootfs: DiffIds,
}

#[derive(Deserialize)]
struct DiffIds {
    diff_ids: Vec<String>,
}

fn corrupt(source: &Path, reason: impl Into<String>) -> ImageError {
    ImageError::Corrupt {
        image: source.display().to_string(),
        reason: reason.into(),
    }
}

/// `source`'s `what` does not parse or unpack.
fn bad_content(source: &Path, what: &'static str, err: impl Into<ContentError>) -> ImageError {
    ImageError::BadContent {
        image: source.display().to_string(),
        what,
        source: err.into(),
    }
}

/// `sha256:<hex>` of a file's bytes, streamed.
pub(crate) fn file_digest(path: &Path) -> Result<String, ImageError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_err(path))?;
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// The host's architecture as OCI names it.
fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl ContentStore {
    /// Imports the image in `source` into the store as
    /// `<repository>:sha256-<manifest hex>` and returns that reference, to
    /// run it by (with `PullPolicy::Never`). Named by content, so processes
    /// sharing a cache never run each other's imports. `default_registry`
    /// completes a repository that names no registry.
    pub async fn import(
        &self,
        source: ImportSource,
        repository: &str,
        default_registry: &str,
    ) -> Result<String, ImageError> {
        let store = self.clone();
        let repository = repository.to_string();
        let default_registry = default_registry.to_string();
        tokio::task::spawn_blocking(move || {
            store.import_blocking(&source, &repository, &default_registry)
        })
        .await
        .map_err(join_err)?
    }

    fn import_blocking(
        &self,
        source: &ImportSource,
        repository: &str,
        default_registry: &str,
    ) -> Result<String, ImageError> {
        match source {
            ImportSource::Layout(dir) => {
                let found = find_in_layout(dir)?;
                self.commit_found(dir, found, repository, default_registry)
            }
            ImportSource::Tarball(file) => {
                // Unpacked into the store's tmp/ (removed on drop): the
                // blobs are then read from plain files, the same way for
                // both archive kinds.
                let unpacked = self.tmp_dir("import")?;
                let reader =
                    BufReader::with_capacity(1 << 20, File::open(file).map_err(io_err(file))?);
                let reader = decompressor(reader, "").map_err(io_err(file))?;
                tar::Archive::new(reader)
                    .unpack(unpacked.path())
                    .map_err(|e| bad_content(file, "the archive does not unpack", e))?;
                let dir = unpacked.path();
                let found = if dir.join("manifest.json").is_file() {
                    find_in_docker_archive(dir)?
                } else if dir.join("index.json").is_file() {
                    find_in_layout(dir)?
                } else {
                    return Err(corrupt(
                        file,
                        "neither a docker save archive (manifest.json) nor an OCI layout (index.json)",
                    ));
                };
                self.commit_found(file, found, repository, default_registry)
            }
        }
    }

    /// Verifies and stores what `find_*` located, then writes the ref.
    fn commit_found(
        &self,
        source: &Path,
        found: Found,
        repository: &str,
        default_registry: &str,
    ) -> Result<String, ImageError> {
        if found.layers.len() > MAX_LAYERS {
            return Err(ImageError::TooManyLayers {
                image: source.display().to_string(),
                count: found.layers.len(),
                max: MAX_LAYERS,
            });
        }
        let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(&found.manifest)));
        // Pinned from the start, so a collection keeps what is imported.
        let _pin = self.pin(&manifest_digest, Some(&found.manifest))?;
        let config_bytes = std::fs::read(&found.config_file).map_err(io_err(&found.config_file))?;
        let config_digest = format!("sha256:{}", hex::encode(Sha256::digest(&config_bytes)));
        if config_digest != found.config.digest {
            return Err(corrupt(
                source,
                format!(
                    "config is {config_digest}, manifest says {}",
                    found.config.digest
                ),
            ));
        }
        let diff_ids = serde_json::from_slice::<ConfigRootfs>(&config_bytes)
            .map_err(|e| bad_content(source, "the image config", e))?
            .rootfs
            .diff_ids;
        if diff_ids.len() != found.layers.len() {
            return Err(corrupt(
                source,
                format!(
                    "{} layers but {} diff ids in the config",
                    found.layers.len(),
                    diff_ids.len()
                ),
            ));
        }
        for ((layer, blob_file), diff_id) in
            found.layers.iter().zip(&found.blob_files).zip(&diff_ids)
        {
            self.import_layer(source, layer, blob_file, diff_id)?;
        }
        self.publish_bytes(&self.config_path(&config_digest)?, &config_bytes)?;
        self.publish_bytes(&self.manifest_path(&manifest_digest)?, &found.manifest)?;
        let reference = format!(
            "{repository}:sha256-{}",
            hex_of(&manifest_digest, &manifest_digest)?
        );
        let key = ImageReference::parse(&reference, default_registry)?.to_string();
        self.write_ref(&key, &manifest_digest)?;
        Ok(reference)
    }

    /// Checks a layer blob's digest, extracts it (diff id checked) and keeps
    /// the blob for flattened rootfs, unless the layer is already there.
    fn import_layer(
        &self,
        source: &Path,
        layer: &BlobRef,
        blob_file: &Path,
        diff_id: &str,
    ) -> Result<(), ImageError> {
        let actual = file_digest(blob_file)?;
        if actual != layer.digest {
            return Err(corrupt(
                source,
                format!("layer blob is {actual}, manifest says {}", layer.digest),
            ));
        }
        let dest = self.layer_dir(&layer.digest)?;
        let blob_dest = self.blob_path(&layer.digest)?;
        if !blob_dest.is_file() {
            let tmp = self.tmp_file("blob")?;
            std::fs::copy(blob_file, &tmp).map_err(io_err(blob_file))?;
            self.publish_file(tmp, &blob_dest)?;
        }
        if dest.is_dir() {
            return Ok(());
        }
        let work = self.tmp_dir("layer")?;
        let reader =
            BufReader::with_capacity(1 << 20, File::open(blob_file).map_err(io_err(blob_file))?);
        extract_verified(
            reader,
            &layer.media_type,
            &layer.digest,
            diff_id,
            work.path(),
            self.extract_options(),
            &self.budget().0,
        )?;
        self.publish_dir(work, &dest)?;
        self.stats()
            .layers_extracted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// The blob file of a digest in an OCI layout, digest checked for shape.
fn layout_blob(dir: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    Ok(dir.join("blobs/sha256").join(hex_of(digest, digest)?))
}

/// Reads a blob of a layout whole, checking its digest.
fn read_layout_blob(dir: &Path, digest: &str) -> Result<Vec<u8>, ImageError> {
    let path = layout_blob(dir, digest)?;
    let mut bytes = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_err(&path))?;
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    if actual != digest {
        return Err(corrupt(dir, format!("blob {digest} hashes to {actual}")));
    }
    Ok(bytes)
}

/// Picks the host platform's manifest among descriptors (or the only one).
fn pick<'a>(dir: &Path, manifests: &'a [Descriptor]) -> Result<&'a Descriptor, ImageError> {
    if let [only] = manifests {
        return Ok(only);
    }
    manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == host_architecture())
        })
        .ok_or_else(|| {
            corrupt(
                dir,
                format!(
                    "{} images and none for linux/{}",
                    manifests.len(),
                    host_architecture()
                ),
            )
        })
}

fn find_in_layout(dir: &Path) -> Result<Found, ImageError> {
    let index_path = dir.join("index.json");
    let index: Index =
        serde_json::from_slice(&std::fs::read(&index_path).map_err(io_err(&index_path))?)
            .map_err(|e| bad_content(dir, "index.json", e))?;
    let mut descriptor = pick(dir, &index.manifests)?;
    // An index may point at a (multi-platform) index: at most one level more.
    let nested: Index;
    if descriptor.media_type.ends_with("image.index.v1+json")
        || descriptor.media_type.ends_with("manifest.list.v2+json")
    {
        nested = serde_json::from_slice(&read_layout_blob(dir, &descriptor.digest)?)
            .map_err(|e| bad_content(dir, "the nested index", e))?;
        descriptor = pick(dir, &nested.manifests)?;
    }
    if !is_sha256_digest(&descriptor.digest) {
        return Err(corrupt(dir, format!("bad digest {:?}", descriptor.digest)));
    }
    let manifest = read_layout_blob(dir, &descriptor.digest)?;
    let parsed: OciManifest =
        serde_json::from_slice(&manifest).map_err(|e| bad_content(dir, "the manifest", e))?;
    let blob_files = parsed
        .layers
        .iter()
        .map(|l| layout_blob(dir, &l.digest))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Found {
        config_file: layout_blob(dir, &parsed.config.digest)?,
        manifest,
        config: parsed.config,
        layers: parsed.layers,
        blob_files,
    })
}

/// A path inside the unpacked archive, refusing ones that leave it.
fn inside(dir: &Path, name: &str) -> Result<PathBuf, ImageError> {
    let relative = Path::new(name);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(corrupt(dir, format!("path {name:?} leaves the archive")));
    }
    Ok(dir.join(relative))
}

/// A `docker save` archive: `manifest.json` names the config and the layer
/// tars; a Docker schema 2 manifest is made for them (what the registry
/// would have served), so the store holds the same shape as for a pull.
fn find_in_docker_archive(dir: &Path) -> Result<Found, ImageError> {
    let path = dir.join("manifest.json");
    let entries: Vec<DockerEntry> =
        serde_json::from_slice(&std::fs::read(&path).map_err(io_err(&path))?)
            .map_err(|e| bad_content(dir, "manifest.json", e))?;
    let [entry] = entries.as_slice() else {
        return Err(corrupt(
            dir,
            format!(
                "manifest.json lists {} images; xfn adapt needs exactly one",
                entries.len()
            ),
        ));
    };
    let config_file = inside(dir, &entry.config)?;
    let config = BlobRef {
        media_type: "application/vnd.docker.container.image.v1+json".to_string(),
        digest: file_digest(&config_file)?,
        size: std::fs::metadata(&config_file)
            .map_err(io_err(&config_file))?
            .len(),
    };
    let mut layers = Vec::with_capacity(entry.layers.len());
    let mut blob_files = Vec::with_capacity(entry.layers.len());
    for name in &entry.layers {
        let file = inside(dir, name)?;
        layers.push(BlobRef {
            // Compression is sniffed at extraction (docker writes plain
            // tars, newer versions may gzip).
            media_type: "application/vnd.docker.image.rootfs.diff.tar".to_string(),
            digest: file_digest(&file)?,
            size: std::fs::metadata(&file).map_err(io_err(&file))?.len(),
        });
        blob_files.push(file);
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": config,
        "layers": layers,
    }))
    .map_err(|e| bad_content(dir, "the manifest made of manifest.json", e))?;
    Ok(Found {
        manifest,
        config,
        layers,
        blob_files,
        config_file,
    })
}
