//! Pins: how the garbage collector knows what is in use, across processes.
//!
//! Whoever uses an image holds a *pin* on its manifest digest: a shared
//! `flock` on `pins/<manifest hex>`. A run holds one for as long as it
//! holds its [`PulledImage`](super::PulledImage) (the pin lives in it), a
//! pull from the moment it resolved the manifest, an import from the start,
//! a warm container for as long as its pool keeps its recipe. The kernel
//! drops a pin when its holder dies, however it dies. The collector tries
//! each pin file for an exclusive lock: one it cannot get is in use, and
//! the image's manifest, config, layers and blobs stay, ref or no ref.
//!
//! The *gate* (`locks/gc.gate`) orders pins against collections. Pinning
//! takes it shared, locks the pin and records its manifest; a collection
//! takes it exclusive while it decides and moves its victims aside
//! (milliseconds: the deleting happens after). So every pin a collection
//! sees is whole, and no image can be pinned between the collection's
//! look and its moves.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/image/store/pin.rs`.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, OnceLock, Weak};

use nix::fcntl::{Flock, FlockArg};

use super::layout::{hex_of, GATE, PINS};
use super::{io_err, ContentStore, ImageError};
use crate::image::descriptor::{sha256_digest, Manifest};

/// A hold on one image: while any clone lives, no collection removes it.
#[derive(Debug, Clone)]
pub struct ImagePin {
    held: Arc<Held>,
}

/// One pin of this process: its lock, and the image as first found under it.
#[derive(Debug)]
pub(super) struct Held {
    lock: Flock<File>,
    found: OnceLock<Found>,
}

/// A cached image as a lookup under a pin found it whole.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub(super) manifest: Manifest,
    pub(super) config: oci_spec::image::ImageConfiguration,
    pub(super) layers: Vec<PathBuf>,
}

/// This process's live pins, by manifest digest.
pub(super) type LivePins = HashMap<String, Weak<Held>>;

impl ImagePin {
    /// What a lookup under this pin found, if one did and every layer
    /// directory it found is still there.
    pub(super) fn found(&self) -> Option<&Found> {
        self.held
            .found
            .get()
            .filter(|found| found.layers.iter().all(|dir| dir.is_dir()))
    }

    /// Keeps what a lookup under this pin found whole, for the next ones.
    pub(super) fn keep(&self, found: Found) {
        let _ = self.held.found.set(found);
    }
}

/// The gate, held shared or exclusive.
pub(super) struct Gate {
    _lock: Flock<File>,
}

impl ContentStore {
    /// Takes the gate (shared to pin, exclusive to collect).
    pub(super) fn gate(&self, exclusive: bool) -> Result<Gate, ImageError> {
        let path = self.root().join(GATE);
        let mode = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        Ok(Gate {
            _lock: lock_file(&path, mode)?,
        })
    }

    /// Pins the image whose manifest is `digest`; with `manifest` (its
    /// verified bytes), records them in the pin (see the module's header).
    pub(crate) fn pin(
        &self,
        digest: &str,
        manifest: Option<&[u8]>,
    ) -> Result<ImagePin, ImageError> {
        // Made only where a file is touched: a warm call's pin touches none.
        let path = || -> Result<PathBuf, ImageError> {
            Ok(self.root().join(PINS).join(hex_of(digest, digest)?))
        };
        let live = self.live_pins().get(digest).and_then(Weak::upgrade);
        if let Some(held) = live {
            if let Some(bytes) = manifest {
                let _gate = self.gate(false)?;
                record(&held.lock, digest, bytes).map_err(io_err(&path()?))?;
            }
            return Ok(ImagePin { held });
        }
        let path = path()?;
        let _gate = self.gate(false)?;
        let lock = lock_file(&path, FlockArg::LockShared)?;
        if let Some(bytes) = manifest {
            record(&lock, digest, bytes).map_err(io_err(&path))?;
        }
        let held = Arc::new(Held {
            lock,
            found: OnceLock::new(),
        });
        // Two first pins of one image at once both lock: harmless, the
        // later one is the one handed out from now on.
        let mut live = self.live_pins();
        live.retain(|_, held| held.strong_count() > 0);
        live.insert(digest.to_string(), Arc::downgrade(&held));
        Ok(ImagePin { held })
    }

