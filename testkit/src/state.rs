//! The state an xfn keeps in its cache dir: per-run dirs, a server's run
//! state in memory, instance locks; what a test checks is gone.
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proc::mounts_under;
use crate::{dir_owned_by, NONROOT};

/// A cache dir owned by the daemons' unprivileged user, in `dir`.
pub fn nonroot_cache(dir: &tempfile::TempDir) -> PathBuf {
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    cache
}

/// Every entry of the per-run state dirs and the temp dir of `cache`, and
/// the dot-named temp entries of `run/` itself (start-up probes), on the
/// disk: what a one-shot xfn's runs keep, and what any xfn leaves behind
/// (a server's own run state is in memory: [`live_run_state`]).
pub fn run_state(cache: &Path) -> Vec<String> {
    let mut entries = Vec::new();
    for dir in ["run/bundles", "run/rootfs", "run/crun", "tmp", "run"] {
        if let Ok(list) = std::fs::read_dir(cache.join(dir)) {
            for entry in list.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if dir != "run" || name.starts_with('.') {
                    entries.push(format!("{dir}/{name}"));
                }
            }
        }
    }
    entries.sort();
    entries
}

/// Every entry of the run state a server keeps in memory (`<cache>/run/live`,
/// a tmpfs in its mount namespace: src/sandbox/bundle.rs), read through
/// `/proc/<xfn>/root`, as `run/live/<dir>/<name>`. Panics unless that tmpfs
/// is mounted there: a server whose containers end with it keeps its state
/// in memory, and the empty dir under it on the disk would make every check
/// of this list pass.
pub fn live_run_state(xfn: u32, cache: &Path) -> Vec<String> {
    let live = cache.join("run/live");
    assert!(
        mounts_under(xfn, &live).contains(&live.display().to_string()),
        "no tmpfs on {} in xfn's mount namespace",
        live.display()
    );
    let root = Path::new("/proc")
        .join(xfn.to_string())
        .join("root")
        .join(live.strip_prefix("/").expect("an absolute cache dir"));
    let mut entries = Vec::new();
    for dir in ["bundles", "rootfs", "crun"] {
        let list = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{}: {e}", root.join(dir).display()));
        for entry in list.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            entries.push(format!("run/live/{dir}/{name}"));
        }
    }
    entries.sort();
    entries
}

/// Waits until the xfn instance `id` of `cache` is dead: its lock on
/// `instances/<id>` is free. The kernel drops that lock when the last
/// process holding its file goes, which, after a SIGKILL, is when the killed
/// PID namespace's teardown ends: under load, a while after the daemon's
/// own exit. A daemon started before then rightly leaves the instance's
/// state alone (it is alive); tests of the sweep start the next one after.
pub async fn wait_until_instance_dead(cache: &Path, id: &str) {
    use std::os::fd::AsRawFd;
    let path = cache.join("instances").join(id);
    for _ in 0..600 {
        let Ok(file) = std::fs::File::open(&path) else {
            return; // removed: dead
        };
        // SAFETY: flock(2) on a descriptor `file` owns for the call.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked == 0 {
            return; // free: dead (the lock goes with `file`)
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "instance {id} of {} still holds its lock after 30 s",
        cache.display()
    );
}

/// The instance ids holding (or having held) `cache`.
pub fn instances(cache: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(cache.join("instances"))
        .map(|list| {
            list.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}
