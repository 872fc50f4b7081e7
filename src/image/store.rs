//! The content-addressed image store under the cache dir.
//!
//! # Layout
//!
//! ```text
//! <cache>/
//!   refs/<escaped reference>   {"reference": "127.0.0.1:5000/fn:v1", "digest": "sha256:…"}
//!                              (`/` escaped as `%2F`; very long ones named `sha256-<hex of reference>`)
//!   manifests/<hex>            the platform image manifest, as received
//!   configs/<hex>              the image config, as received
//!   blobs/sha256/<hex>         compressed layer blobs, kept to build flattened rootfs on demand
//!   layers/<hex>/              each layer extracted once (overlay whiteouts): an overlay lower dir
//!   rootfs/<manifest hex>/     all layers applied in order (copy mode), built on first request
//!   locks/<hex>.lock           flock files serialising pulls across processes
//!   tmp/<pid>.<random>         work in progress; same filesystem, so renames are atomic
//! ```
//!
//! `<hex>` is the sha256 of the content as named by its digest (layer
//! directories by their compressed blob's digest).
//!
//! # Invariants
//!
//! - A layer is extracted while it downloads: the blob is written to a temp
//!   file and, chunk by chunk, fed to the extractor writing a temp dir.
//! - Every entry is written under `tmp/` and renamed into place only when
//!   whole and verified (blob digests while downloading, each layer's
//!   uncompressed diff id while extracting): a crash leaves at most garbage
//!   in `tmp/`, which the next `open` removes once its process is gone. An
//!   entry that exists is whole. (Renames are not fsynced: this survives
//!   process crashes, not power loss, which is fine for a cache.)
//! - An image is cached when its ref, manifest, config and every layer
//!   directory exist; `IfNotPresent` and `Never` need nothing else.
//! - Pulls of one reference, one layer or one flattened rootfs are
//!   serialised by an in-process async mutex plus an flock on a lock file,
//!   so concurrent `ensure` calls in one or several processes download
//!   each blob once; losers of a rename race simply use the winner's entry.
//! - At most [`MAX_LAYERS`] layers per image.
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

mod codec;
mod import;
mod lock;

pub use import::ImportSource;

use codec::{decompressor, extract_verified, ChannelReader};
use lock::{KeyGuard, KeyLocks};

use super::extract::bounds::{DEFAULT_MAX_IMAGE_SIZE, DEFAULT_MAX_LAYER_ENTRIES};
use super::extract::{
    extract_layer_bounded, Budget, ExtractError, ExtractOptions, LayerBounds, WhiteoutMode,
};
use super::pull::{is_sha256_digest, BlobRef, ConnectOptions, Manifest, PullError, Puller};
use super::reference::{ImageReference, ReferenceError};
use super::RegistryAuth;

/// Most layers an image may have (what overlayfs and Docker accept).
pub const MAX_LAYERS: usize = 256;
/// Layers downloaded and extracted at once per pull.
const PARALLEL_LAYERS: usize = 4;

/// When to contact the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PullPolicy {
    /// Use the cache when the image is there (also the protocol's UNSPECIFIED).
    #[default]
    IfNotPresent,
    /// Re-resolve the reference every time; reuse cached layers.
    Always,
    /// Cache only.
    Never,
}

/// Options that hold for every pull of a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Registry for references that name none (`-r/--registry`); empty
    /// means Docker Hub.
    pub default_registry: String,
    /// Registries reached over plain HTTP (loopback ones always are).
    pub insecure_registries: Vec<String>,
    /// A PEM CA bundle trusted in addition to the system roots.
    pub ca_bundle: Option<PathBuf>,
    /// Most bytes one pull may unpack (`--max-image-size`).
    pub max_image_size: u64,
    /// Most entries in one layer (`--max-layer-entries`).
    pub max_layer_entries: u64,
    /// Longest one pull may take, resolving and downloading (`--pull-timeout`).
    pub pull_timeout: Duration,
}

