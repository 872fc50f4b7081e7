//! The content-addressed image store under the cache dir: what is on disk,
//! how it gets there whole, and how it is read back. It never talks to a
//! registry: [`super::pull`] resolves and downloads, and hands the store
//! verified bytes to publish.
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
//!   locks/gc.gate, gc.run      the collector's gate (see `pin`) and its one-at-a-time lock
//!   pins/<manifest hex>        shared flocks held by whoever uses an image (see `pin`)
//!   tmp/<instance>.<what>.<random>  work in progress; same filesystem, so renames are atomic
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
//!   in `tmp/`, which the next `open` removes once its owner (an instance,
//!   [`crate::instance`]) is gone. An entry that exists is whole.
//! - Durable before published: a file's bytes are fsynced, a layer tree is
//!   written out by one `syncfs`, before the rename that publishes it, and
//!   the directory is fsynced after (`publish`); a ref is written only
//!   after everything it names is. So after a power loss an entry is whole
//!   or absent, and a ref names nothing missing.
//! - Read, a content-addressed file (manifest, config, kept blob) is
//!   checked against its name; one that does not match (torn under an older
//!   xfn, damaged since) is removed and counts as absent, so the next pull
//!   fetches it again. A torn entry is never a lasting error. (Layer trees
//!   are not re-hashed on read: they are published only after `syncfs`.)
//!   What a lookup verified is kept in its pin: later lookups under the
//!   same live pin use it, and the first after the pin's last clone reads
//!   and checks the disk again (`pin`).
//! - An image is cached when its ref, manifest, config and every layer
//!   directory exist; `IfNotPresent` and `Never` need nothing else.
//! - Pulls of one reference, one layer or one flattened rootfs are
//!   serialised by an in-process async mutex plus an flock on a lock file,
//!   so concurrent `ensure` calls in one or several processes download
//!   each blob once; losers of a rename race simply use the winner's entry.
//! - At most [`MAX_LAYERS`] layers per image.
//! - Collected, never from under a user: whoever uses an image (a run, a
//!   pull, an import, a warm container) pins it first, and a collection
//!   removes only what no ref and no pin needs; a blob or layer shared by
//!   several images goes with the last of them. Eviction for a budget is
//!   least recently used first (`gc`, `pin`).
//!
//! # Privacy
//!
//! The root and every directory of the store are mode 0700 (the root 0710
//! where functions run under ids of their own: its group is theirs, for
//! crun to reach their rootfs, `owners`), owned by the user xfn runs as: in the range mapping that is the mapped root (host
//! `--map-root-uid`, to which `xfn` hands the cache before entering its
//! namespace), otherwise xfn's own uid. Layers keep the modes and owners
//! their image gives them, setuid bits and world-writable dirs included,
//! and in the range mapping those owners are real host uids (the image's
//! ids one up: `owners`).
//!
//! Choice: **unreachable, not stripped.** Stripping setuid/setgid bits
//! would answer one hazard of a reachable cache; it would leave the others:
//! a world-writable directory of an image (every `/tmp` is 1777) would let
//! any local user plant files in the lower dir every later run of that
//! image sees, and files the image keeps readable only to its own users
//! would be readable to the node. A cache no other user can traverse
//! answers all three at once, and keeps images faithful. The bits are
//! inert where they are meant to be used: every function runs with
//! `no_new_privs` (`sandbox::spec`), so a setuid binary gains nothing there
//! either. Nothing needs another user to traverse the cache: crun, running
//! as xfn's namespace root, resolves lower dirs and bind-mount sources
//! before the function's user exists, and after the mount the kernel
//! checks the mounted dirs themselves, not the path to them. A root xfn
//! cannot chmod (a volume owned by someone else) is left with a warning;
//! the store's own directories below it are private regardless.
//!
//! # Files
//!
//! `layout` names every path; `publish` is the temp-then-rename path into
//! the store; `entries` reads and writes refs, manifests and configs and
//! finds a cached image; `rootfs` builds flattened rootfs; `listing` is
//! `xfn cache ls`; `import` fills the store from files instead of a
//! registry; `codec` decompresses and verifies layer streams; `lock` is
//! the per-key lock table; `pin` the holds on images in use (and what
//! was found under them); `gc` removes
//! images and collects garbage.
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
