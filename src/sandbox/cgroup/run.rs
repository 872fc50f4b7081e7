//! One run's cgroup: `<delegated>/xfn-run-<id>`, made by xfn, with crun's
//! container cgroup below it (`…/xfn-run-<id>/container`).
//!
//! Why a level of xfn's own: `crun run` removes the container's cgroup when
//! the container exits, taking its counters with it. The parent xfn made
//! survives, and its `memory.events`, `cpu.stat` and `memory.peak` count the
//! whole subtree, so xfn reads what the run used after crun is done, then
//! kills whatever is left (`cgroup.kill`) and removes it, on every path.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Delegation;

/// Prefix of every run cgroup's name (stale ones are found by it).
pub(crate) const RUN_PREFIX: &str = "xfn-run-";

/// The leaf crun creates (and removes) for the container.
const CONTAINER_LEAF: &str = "container";

/// How long removal waits for killed processes to leave.
const REMOVE_PATIENCE: Duration = Duration::from_secs(5);

/// Errors of run cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file or directory could not be written.
    #[error("cannot set up the run cgroup {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What a run used, as its cgroup counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunUsage {
    /// CPU time, user and system (`cpu.stat` usage_usec).
    pub cpu_usec: u64,
    /// Peak memory (`memory.peak`, kernels 5.19+), when the kernel has it.
    pub memory_peak_bytes: Option<u64>,
    /// Processes the OOM killer killed (`memory.events` oom_kill).
    pub oom_kills: u64,
    /// Forks refused by the pids limit (`pids.events` max).
    pub pids_max_events: u64,
}

/// A run's cgroup; removed (processes killed first) when dropped.
#[derive(Debug)]
pub(crate) struct RunCgroup {
    dir: PathBuf,
    container_cgroup: String,
}

impl RunCgroup {
    /// Creates `<delegated>/xfn-run-<name>` with the run controllers enabled
    /// for crun's container cgroup below it.
    pub(crate) fn create(delegation: &Delegation, name: &str) -> Result<Self, CgroupError> {
        let leaf = format!("{RUN_PREFIX}{name}");
        let dir = delegation.dir.join(&leaf);
        std::fs::create_dir(&dir).map_err(|source| CgroupError::Io {
            path: dir.clone(),
            source,
        })?;
        let cgroup = Self {
            container_cgroup: container_cgroup_path(&delegation.cgroup, &leaf),
            dir,
        };
        let control = cgroup.dir.join("cgroup.subtree_control");
        let enable: Vec<String> = super::CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
        write_existing(&control, &enable.join(" ")).map_err(|source| CgroupError::Io {
            path: control,
            source,
        })?;
        Ok(cgroup)
    }

    /// `linux.cgroupsPath` for crun (cgroupfs manager).
    pub(crate) fn container_cgroup(&self) -> &str {
        &self.container_cgroup
    }

    /// What the run used so far (the counters are hierarchical).
    pub(crate) fn usage(&self) -> RunUsage {
        let file = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        RunUsage {
            cpu_usec: keyed(&file("cpu.stat"), "usage_usec").unwrap_or(0),
            memory_peak_bytes: file("memory.peak").trim().parse().ok(),
            oom_kills: keyed(&file("memory.events"), "oom_kill").unwrap_or(0),
            pids_max_events: keyed(&file("pids.events"), "max").unwrap_or(0),
        }
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        // Synchronous on purpose, like the container guard: nothing of the
        // run may outlive the call, even when its future is dropped.
        if let Err(err) = remove_tree(&self.dir) {
            tracing::warn!(cgroup = %self.dir.display(), %err, "cannot remove a run cgroup");
        }
    }
}

/// Removes run cgroups left by xfn processes that died, as told by
/// `is_stale(name without the prefix)`.
pub(crate) fn sweep_stale(delegation: &Delegation, is_stale: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(&delegation.dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix(RUN_PREFIX) else {
            continue;
        };
        if entry.path().is_dir() && is_stale(id) {
            tracing::info!(cgroup = %name, "removing a run cgroup left by an earlier xfn");
            if let Err(err) = remove_tree(&entry.path()) {
                tracing::warn!(cgroup = %name, %err, "cannot remove a stale run cgroup");
            }
        }
    }
}

/// Kills every process in the cgroup tree at `dir` and removes it, deepest
/// first. A cgroup can only be removed once empty, and killed processes take
/// a moment to leave, so each rmdir is retried for a while.
pub(crate) fn remove_tree(dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    // cgroup.kill (5.14+) kills the whole subtree at once; without it, fall
    // back to SIGKILL for each listed process.
    if write_existing(&dir.join("cgroup.kill"), "1").is_err() {
        kill_listed(dir);
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&entry.path())?;
            }
        }
    }
    let deadline = Instant::now() + REMOVE_PATIENCE;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(err) if Instant::now() >= deadline => return Err(err),
            Err(_) => {
                kill_listed(dir);
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Writes to a file that must exist, as every cgroup interface file does
/// (never creating one by mistake in a directory that is not a cgroup).
fn write_existing(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// crun's `linux.cgroupsPath` for the run cgroup `leaf` of a delegation.
fn container_cgroup_path(delegation: &str, leaf: &str) -> String {
    format!(
        "{}/{leaf}/{CONTAINER_LEAF}",
        delegation.trim_end_matches('/')
    )
}

fn kill_listed(dir: &Path) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The value of `key` in a flat-keyed cgroup file ("key value" lines).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some(key))
            .then(|| fields.next())
            .flatten()
            .and_then(|v| v.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_parse() {
        let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(1));
        assert_eq!(keyed(events, "max"), Some(12));
        assert_eq!(keyed(events, "oom"), Some(1));
        assert_eq!(keyed(events, "absent"), None);
    }

    #[test]
    fn a_plain_directory_tree_is_removed() {
        // Not a cgroup (no cgroup.kill): exercises the walk and the rmdir.
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("xfn-run-1-0");
        std::fs::create_dir_all(run.join("container")).unwrap();
        remove_tree(&run).unwrap();
        assert!(!run.exists());
        remove_tree(&run).unwrap();
    }

    #[test]
    fn container_cgroup_is_below_the_run_cgroup() {
        assert_eq!(
            container_cgroup_path("/user.slice/xfn", "xfn-run-7-3"),
            "/user.slice/xfn/xfn-run-7-3/container"
        );
        // Inside a private cgroup namespace xfn's cgroup is the root.
        assert_eq!(
            container_cgroup_path("/", "xfn-run-1-0"),
            "/xfn-run-1-0/container"
        );
    }

    #[test]
    fn a_directory_that_is_no_cgroup_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let delegation = Delegation {
            dir: dir.path().to_path_buf(),
            cgroup: "/x".into(),
        };
        assert!(RunCgroup::create(&delegation, "1-0").is_err());
    }
}