/// Default of `--pull-timeout`: long enough for a few hundred MB over a slow
/// link, short enough that a registry feeding bytes one at a time cannot
/// hold a pull (and whoever waits for the same image) forever.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            default_registry: String::new(),
            insecure_registries: Vec::new(),
            ca_bundle: None,
            max_image_size: DEFAULT_MAX_IMAGE_SIZE,
            max_layer_entries: DEFAULT_MAX_LAYER_ENTRIES,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
        }
    }
}

/// What kind of failure an [`ImageError`] is, for mapping to gRPC codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageErrorKind {
    /// A malformed reference or argument (`InvalidArgument`).
    InvalidArgument,
    /// The image, tag or platform does not exist (`NotFound`).
    NotFound,
    /// The registry refused the credentials (`PermissionDenied`).
    Unauthorized,
    /// The registry cannot be reached or failed (`Unavailable`).
    Unavailable,
    /// Policy `Never` and the image is not cached (`FailedPrecondition`).
    NotPresent,
    /// Content does not match its digest or is malformed (`DataLoss`).
    Corrupt,
    /// More than [`MAX_LAYERS`] layers (`ResourceExhausted`/`InvalidArgument`).
    TooManyLayers,
    /// A layer could not be extracted (`Internal`, or `InvalidArgument` for hostile tars).
    Extract,
    /// The image breaks a bound: unpacked size, entries, header sizes,
    /// manifest or blob sizes (`ResourceExhausted`).
    TooLarge,
    /// The pull took longer than `--pull-timeout` (`DeadlineExceeded`).
    Timeout,
    /// Local I/O failed (`Internal`).
    Io,
}

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The reference does not parse.
    #[error(transparent)]
    InvalidReference(#[from] ReferenceError),
    /// Pull policy `Never` and the image is not (wholly) in the cache.
    #[error("image {image} is not in the cache and the pull policy is Never")]
    NotPresent {
        /// The normalised reference.
        image: String,
    },
    /// Resolving or downloading failed.
    #[error(transparent)]
    Pull(#[from] PullError),
    /// Too many layers.
    #[error("image {image} has {count} layers; at most {max} are supported")]
    TooManyLayers {
        /// The reference.
        image: String,
        /// Its layer count.
        count: usize,
        /// [`MAX_LAYERS`].
        max: usize,
    },
    /// Content is inconsistent (config, diff ids, cached entries).
    #[error("image {image}: {reason}")]
    Corrupt {
        /// The reference or digest.
        image: String,
        /// What is wrong.
        reason: String,
    },
    /// Extracting a layer failed.
    #[error("extracting layer {digest}: {source}")]
    Extract {
        /// The layer blob digest.
        digest: String,
        /// Why.
        source: ExtractError,
    },
    /// The pull did not finish in time.
    #[error("pulling {image} took longer than {timeout:?} (the --pull-timeout bound)")]
    Timeout {
        /// The reference.
        image: String,
        /// The bound.
        timeout: Duration,
    },
    /// Local file system trouble.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl ImageError {
    /// How to classify this error (e.g. for a gRPC status).
    pub fn kind(&self) -> ImageErrorKind {
        match self {
            ImageError::InvalidReference(_) => ImageErrorKind::InvalidArgument,
            ImageError::NotPresent { .. } => ImageErrorKind::NotPresent,
            ImageError::Pull(e) => e.kind(),
            ImageError::TooManyLayers { .. } => ImageErrorKind::TooManyLayers,
            ImageError::Corrupt { .. } => ImageErrorKind::Corrupt,
            ImageError::Extract {
                source: ExtractError::Bound { .. },
                ..
            } => ImageErrorKind::TooLarge,
            ImageError::Extract { .. } => ImageErrorKind::Extract,
            ImageError::Timeout { .. } => ImageErrorKind::Timeout,
            ImageError::Io { .. } => ImageErrorKind::Io,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

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
}

/// What one `ensure` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullReport {
    /// Whether the registry was asked (policy Always, or not cached).
    pub resolved_remotely: bool,
    /// Layers in the image.
    pub layers: usize,
    /// Layer blobs downloaded by this call (others were cached).
    pub layers_downloaded: usize,
    /// Bytes of layer blobs downloaded by this call.
    pub bytes_downloaded: u64,
    /// Sum of the image's compressed layer sizes.
    pub total_bytes: u64,
}

/// Told about a pull as it goes (for a progress bar). Called from the
/// pulling task; keep it cheap.
pub trait PullProgress: Send + Sync {
    /// The manifest is resolved: `layers` layers, `total_bytes` compressed.
    fn started(&self, _layers: usize, _total_bytes: u64) {}
    /// `bytes` more bytes of some layer arrived (or were found cached).
    fn advanced(&self, _bytes: u64) {}
}

/// Counters over the store's lifetime in this process: what was really
/// fetched, to observe that concurrent pulls download once.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Manifests resolved at a registry.
    pub manifests_resolved: AtomicU64,
    /// Layer blobs downloaded.
    pub blobs_downloaded: AtomicU64,
    /// Layers extracted.
    pub layers_extracted: AtomicU64,
}

/// An image in the cache, as `xfn cache ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedImage {
    /// The normalised reference.
    pub reference: String,
    /// The manifest digest.
    pub digest: String,
    /// Config plus compressed layer sizes, from the manifest.
    pub size: u64,
    /// Whether every layer is extracted.
    pub complete: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct RefEntry {
    reference: String,
    digest: String,
}

/// The store.
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    options: StoreOptions,
    connect: ConnectOptions,
    locks: KeyLocks,
    stats: StoreStats,
    /// Names this process's temp entries, so a later xfn knows whose they are.
    instance: Arc<crate::instance::Instance>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("root", &self.inner.root)
            .finish_non_exhaustive()
    }
}

