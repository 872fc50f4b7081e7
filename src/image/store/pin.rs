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
//! A pin names what it holds: a pull writes the manifest it resolved into
//! its pin file (an import too), so the collector knows every layer an
//! image needs before any of them, or its manifest, is in the store. The
//! store's manifest is published last, once the image is whole, so a pull
//! that fails leaves no manifest behind; its pin file goes with the next
//! collection.
//!
//! The *gate* (`locks/gc.gate`) orders pins against collections. Pinning
//! takes it shared, locks the pin and records its manifest; a collection
//! takes it exclusive while it decides and moves its victims aside
//! (milliseconds: the deleting happens after). So every pin a collection
//! sees is whole, and no image can be pinned between the collection's
//! look and its moves.
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};

use super::entries::parse_manifest;
use super::layout::{hex_of, GATE, PINS};
use super::{io_err, ImageError, Store};
use crate::image::descriptor::{sha256_digest, Manifest};

/// A hold on one image: while any clone lives, no collection removes it.
#[derive(Debug, Clone)]
pub struct ImagePin {
    _lock: Arc<Flock<File>>,
}

/// The gate, held shared or exclusive.
pub(super) struct Gate {
    _lock: Flock<File>,
}

impl Store {
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
        let path = self.root().join(PINS).join(hex_of(digest, digest)?);
        let _gate = self.gate(false)?;
        let lock = lock_file(&path, FlockArg::LockShared)?;
        if let Some(bytes) = manifest {
            record(&lock, digest, bytes).map_err(io_err(&path))?;
        }
        Ok(ImagePin {
            _lock: Arc::new(lock),
        })
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
            .then(|| parse_manifest(&bytes).ok())
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
