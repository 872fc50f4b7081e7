//! The content-addressed image store under the cache dir: what is on disk,
//! how it gets there whole, and how it is read back. It never talks to a
//! registry: [`super::pull`] resolves and downloads, and hands the store
//! verified bytes to publish.
//!
//! Invariants (each with its why in the note below):
//! - an entry that exists is whole: written under `tmp/`, verified (blob
//!   digests, each layer's diff id), made durable, then renamed into place;
//!   a ref is written only after everything it names;
//! - a content-addressed file read back is checked against its name; a torn
//!   one is removed and counts as absent, never a lasting error;
//! - pulls of one reference, layer or flattened rootfs happen once across
//!   processes (an async mutex plus an flock); at most [`MAX_LAYERS`] layers;
//! - nothing is collected from under a user: users pin what they use (`pin`);
//! - the store is private to xfn's user (0700; 0710 where functions run
//!   under ids of their own): unreachable, not stripped of setuid bits.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/image/store.rs`.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

mod codec;
/// For `xfn wrap`'s checks of tarballs and layers, decompressed as a pull does.
pub(crate) use codec::decompressor;
mod entries;
mod gc;
mod import;
mod layout;
mod listing;
mod lock;
pub(crate) mod owners;
mod pin;
mod publish;
mod rootfs;
pub(crate) mod trust;

pub(crate) use codec::{extract_verified, ChannelReader};
pub(crate) use entries::parse_config;
pub use entries::PulledImage;
pub use gc::GcReport;
pub(crate) use import::file_digest;
pub(crate) use import::ImportSource;
pub use listing::{CacheListing, CachedImage};
pub use pin::ImagePin;

use lock::{KeyGuard, KeyLocks};

use super::error::{io_err, ImageError};
use super::extract::bounds::{DEFAULT_MAX_IMAGE_SIZE, DEFAULT_MAX_LAYER_ENTRIES};
use super::extract::{Budget, ExtractOptions, LayerBounds};

/// Most layers an image may have (what overlayfs and Docker accept).
pub(crate) const MAX_LAYERS: usize = 256;

/// The bounds the store applies whenever it unpacks layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes one image may unpack to (`--max-image-size`).
    pub max_image_size: u64,
    /// Most entries in one layer (`--max-layer-entries`).
    pub max_layer_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_image_size: DEFAULT_MAX_IMAGE_SIZE,
            max_layer_entries: DEFAULT_MAX_LAYER_ENTRIES,
        }
    }
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

/// The store: cheap to clone, shared by every caller in a process.
#[derive(Clone)]
pub struct ContentStore {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    limits: Limits,
    locks: KeyLocks,
    stats: StoreStats,
    /// Names this process's temp entries, so a later xfn knows whose they are.
    instance: Arc<crate::instance::Instance>,
    /// Disk usage of published dirs, measured once (see `gc`).
    sizes: Mutex<HashMap<PathBuf, u64>>,
    /// When this process last marked each ref used (see `entries`).
    touched: Mutex<HashMap<PathBuf, Instant>>,
    /// This process's pins, one per image (see `pin`).
    pins: Mutex<pin::LivePins>,
    /// What image ids are shifted by when layers are extracted (`owners`).
    owner_shift: u32,
}

impl std::fmt::Debug for ContentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentStore")
            .field("root", &self.inner.root)
            .finish_non_exhaustive()
    }
}

impl ContentStore {
    /// Opens (creating when absent) the store under `cache_dir`, and
    /// removes leftovers of dead processes from `tmp/`.
    /// Refuses a cache dir another uid could rename entries in
    /// ([`trust`]); in xfn's namespace that was checked on entering it.
    pub fn open(cache_dir: &Path, limits: Limits) -> Result<Self, ImageError> {
        trust::check_at_open(cache_dir)?;
        layout::create_private_dirs(cache_dir)?;
        let instance = crate::instance::of_cache(cache_dir).map_err(|err| match err {
            crate::instance::InstanceError::Io { path, source } => ImageError::Io { path, source },
        })?;
        let store = ContentStore {
            inner: Arc::new(Inner {
                root: cache_dir.to_path_buf(),
                limits,
                locks: KeyLocks::new(cache_dir.join(layout::LOCKS)),
                stats: StoreStats::default(),
                instance,
                sizes: Mutex::default(),
                touched: Mutex::default(),
                pins: Mutex::default(),
                owner_shift: owners::shift_of(cache_dir),
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

    /// Locks `key` in this process and across processes.
    pub(crate) async fn lock(&self, key: &str) -> Result<KeyGuard, ImageError> {
        self.inner.locks.lock(key).await
    }

    /// A fresh unpacked-size budget for one pull or flattening, cancelled
    /// when the returned guard is dropped: the extraction threads of a pull
    /// whose future is dropped stop at their next read.
    pub(crate) fn budget(&self) -> CancelOnDrop {
        CancelOnDrop(Arc::new(Budget::new(self.inner.limits.max_image_size)))
    }

    /// The per-layer bounds of every extraction.
    pub(crate) fn layer_bounds(&self) -> LayerBounds {
        LayerBounds {
            max_entries: self.inner.limits.max_layer_entries,
            ..Default::default()
        }
    }

    /// What image ids are shifted by in extracted layers (`owners`).
    pub(crate) fn owner_shift(&self) -> u32 {
        self.inner.owner_shift
    }

    fn sizes_memo(&self) -> MutexGuard<'_, HashMap<PathBuf, u64>> {
        self.inner.sizes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touched_memo(&self) -> MutexGuard<'_, HashMap<PathBuf, Instant>> {
        self.inner.touched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How every extraction into this store goes: its bounds and owners.
    pub(crate) fn extract_options(&self) -> ExtractOptions {
        ExtractOptions {
            bounds: self.layer_bounds(),
            owner_shift: self.owner_shift(),
            ..Default::default()
        }
    }
}

/// An unpacked-size budget that is cancelled when dropped.
pub(crate) struct CancelOnDrop(pub(crate) Arc<Budget>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_removes_tmp_entries_of_dead_instances() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("tmp/0123456789abcdef.layer.abc");
        std::fs::create_dir_all(&stale).unwrap();
        let store = ContentStore::open(dir.path(), Limits::default()).unwrap();
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
