//! Per-key locks: an async mutex for tasks of this process plus an flock
//! on `locks/<sha256 of key>.lock` for other processes sharing the cache.
//! Lock files are never removed (they are empty and few: one per image
//! reference, layer and flattened rootfs).
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest as _, Sha256};

use super::{io_err, ImageError};
use crate::image::error::join_err;

/// Holds a key's in-process mutex and its cross-process flock.
pub(crate) struct KeyGuard {
    _flock: Flock<File>,
    _local: tokio::sync::OwnedMutexGuard<()>,
}

/// The lock table of one store.
pub(super) struct KeyLocks {
    dir: PathBuf,
    /// In-process locks by key; weak so finished keys free themselves.
    map: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl KeyLocks {
    /// Locks whose files live in `dir`.
    pub(super) fn new(dir: PathBuf) -> Self {
        KeyLocks {
            dir,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Locks `key` in this process and across processes.
    pub(super) async fn lock(&self, key: &str) -> Result<KeyGuard, ImageError> {
        let local = {
            let mut locks = self
                .map
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            locks.retain(|_, weak| weak.strong_count() > 0);
            match locks.get(key).and_then(Weak::upgrade) {
                Some(mutex) => mutex,
                None => {
                    let mutex = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(key.to_string(), Arc::downgrade(&mutex));
                    mutex
                }
            }
        };
        let local = local.lock_owned().await;
        let path = self.dir.join(format!(
            "{}.lock",
            hex::encode(Sha256::digest(key.as_bytes()))
        ));
        let flock = tokio::task::spawn_blocking(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io_err(&path))?;
            Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| ImageError::Io {
                path: path.clone(),
                source: std::io::Error::from(errno),
            })
        })
        .await
        .map_err(join_err)??;
        Ok(KeyGuard {
            _flock: flock,
            _local: local,
        })
    }
}
