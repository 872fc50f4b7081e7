//! Getting an image into the store: [`ImageStore`] is the [`ContentStore`] plus
//! the registry client. [`ImageStore::ensure`] resolves a reference under a
//! pull policy, downloads what is missing and has the store publish it; the
//! store itself never talks to a registry.
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use super::descriptor::Manifest;
use super::error::{join_err, ImageError, PullBound};
use super::policy::PullPolicy;
use super::pull::{ConnectOptions, Puller};
use super::reference::ImageReference;
use super::store::{
    parse_config, CacheListing, ContentStore, GcReport, ImportSource, Limits, PulledImage,
    StoreStats, MAX_LAYERS,
};
use super::RegistryAuth;

mod layer;

/// Layers downloaded and extracted at once per pull.
const PARALLEL_LAYERS: usize = 4;

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
pub(crate) const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for StoreOptions {
    fn default() -> Self {
        let limits = Limits::default();
        StoreOptions {
            default_registry: String::new(),
            insecure_registries: Vec::new(),
            ca_bundle: None,
            max_image_size: limits.max_image_size,
            max_layer_entries: limits.max_layer_entries,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
        }
    }
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

/// The image store with its registry client: what callers use.
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

struct Inner {
    store: ContentStore,
    options: StoreOptions,
    connect: ConnectOptions,
    /// Told after each pull that downloaded layers (the daemon's collector).
    pulled: tokio::sync::Notify,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("root", &self.root())
            .finish_non_exhaustive()
    }
}

impl ImageStore {
    /// Opens (creating when absent) the store under `cache_dir`, with the
    /// registry settings of `options` (a CA bundle is read now).
    pub fn open(cache_dir: &Path, options: StoreOptions) -> Result<Self, ImageError> {
        let mut connect = ConnectOptions {
            insecure_registries: options.insecure_registries.clone(),
            ..Default::default()
        };
        if let Some(ca) = &options.ca_bundle {
            connect.load_ca_bundle(ca)?;
        }
        let limits = Limits {
            max_image_size: options.max_image_size,
            max_layer_entries: options.max_layer_entries,
        };
        Ok(ImageStore {
            inner: Arc::new(Inner {
                store: ContentStore::open(cache_dir, limits)?,
                options,
                connect,
                pulled: tokio::sync::Notify::new(),
            }),
        })
    }

    /// The on-disk content store.
    pub fn content(&self) -> &ContentStore {
        &self.inner.store
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        self.content().root()
    }

    /// This process's claim on the cache (see `crate::instance`).
    pub fn instance(&self) -> &Arc<crate::instance::Instance> {
        self.content().instance()
    }

    /// Counters of what this process fetched.
    pub fn stats(&self) -> &StoreStats {
        self.content().stats()
    }

    /// The flattened rootfs of a pulled image (see `ContentStore::flattened_rootfs`).
    pub async fn flattened_rootfs(&self, image: &PulledImage) -> Result<PathBuf, ImageError> {
        self.content().flattened_rootfs(image).await
    }

    /// Every image with a ref in the cache (see `ContentStore::list`).
    pub fn list(&self) -> Result<CacheListing, ImageError> {
        self.content().list()
    }

    /// Imports an image from files (see `ContentStore::import`).
    pub async fn import(
        &self,
        source: ImportSource,
        repository: &str,
    ) -> Result<String, ImageError> {
        self.content()
            .import(source, repository, &self.inner.options.default_registry)
            .await
    }

