//! Who owns what in a cache dir: every xfn process that works there claims
//! an *instance id*, and names everything it makes with it (run bundles,
//! crun containers, rootfs dirs, run cgroups, temp files). The id is alive
//! exactly as long as its owner: the owner holds an exclusive `flock` on
//! `<cache>/instances/<id>`, which the kernel drops when the process dies,
//! however it dies.
//!
//! Why not the pid: in a pod, xfn is PID 1 in every incarnation of its
//! container, on the same cache volume, and processes sharing a cache from
//! different PID namespaces see each other's pids as unrelated numbers.
//! "The pid in the name is not mine and not alive" then keeps a dead
//! predecessor's state forever and hands out its names again. A lock dies
//! with its holder wherever the holder ran, and a random id never repeats.
//!
//! Invariants:
//! - an id's lock file appears under its final name already locked (it is
//!   locked under a temporary name, then linked into place), so an id is
//!   never seen unlocked while its owner lives;
//! - an id is dead when its lock file is missing or can be locked: whatever
//!   is named with it may be removed by anyone sweeping the cache;
//! - the owner creates nothing named with its id before it holds the lock.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::fcntl::{Flock, FlockArg};

/// The directory under the cache root holding one lock file per instance.
pub(crate) const INSTANCES_DIR: &str = "instances";

/// Errors of claiming an instance id.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstanceError {
    /// The instances directory or a lock file could not be made or locked.
    #[error("cannot claim an instance id under {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// This process's claim on a cache dir; the id dies with the process (or
/// when this is dropped).
#[derive(Debug)]
pub struct Instance {
    id: String,
    registry: Registry,
    _lock: Flock<File>,
}

impl Instance {
    /// The id this process names its work with in this cache.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether `id` belongs to a live xfn (this one included).
    pub fn is_live(&self, id: &str) -> bool {
        self.registry.is_live(id)
    }

    /// Whether `id` belongs to no live xfn: what it names may be removed.
    pub fn is_dead(&self, id: &str) -> bool {
        !self.is_live(id)
    }

    /// The name of this instance's `n`-th thing of a kind: `<id>-<n>`.
    pub fn name(&self, n: u64) -> String {
        format!("{}-{n}", self.id)
    }

    /// The name of a temp entry of this instance: `.<id>.<what>`. Writers
    /// of shared state (`<cache>/run/runtime-version`, the seccomp filter, …)
    /// write it under such a name, then rename it into place; a crash in
    /// between leaves it to [`Instance::is_dead_temp`].
    pub fn temp_name(&self, what: &str) -> String {
        format!(".{}.{what}", self.id)
    }

    /// Whether `name`, made by [`Instance::temp_name`] (possibly by another
    /// xfn), belongs to an instance that is gone. Names of another form
    /// are nobody's to remove: false.
    pub fn is_dead_temp(&self, name: &str) -> bool {
        name.strip_prefix('.')
            .and_then(|rest| rest.split_once('.'))
            .is_some_and(|(owner, _)| is_id(owner) && self.is_dead(owner))
    }

    /// Whether `name`, made by [`Instance::name`] (possibly by another
    /// xfn), belongs to an instance that is gone. Names of another form
    /// are nobody's to remove: false.
    pub fn is_dead_name(&self, name: &str) -> bool {
        match name.split_once('-') {
            Some((owner, _)) if !owner.is_empty() => self.is_dead(owner),
            _ => false,
        }
    }
}

/// The instance of this process in the cache at `root`, claimed on first
/// use and kept for the life of the process. Claiming also removes the
/// lock files of dead instances (their work is then dead by absence).
pub(crate) fn of_cache(root: &Path) -> Result<Arc<Instance>, InstanceError> {
    static CLAIMED: Mutex<Option<HashMap<PathBuf, Arc<Instance>>>> = Mutex::new(None);
    let key = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    let claimed = claimed.get_or_insert_with(HashMap::new);
    if let Some(instance) = claimed.get(&key) {
        return Ok(instance.clone());
    }
    let registry = Registry {
        dir: key.join(INSTANCES_DIR),
    };
    let instance = Arc::new(registry.claim()?);
    registry.forget_dead(instance.id());
    tracing::debug!(instance = instance.id(), cache = %key.display(), "instance id claimed");
    claimed.insert(key, instance.clone());
    Ok(instance)
}