    fn live_pins(&self) -> MutexGuard<'_, LivePins> {
        self.inner.pins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The manifest of the image pinned as `hex`: the store's, or the one
    /// its pin recorded.
    pub(super) fn pinned_manifest(&self, hex: &str) -> Option<Manifest> {
        let digest = format!("sha256:{hex}");
        if let Ok(Some(manifest)) = self.read_manifest(&digest) {
            return Some(manifest);
        }
        let bytes = std::fs::read(self.root().join(PINS).join(hex)).ok()?;
        (sha256_digest(&bytes) == digest)
            .then(|| Manifest::parse(&bytes).ok())
            .flatten()
    }

    /// Whether some process pins `hex` (a manifest hex); `false` also
    /// removes the pin file, which is safe under the exclusive gate (no
    /// pinner is between opening and locking it).
    pub(super) fn is_pinned(&self, hex: &str, _gate: &Gate) -> bool {
        let path = self.root().join(PINS).join(hex);
        let Ok(file) = File::open(&path) else {
            return false;
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(_unpinned) => {
                let _ = std::fs::remove_file(&path);
                false
            }
            Err(_) => true,
        }
    }
}

/// Writes `bytes` (the manifest `digest` names) into the pin file unless
/// it holds them already. Several pinners of one image may write at once,
/// all under the shared gate and all the same bytes from offset 0; each
/// one's last step is a whole write, so the file is whole once they are
/// done, and no collection reads it before (it waits for the gate).
fn record(pin: &File, digest: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = pin.metadata()?.len();
    if len == bytes.len() as u64 {
        let mut held = vec![0; bytes.len()];
        pin.read_exact_at(&mut held, 0)?;
        if sha256_digest(&held) == digest {
            return Ok(());
        }
    }
    pin.set_len(0)?;
    pin.write_all_at(bytes, 0)
}

pub(super) fn lock_file(path: &Path, mode: FlockArg) -> Result<Flock<File>, ImageError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    Flock::lock(file, mode).map_err(|(_, errno)| io_err(path)(errno.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:1aab5c70a981f9fbc171524372b9dfa9a71ad0f8219065a5c4e6437127f64f5d";

    fn store() -> (tempfile::TempDir, ContentStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path(), super::super::Limits::default()).unwrap();
        (dir, store)
    }

    fn pinned(store: &ContentStore) -> bool {
        let gate = store.gate(true).unwrap();
        store.is_pinned(DIGEST.trim_start_matches("sha256:"), &gate)
    }

    #[test]
    fn a_second_pin_of_an_image_is_the_first_and_holds_it_until_its_last_clone_goes() {
        let (_dir, store) = store();
        let first = store.pin(DIGEST, None).unwrap();
        let second = store.pin(DIGEST, None).unwrap();
        assert!(Arc::ptr_eq(&first.held, &second.held));
        drop(first);
        assert!(pinned(&store));
        drop(second);
        assert!(!pinned(&store));
    }

    #[test]
    fn what_was_found_under_a_pin_goes_with_its_last_clone() {
        let (dir, store) = store();
        let layer = dir.path().join("layers/some");
        std::fs::create_dir_all(&layer).unwrap();
        let found = Found {
            manifest: Manifest {
                config: crate::image::descriptor::BlobRef {
                    media_type: String::new(),
                    digest: DIGEST.to_string(),
                    size: 1,
                },
                layers: Vec::new(),
            },
            config: oci_spec::image::ImageConfiguration::default(),
            layers: vec![layer.clone()],
        };
        let pin = store.pin(DIGEST, None).unwrap();
        pin.keep(found);
        assert!(store.pin(DIGEST, None).unwrap().found().is_some());
        // A layer directory lost meanwhile makes it count as not found.
        std::fs::remove_dir(&layer).unwrap();
        assert!(pin.found().is_none());
        std::fs::create_dir(&layer).unwrap();
        drop(pin);
        assert!(store.pin(DIGEST, None).unwrap().found().is_none());
    }
}