    /// Removes the images `references` name (their refs), then what no
    /// image left uses (see `ContentStore::remove_images`).
    pub async fn remove_images(&self, references: &[String]) -> Result<GcReport, ImageError> {
        let keys = references
            .iter()
            .map(|r| {
                ImageReference::parse(r, &self.inner.options.default_registry)
                    .map(|r| r.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let store = self.content().clone();
        tokio::task::spawn_blocking(move || store.remove_images(&keys))
            .await
            .map_err(join_err)?
    }

    /// Collects garbage, evicting least recently used images past
    /// `max_size` (see `ContentStore::collect`).
    pub async fn collect(&self, max_size: Option<u64>) -> Result<GcReport, ImageError> {
        let store = self.content().clone();
        tokio::task::spawn_blocking(move || store.collect(max_size))
            .await
            .map_err(join_err)?
    }

    /// Resolves after a pull that downloaded layers (once per such pull
    /// while nobody waits): when the daemon's collector looks again.
    pub async fn pulled(&self) {
        self.inner.pulled.notified().await
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

    /// [`ensure`](Self::ensure) for a call that has `call_time` left: its
    /// pull ends by then too, not only by `--pull-timeout`. What such a
    /// pull leaves behind is kept: layers are published one by one as they
    /// are whole, so a later call goes on where this one stopped.
    pub async fn ensure_within(
        &self,
        image: &str,
        policy: PullPolicy,
        auth: &RegistryAuth,
        call_time: Duration,
    ) -> Result<PulledImage, ImageError> {
        self.ensure_bounded(image, policy, auth, None, Some(call_time))
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
        self.ensure_bounded(image, policy, auth, progress, None)
            .await
    }

    /// [`ensure_with`](Self::ensure_with), the pull ending by `call_time`
    /// where given, else by `--pull-timeout`, whichever comes first.
    async fn ensure_bounded(
        &self,
        image: &str,
        policy: PullPolicy,
        auth: &RegistryAuth,
        progress: Option<&dyn PullProgress>,
        call_time: Option<Duration>,
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
        let load_cached = || {
            self.content()
                .cached(&key, reference.digest.as_deref(), image)
        };
        // A cached image needs no lock: entries are whole once they exist,
        // so a caller never waits behind a slow pull of the same reference.
        if policy != PullPolicy::Always {
            if let Some(pulled) = load_cached()? {
                return Ok(cached(pulled));
            }
            if policy == PullPolicy::Never {
                return Err(ImageError::NotPresent { image: key });
            }
        }
        let (timeout, bound) = match call_time {
            Some(call) if call < self.inner.options.pull_timeout => (call, PullBound::Call),
            _ => (self.inner.options.pull_timeout, PullBound::PullTimeout),
        };
        let locked_pull = async {
            let _guard = self.content().lock(&format!("ref {key}")).await?;
            if policy != PullPolicy::Always {
                // Someone else may have pulled it while we waited.
                if let Some(pulled) = load_cached()? {
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
                bound,
            })?
    }

    /// Resolves at the registry and fetches whatever is missing.
    async fn pull(
        &self,
        reference: &ImageReference,
        asked: &str,
        auth: &RegistryAuth,
        progress: Option<&dyn PullProgress>,
    ) -> Result<(PulledImage, PullReport), ImageError> {
        let store = self.content();
        let key = reference.to_string();
        let puller = Puller::new(reference, auth, &self.inner.connect)?;
        let resolved = puller.resolve(reference).await?;
        store
            .stats()
            .manifests_resolved
            .fetch_add(1, Ordering::Relaxed);
        // Pinned, with its manifest, before any layer is looked at: a
        // collection now keeps every layer this image needs.
        let pin = store.pin(&resolved.digest, Some(&resolved.bytes))?;
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

        let config_bytes = match store.read_config(&manifest.config.digest)? {
            Some(bytes) => bytes,
            None => {
                let bytes = puller.fetch_config(reference, &manifest.config).await?;
                store.publish_bytes(&store.config_path(&manifest.config.digest)?, &bytes)?;
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

        let counters = layer::Counters::default();
        // One budget for the image's layers; should this pull be dropped
        // (its caller gone, its deadline passed), the extraction threads
        // stop at their next read instead of unpacking on for nobody.
        let budget = store.budget();
        // The futures are made up front, not in a `.map` closure over the
        // stream: a closure taking references in the stream's type defeats
        // rustc's proof that this future is `Send` (rust-lang/rust#102211),
        // which the gRPC server needs.
        let layer_futures: Vec<_> = manifest
            .layers
            .iter()
            .zip(&diff_ids)
            .map(|(blob, diff_id)| {
                layer::ensure_layer(
                    store,
                    layer::LayerJob {
                        puller: &puller,
                        reference,
                        blob,
                        diff_id,
                        progress,
                        counters: &counters,
                        budget: &budget.0,
                    },
                )
            })
            .collect();
        let fetched: Vec<PathBuf> = futures::stream::iter(layer_futures)
            .buffered(PARALLEL_LAYERS)
            .try_collect()
            .await?;

        // (Re)written unless a whole one is there: a torn one is discarded
        // by reading it.
        if store.read_manifest(&resolved.digest)?.is_none() {
            store.publish_bytes(&store.manifest_path(&resolved.digest)?, &resolved.bytes)?;
        }
        store.write_ref(&key, &resolved.digest)?;
        if counters.layers.load(Ordering::Relaxed) > 0 {
            self.inner.pulled.notify_one();
        }

        let report = PullReport {
            resolved_remotely: true,
            layers: manifest.layers.len(),
            layers_downloaded: counters.layers.load(Ordering::Relaxed) as usize,
            bytes_downloaded: counters.bytes.load(Ordering::Relaxed),
            total_bytes,
        };
        Ok((
            PulledImage {
                reference: asked.to_string(),
                digest: resolved.digest,
                config,
                layers: fetched,
                pin,
            },
            report,
        ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageErrorKind;

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
}