/// Past this age a `.claiming-*` file is left over from a crash.
const HALF_CLAIM_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// `<cache>/instances`.
#[derive(Debug, Clone)]
struct Registry {
    dir: PathBuf,
}

impl Registry {
    fn lock_path(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// A fresh id, its lock file locked under a temporary name and then
    /// linked into place (refusing an id already taken).
    fn claim(&self) -> Result<Instance, InstanceError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| InstanceError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        loop {
            let id = random_id().map_err(io(&self.dir))?;
            let temp = self.dir.join(format!(".claiming-{id}"));
            let file = File::create(&temp).map_err(io(&temp))?;
            let lock =
                Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
                    InstanceError::Io {
                        path: temp.clone(),
                        source: errno.into(),
                    }
                })?;
            let linked = std::fs::hard_link(&temp, self.lock_path(&id));
            let _ = std::fs::remove_file(&temp);
            match linked {
                Ok(()) => {
                    return Ok(Instance {
                        id,
                        registry: self.clone(),
                        _lock: lock,
                    })
                }
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(io(&self.lock_path(&id))(err)),
            }
        }
    }

    /// Whether someone holds `id`'s lock.
    fn is_live(&self, id: &str) -> bool {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return false;
        }
        let Ok(file) = File::open(self.lock_path(id)) else {
            return false;
        };
        // Our own lock conflicts too: flock locks belong to open files, and
        // this is another one.
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_unlocked_on_drop) => false,
            Err((_, errno)) => errno == nix::errno::Errno::EWOULDBLOCK,
        }
    }

    /// Removes the lock files of dead instances, holding each one's lock
    /// while removing it, so a live one is never touched; and claims a
    /// crash left half-made (a claim takes microseconds: one older than
    /// [`HALF_CLAIM_AGE`] is no claim in progress).
    fn forget_dead(&self, own: &str) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == own {
                continue;
            }
            if name.starts_with('.') {
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > HALF_CLAIM_AGE);
                if old {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            let Ok(file) = File::open(entry.path()) else {
                continue;
            };
            if let Ok(locked) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                tracing::debug!(instance = %name, "forgetting a dead instance");
                let _ = std::fs::remove_file(entry.path());
                drop(locked);
            }
        }
    }
}

/// Whether `text` has the form of an id: 16 lower-case hex digits.
fn is_id(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 64 random bits as 16 hex digits.
fn random_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_live_while_held_and_dead_after() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry {
            dir: dir.path().join(INSTANCES_DIR),
        };
        let a = registry.claim().unwrap();
        let b = registry.claim().unwrap();
        assert_ne!(a.id(), b.id());
        assert!(a.is_live(a.id()), "its own id is live to itself");
        assert!(a.is_live(b.id()));
        let b_id = b.id().to_string();
        drop(b);
        assert!(a.is_dead(&b_id));
        assert!(a.is_dead("never-claimed"));
        assert!(a.is_dead("../escape"));
        assert!(a.is_dead_name(&format!("{b_id}-7")));
        assert!(!a.is_dead_name(&a.name(7)));
        assert!(!a.is_dead_name("no-owner-form".trim_start_matches("no")));
        assert!(!a.is_dead_name("plain"));
        assert_eq!(a.temp_name("probe"), format!(".{}.probe", a.id()));
        assert!(a.is_dead_temp(&format!(".{b_id}.probe")));
        assert!(!a.is_dead_temp(&a.temp_name("probe")));
        assert!(!a.is_dead_temp(".runtime-version.x"), "not an id");
        assert!(!a.is_dead_temp(&format!("{b_id}.probe")), "no dot first");
        // Forgetting removes the dead one's file and keeps the live one's.
        registry.forget_dead(a.id());
        assert!(!registry.lock_path(&b_id).exists());
        assert!(registry.lock_path(a.id()).exists());
        assert!(a.is_live(a.id()));
    }

    #[test]
    fn a_process_has_one_instance_per_cache() {
        let dir = tempfile::tempdir().unwrap();
        let first = of_cache(dir.path()).unwrap();
        let again = of_cache(dir.path()).unwrap();
        assert_eq!(first.id(), again.id());
        let other = tempfile::tempdir().unwrap();
        assert_ne!(of_cache(other.path()).unwrap().id(), first.id());
    }
}