const DIRS: &[&str] = &[
    "refs",
    "manifests",
    "configs",
    "blobs/sha256",
    "layers",
    "rootfs",
    "locks",
    "tmp",
];

impl ImageStore {
    /// Opens (creating when absent) the store under `cache_dir`, and
    /// removes leftovers of dead processes from `tmp/`.
    pub fn open(cache_dir: &Path, options: StoreOptions) -> Result<Self, ImageError> {
        for dir in DIRS {
            let path = cache_dir.join(dir);
            std::fs::create_dir_all(&path).map_err(io_err(&path))?;
        }
        let mut connect = ConnectOptions {
            insecure_registries: options.insecure_registries.clone(),
            ..Default::default()
        };
        if let Some(ca) = &options.ca_bundle {
            connect.load_ca_bundle(ca)?;
        }
        let instance = crate::instance::of_cache(cache_dir).map_err(|err| match err {
            crate::instance::InstanceError::Io { path, source } => ImageError::Io { path, source },
        })?;
        let store = ImageStore {
            inner: Arc::new(Inner {
                root: cache_dir.to_path_buf(),
                options,
                connect,
                locks: KeyLocks::new(cache_dir.join("locks")),
                stats: StoreStats::default(),
                instance,
            }),
        };
        store.clean_tmp();
        Ok(store)
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// This process's claim on the cache (see [`crate::instance`]).
    pub fn instance(&self) -> &Arc<crate::instance::Instance> {
        &self.inner.instance
    }

    /// Counters of what this process fetched.
    pub fn stats(&self) -> &StoreStats {
        &self.inner.stats
    }

    /// Makes `image` whole in the store under `policy` and returns it.
    pub async fn ensure(
        &self,
        image: &str,
        policy: PullPolicy,
        auth: &RegistryAuth,
    ) -> Result<PulledImage, ImageError> {
        self.ensure_with(image, policy, auth, None)
            .await
            .map(|(image, _)| image)
    }

    /// [`ensure`](Self::ensure), reporting progress and what was fetched.
    pub async fn ensure_with(
        &self,
        image: &str,
        policy: PullPolicy,
        auth: &RegistryAuth,
        progress: Option<&dyn PullProgress>,
    ) -> Result<(PulledImage, PullReport), ImageError> {
        let reference = ImageReference::parse(image, &self.inner.options.default_registry)?;
        let key = reference.to_string();
        let cached = |pulled: (PulledImage, Manifest)| {
            let report = cached_report(&pulled.1);
            if let Some(p) = progress {
                p.started(report.layers, report.total_bytes);
                p.advanced(report.total_bytes);
            }
            (pulled.0, report)
        };
        // A cached image needs no lock: entries are whole once they exist,
        // so a caller never waits behind a slow pull of the same reference.
        if policy != PullPolicy::Always {
            if let Some(pulled) = self.load_cached(&reference, image)? {
                return Ok(cached(pulled));
            }
            if policy == PullPolicy::Never {
                return Err(ImageError::NotPresent { image: key });
            }
        }
        let timeout = self.inner.options.pull_timeout;
        let locked_pull = async {
            let _guard = self.lock(&format!("ref {key}")).await?;
            if policy != PullPolicy::Always {
                // Someone else may have pulled it while we waited.
                if let Some(pulled) = self.load_cached(&reference, image)? {
                    return Ok(cached(pulled));
                }
            }
            self.pull(&reference, image, auth, progress).await
        };
        // Waiting for another caller's pull of the same image counts too:
        // theirs ends by its own deadline, ours by this one.
        tokio::time::timeout(timeout, locked_pull)
            .await
            .map_err(|_| ImageError::Timeout {
                image: key.clone(),
                timeout,
            })?
    }

    /// The flattened rootfs of a pulled image (every layer applied in one
    /// directory), built once and cached; the source of copy-mode rootfs.
    pub async fn flattened_rootfs(&self, image: &PulledImage) -> Result<PathBuf, ImageError> {
        let hex = hex_of(&image.digest, &image.reference)?;
        let dest = self.root().join("rootfs").join(hex);
        if dest.is_dir() {
            return Ok(dest);
        }
        let _guard = self.lock(&format!("rootfs {}", image.digest)).await?;
        if dest.is_dir() {
            return Ok(dest);
        }
        let mut blobs = Vec::with_capacity(image.layers.len());
        for layer in &image.layers {
            let hex = layer
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            blobs.push((
                format!("sha256:{hex}"),
                self.root().join("blobs/sha256").join(&hex),
            ));
        }
        let work = self.tmp_dir("rootfs")?;
        let store = self.clone();
        let dest2 = dest.clone();
        let budget = CancelOnDrop::new(self.budget());
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
            store.commit_dir(work, &dest2)
        })
        .await
        .map_err(join_err)??;
        Ok(dest)
    }

    /// Every image with a ref in the cache, sorted by reference.
    pub fn list(&self) -> Result<Vec<CachedImage>, ImageError> {
        let refs = self.root().join("refs");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&refs).map_err(io_err(&refs))? {
            let entry = entry.map_err(io_err(&refs))?;
            let Ok(data) = std::fs::read(entry.path()) else {
                continue;
            };
            let Ok(r) = serde_json::from_slice::<RefEntry>(&data) else {
                continue;
            };
            let Some(manifest) = self.read_manifest(&r.digest)? else {
                continue;
            };
            let size = manifest.config.size + manifest.layers.iter().map(|l| l.size).sum::<u64>();
            let complete = manifest
                .layers
                .iter()
                .all(|l| self.layer_dir(&l.digest).is_ok_and(|d| d.is_dir()));
            out.push(CachedImage {
                reference: r.reference,
                digest: r.digest,
                size,
                complete,
            });
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// Resolves at the registry and fetches whatever is missing.
    async fn pull(
        &self,
        reference: &ImageReference,
        asked: &str,
        auth: &RegistryAuth,
        progress: Option<&dyn PullProgress>,
    ) -> Result<(PulledImage, PullReport), ImageError> {
        let key = reference.to_string();
        let puller = Puller::new(reference, auth, &self.inner.connect)?;
        let resolved = puller.resolve(reference).await?;
        self.inner
            .stats
            .manifests_resolved
            .fetch_add(1, Ordering::Relaxed);
        let manifest = &resolved.manifest;
        if manifest.layers.len() > MAX_LAYERS {
            return Err(ImageError::TooManyLayers {
                image: key,
                count: manifest.layers.len(),
                max: MAX_LAYERS,
            });
        }
        let total_bytes = manifest.layers.iter().map(|l| l.size).sum();
        if let Some(p) = progress {
            p.started(manifest.layers.len(), total_bytes);
        }

        let config_bytes = match self.read_config_bytes(&manifest.config.digest)? {
            Some(bytes) => bytes,
            None => {
                let bytes = puller.fetch_config(reference, &manifest.config).await?;
                let path = self.blob_path("configs", &manifest.config.digest)?;
                self.write_atomic(&path, &bytes)?;
                bytes
            }
        };
        let config = parse_config(&key, &config_bytes)?;
        let diff_ids = config.rootfs().diff_ids().clone();
        if diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::Corrupt {
                image: key,
                reason: format!(
                    "config lists {} diff ids for {} layers",
                    diff_ids.len(),
                    manifest.layers.len()
                ),
            });
        }

        let downloaded = AtomicU64::new(0);
        let downloaded_bytes = AtomicU64::new(0);
        // One budget for the image's layers; should this pull be dropped
        // (its caller gone, its deadline passed), the extraction threads
        // stop at their next read instead of unpacking on for nobody.
        let budget = CancelOnDrop::new(self.budget());
        // The futures are made up front, not in a `.map` closure over the
        // stream: a closure taking references in the stream's type defeats
        // rustc's proof that this future is `Send` (rust-lang/rust#102211),
        // which the gRPC server needs.
        let layer_futures: Vec<_> = manifest
            .layers
            .iter()
            .zip(&diff_ids)
            .map(|(blob, diff_id)| {
                self.ensure_layer(
                    &puller,
                    reference,
                    blob,
                    diff_id,
                    progress,
                    &downloaded,
                    &downloaded_bytes,
                    &budget.0,
                )
            })
            .collect();
        let fetched: Vec<PathBuf> = futures::stream::iter(layer_futures)
            .buffered(PARALLEL_LAYERS)
            .try_collect()
            .await?;

        let manifest_path = self.blob_path("manifests", &resolved.digest)?;
        if !manifest_path.exists() {
            self.write_atomic(&manifest_path, &resolved.bytes)?;
        }
        let entry = RefEntry {
            reference: key.clone(),
            digest: resolved.digest.clone(),
        };
        let entry = serde_json::to_vec(&entry).map_err(|e| ImageError::Corrupt {
            image: key.clone(),
            reason: e.to_string(),
        })?;
        self.write_atomic(&self.ref_path(&key), &entry)?;

        let report = PullReport {
            resolved_remotely: true,
            layers: manifest.layers.len(),
            layers_downloaded: downloaded.load(Ordering::Relaxed) as usize,
            bytes_downloaded: downloaded_bytes.load(Ordering::Relaxed),
            total_bytes,
        };
        Ok((
            PulledImage {
                reference: asked.to_string(),
                digest: resolved.digest,
                config,
                layers: fetched,
            },
            report,
        ))
    }

    /// Makes one layer's directory exist: download (unless the blob is
    /// cached), verify, extract, verify the diff id, rename into place.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_layer(
        &self,
        puller: &Puller,
        reference: &ImageReference,
        blob: &BlobRef,
        diff_id: &str,
        progress: Option<&dyn PullProgress>,
        downloaded: &AtomicU64,
        downloaded_bytes: &AtomicU64,
        budget: &Arc<Budget>,
    ) -> Result<PathBuf, ImageError> {
        let dest = self.layer_dir(&blob.digest)?;
        let report_cached = || {
            if let Some(p) = progress {
                p.advanced(blob.size);
            }
        };
        if dest.is_dir() {
            report_cached();
            return Ok(dest);
        }
        let _guard = self.lock(&format!("layer {}", blob.digest)).await?;
        if dest.is_dir() {
            report_cached();
            return Ok(dest);
        }
        let blob_path = self.blob_path("blobs/sha256", &blob.digest)?;
        let work = self.tmp_dir("layer")?;
        let work_path = work.path().to_path_buf();
        let (digest, media_type, diff_id) = (
            blob.digest.clone(),
            blob.media_type.clone(),
            diff_id.to_string(),
        );
        let (budget, bounds) = (budget.clone(), self.extract_options().bounds);
        if blob_path.is_file() {
            report_cached();
            let blob_path = blob_path.clone();
            tokio::task::spawn_blocking(move || {
                let file = File::open(&blob_path).map_err(io_err(&blob_path))?;
                let reader = BufReader::with_capacity(1 << 20, file);
                extract_verified(
                    reader,
                    &media_type,
                    &digest,
                    &diff_id,
                    &work_path,
                    bounds,
                    &budget,
                )
            })
            .await
            .map_err(join_err)??;
        } else {
            // Extract while downloading: the extractor reads a copy of the
            // chunks as they arrive, into a temp dir that is only renamed
            // into place once the blob's digest and the diff id both match.
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            let watched = budget.clone();
            let extractor = tokio::task::spawn_blocking(move || {
                let reader = BufReader::with_capacity(1 << 20, ChannelReader::new(rx));
                extract_verified(
                    reader,
                    &media_type,
                    &digest,
                    &diff_id,
                    &work_path,
                    bounds,
                    &budget,
                )
            });
            let tmp = self.tmp_file("blob")?;
            let on_bytes = |n: u64| {
                if let Some(p) = progress {
                    p.advanced(n);
                }
            };
            // A layer refused for a bound is not downloaded further.
            let stop = || watched.refused();
            let fetched = puller
                .fetch_blob_to_file(reference, blob, tmp.as_ref(), &on_bytes, &stop, Some(tx))
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
            tmp.persist(&blob_path).map_err(|e| ImageError::Io {
                path: blob_path.clone(),
                source: e.error,
            })?;
            downloaded.fetch_add(1, Ordering::Relaxed);
            downloaded_bytes.fetch_add(n, Ordering::Relaxed);
            self.inner
                .stats
                .blobs_downloaded
                .fetch_add(1, Ordering::Relaxed);
        }
        self.commit_dir(work, &dest)?;
        self.inner
            .stats
            .layers_extracted
            .fetch_add(1, Ordering::Relaxed);
        Ok(dest)
    }

    /// The cached image for `reference`, or `None` when anything is missing.
    fn load_cached(
        &self,
        reference: &ImageReference,
        asked: &str,
    ) -> Result<Option<(PulledImage, Manifest)>, ImageError> {
        let key = reference.to_string();
        let digest = match std::fs::read(self.ref_path(&key)) {
            Ok(data) => match serde_json::from_slice::<RefEntry>(&data) {
                Ok(entry) => entry.digest,
                Err(_) => return Ok(None),
            },
            Err(_) => match &reference.digest {
                // Pinned by a digest we may have pulled under another name.
                Some(digest) => digest.clone(),
                None => return Ok(None),
            },
        };
        let Some(manifest) = self.read_manifest(&digest)? else {
            return Ok(None);
        };
        let Some(config_bytes) = self.read_config_bytes(&manifest.config.digest)? else {
            return Ok(None);
        };
        let config = parse_config(&key, &config_bytes)?;
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for layer in &manifest.layers {
            let dir = self.layer_dir(&layer.digest)?;
            if !dir.is_dir() {
                return Ok(None);
            }
            layers.push(dir);
        }
        Ok(Some((
            PulledImage {
                reference: asked.to_string(),
                digest,
                config,
                layers,
            },
            manifest,
        )))
    }

    fn read_manifest(&self, digest: &str) -> Result<Option<Manifest>, ImageError> {
        let path = self.blob_path("manifests", digest)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
        };
        #[derive(Deserialize)]
        struct Stored {
            config: BlobRef,
            layers: Vec<BlobRef>,
        }
        let stored: Stored = serde_json::from_slice(&bytes).map_err(|e| ImageError::Corrupt {
            image: digest.to_string(),
            reason: format!("cached manifest: {e}"),
        })?;
        Ok(Some(Manifest {
            config: stored.config,
            layers: stored.layers,
        }))
    }

    fn read_config_bytes(&self, digest: &str) -> Result<Option<Vec<u8>>, ImageError> {
        let path = self.blob_path("configs", digest)?;
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn blob_path(&self, dir: &str, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root().join(dir).join(hex_of(digest, digest)?))
    }

    fn layer_dir(&self, digest: &str) -> Result<PathBuf, ImageError> {
        self.blob_path("layers", digest)
    }

    fn ref_path(&self, key: &str) -> PathBuf {
        self.root().join("refs").join(ref_file_name(key))
    }

    fn tmp_prefix(&self, what: &str) -> String {
        format!("{}.{what}.", self.inner.instance.id())
    }

    /// A temp file under `tmp/`, removed when dropped unless persisted.
    fn tmp_file(&self, what: &str) -> Result<tempfile::TempPath, ImageError> {
        let tmp = self.root().join("tmp");
        tempfile::Builder::new()
            .prefix(&self.tmp_prefix(what))
            .tempfile_in(&tmp)
            .map(|f| f.into_temp_path())
            .map_err(io_err(&tmp))
    }

    /// A temp dir under `tmp/`, removed when dropped unless committed.
    fn tmp_dir(&self, what: &str) -> Result<tempfile::TempDir, ImageError> {
        let tmp = self.root().join("tmp");
        tempfile::Builder::new()
            .prefix(&self.tmp_prefix(what))
            .tempdir_in(&tmp)
            .map_err(io_err(&tmp))
    }

    /// Writes `data` to `dest` through a temp file and a rename.
    fn write_atomic(&self, dest: &Path, data: &[u8]) -> Result<(), ImageError> {
        let tmp = self.tmp_file("write")?;
        std::fs::write(&tmp, data).map_err(io_err(&tmp))?;
        tmp.persist(dest).map_err(|e| ImageError::Io {
            path: dest.to_path_buf(),
            source: e.error,
        })
    }

    /// Renames a finished temp dir into place; when another process got
    /// there first, keeps theirs (the content is the same by construction).
    fn commit_dir(&self, work: tempfile::TempDir, dest: &Path) -> Result<(), ImageError> {
        use std::os::unix::fs::PermissionsExt;
        // tempdir makes 0700 dirs; an image root is normally 0755 and other
        // users (the container's) must traverse it.
        let _ = std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755));
        match std::fs::rename(work.path(), dest) {
            Ok(()) => {
                let _ = work.keep();
                Ok(())
            }
            Err(_) if dest.is_dir() => Ok(()), // `work` is removed on drop
            Err(e) => Err(io_err(dest)(e)),
        }
    }

    /// A fresh unpacked-size budget for one pull or flattening.
    fn budget(&self) -> Arc<Budget> {
        Arc::new(Budget::new(self.inner.options.max_image_size))
    }

    fn extract_options(&self) -> ExtractOptions {
        ExtractOptions {
            bounds: LayerBounds {
                max_entries: self.inner.options.max_layer_entries,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Locks `key` in this process and across processes.
    async fn lock(&self, key: &str) -> Result<KeyGuard, ImageError> {
        self.inner.locks.lock(key).await
    }

    /// Removes `tmp/` entries of xfn instances that are gone.
    fn clean_tmp(&self) {
        let tmp = self.root().join("tmp");
        let Ok(entries) = std::fs::read_dir(&tmp) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name.to_str().and_then(|n| n.split('.').next()) else {
                continue;
            };
            if owner.is_empty() || self.inner.instance.is_live(owner) {
                continue;
            }
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// Cancels a budget when dropped: the extraction threads of a pull whose
/// future is dropped stop at their next read.
struct CancelOnDrop(Arc<Budget>);

impl CancelOnDrop {
    fn new(budget: Arc<Budget>) -> Self {
        CancelOnDrop(budget)
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

fn join_err(e: tokio::task::JoinError) -> ImageError {
    ImageError::Io {
        path: PathBuf::new(),
        source: std::io::Error::other(format!("worker task failed: {e}")),
    }
}

fn cached_report(manifest: &Manifest) -> PullReport {
    PullReport {
        resolved_remotely: false,
        layers: manifest.layers.len(),
        layers_downloaded: 0,
        bytes_downloaded: 0,
        total_bytes: manifest.layers.iter().map(|l| l.size).sum(),
    }
}

fn parse_config(
    image: &str,
    bytes: &[u8],
) -> Result<oci_spec::image::ImageConfiguration, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::Corrupt {
        image: image.to_string(),
        reason: format!("image config does not parse: {e}"),
    })
}

/// The hex of a `sha256:` digest, checked (it becomes a file name).
fn hex_of<'a>(digest: &'a str, image: &str) -> Result<&'a str, ImageError> {
    if !is_sha256_digest(digest) {
        return Err(ImageError::Corrupt {
            image: image.to_string(),
            reason: format!("bad digest {digest:?}"),
        });
    }
    Ok(&digest["sha256:".len()..])
}

/// `refs/` file name of a normalised reference.
fn ref_file_name(key: &str) -> String {
    let escaped = key.replace('%', "%25").replace('/', "%2F");
    if escaped.len() <= 200 {
        escaped
    } else {
        format!("sha256-{}", hex::encode(Sha256::digest(key.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_file_names_escape_slashes_and_stay_short() {
        assert_eq!(
            ref_file_name("127.0.0.1:5000/team/fn:v1"),
            "127.0.0.1:5000%2Fteam%2Ffn:v1"
        );
        let long = format!("r.io/{}:t", "a".repeat(300));
        assert!(ref_file_name(&long).starts_with("sha256-"));
    }

    #[test]
    fn error_kinds() {
        let e = ImageError::NotPresent { image: "x".into() };
        assert_eq!(e.kind(), ImageErrorKind::NotPresent);
        assert!(e.to_string().contains("x"));
        let e: ImageError = ReferenceError::Empty.into();
        assert_eq!(e.kind(), ImageErrorKind::InvalidArgument);
    }

    #[test]
    fn bad_digests_never_become_paths() {
        assert!(hex_of("sha256:../../etc/passwd", "x").is_err());
        assert!(hex_of("sha512:00", "x").is_err());
    }

    #[tokio::test]
    async fn never_with_an_empty_cache_names_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path(), StoreOptions::default()).unwrap();
        let err = store
            .ensure(
                "127.0.0.1:1/absent:v1",
                PullPolicy::Never,
                &RegistryAuth::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ImageErrorKind::NotPresent);
        assert!(err.to_string().contains("127.0.0.1:1/absent:v1"), "{err}");
    }

    #[test]
    fn open_removes_tmp_entries_of_dead_instances() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("tmp/0123456789abcdef.layer.abc");
        std::fs::create_dir_all(&stale).unwrap();
        let store = ImageStore::open(dir.path(), StoreOptions::default()).unwrap();
        assert!(!stale.exists());
        // A live instance's entries stay.
        let live = dir
            .path()
            .join(format!("tmp/{}.layer.abc", store.instance().id()));
        std::fs::create_dir_all(&live).unwrap();
        store.clean_tmp();
        assert!(live.exists());
    }
}
