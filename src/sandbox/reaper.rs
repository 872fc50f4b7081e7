//! Reaping container inits: xfn is a child subreaper, so every container
//! init becomes its child once `crun create` exits (see `crate::lifecycle`).
//! Each container reaps its own init through a pidfd (it needs the exit
//! code); [`reap_orphans`] reaps the rest: inits of containers whose owner
//! went away, and what the kernel reparents to xfn when a container's pid
//! namespace ends.
use std::time::Duration;

use super::crun::CrunError;
use super::SandboxError;

/// Makes this process the reaper of its orphaned descendants, as created
/// containers' inits are once `crun create` exits. Idempotent.
pub(crate) fn become_subreaper() -> Result<(), SandboxError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| SandboxError::Crun(CrunError::Io(e.into())))
}

/// How long a zombie container init must have been seen before
/// [`reap_orphans`] reaps it.
const ORPHAN_SETTLE: Duration = Duration::from_secs(1);

/// Reaps container inits orphaned to this process (a child subreaper)
/// while `alive` says so: a sweep a second while children exit, none
/// while none does.
///
/// A sweep follows a SIGCHLD by `ORPHAN_SETTLE`, and the next follows it
/// while a zombie it saw waits to settle; otherwise the sweep waits for the
/// next SIGCHLD. Signals coalesce while it sleeps: a daemon under load gets
/// several per call (crun's processes, each container's init), and each
/// sweep reads every thread's children and every child's `stat` (16 % of
/// a loaded daemon's own CPU when it swept on each, benches/PROFILE.md),
/// so under load it still sweeps once a second, and an orphan is reaped
/// within two sweeps of its exit. Idle, it sweeps never: a sweep every
/// second was most of an idle daemon's CPU (benches/PROFILE.md).
pub(crate) async fn sweep(alive: impl Fn() -> bool) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut exited = match signal(SignalKind::child()) {
        Ok(exited) => Some(exited),
        Err(err) => {
            tracing::warn!(error = %err, "cannot wait for SIGCHLD: sweeping for orphans every second");
            None
        }
    };
    let mut seen = std::collections::HashMap::new();
    loop {
        if let (true, Some(exited)) = (seen.is_empty(), exited.as_mut()) {
            exited.recv().await;
        }
        tokio::time::sleep(ORPHAN_SETTLE).await;
        if !alive() {
            return;
        }
        reap_orphans(&mut seen, ORPHAN_SETTLE);
    }
}

/// Pids of containers' inits that their [`crate::lifecycle::Container`]
/// reaps itself (it needs their exit code): [`reap_orphans`] leaves them.
static CLAIMED: std::sync::Mutex<Option<std::collections::HashSet<i32>>> =
    std::sync::Mutex::new(None);

fn claimed() -> std::sync::MutexGuard<'static, Option<std::collections::HashSet<i32>>> {
    CLAIMED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reaps zombie children of this process that are containers' inits
/// nobody waits for, and returns how many it reaped.
///
/// As a child subreaper (or as PID 1, a sidecar's usual place) xfn inherits
/// the init of every container once `crun create` exits, and whatever
/// the kernel reparents to it when a container's pid namespace ends. Those are recognised by living in a pid namespace
/// below xfn's (`NSpid` in `/proc/<pid>/status` one level longer than
/// xfn's own): every process xfn spawns itself (crun, helpers) lives in
/// xfn's own pid namespace and is reaped by whoever spawned it (tokio, a
/// `waitpid`), so reaping those here would steal their exit status. Inits
/// are left to their [`crate::lifecycle::Container`] (claimed); a zombie
/// is reaped only once it was seen a second time, `settle` after the
/// first, so that an init whose creation has not yet claimed it is not
/// reaped under it.
fn reap_orphans(
    seen: &mut std::collections::HashMap<i32, std::time::Instant>,
    settle: Duration,
) -> usize {
    use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
    let own_depth = nspid_depth("self").unwrap_or(1);
    let mut zombies = std::collections::HashSet::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for task in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // `stat` first: the kernel renders it far more cheaply than
            // `status`, and under load most children are live crun
            // processes (this sweep read every child's `status` each second:
            // about 1.3 % of a loaded daemon's CPU, benches/PROFILE.md).
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if !is_zombie_stat(&stat) {
                continue;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if nspid_depth_of(&status) > own_depth {
                zombies.insert(pid);
            }
        }
    }
    seen.retain(|pid, _| zombies.contains(pid));
    let claimed = claimed();
    let mut reaped = 0;
    for pid in zombies {
        if claimed.as_ref().is_some_and(|c| c.contains(&pid)) {
            continue;
        }
        let first_seen = *seen.entry(pid).or_insert_with(std::time::Instant::now);
        if first_seen.elapsed() < settle {
            continue;
        }
        let Some(target) = Pid::from_raw(pid) else {
            continue;
        };
        if let Ok(Some(_)) = waitid(
            WaitId::Pid(target),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        ) {
            tracing::debug!(pid, "reaped an orphaned container init");
            reaped += 1;
        }
        seen.remove(&pid);
    }
    reaped
}

/// Whether a `/proc/<pid>/stat` line is a zombie's: the state follows the
/// command name, which is in parentheses and may hold any character.
fn is_zombie_stat(stat: &str) -> bool {
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// How many pid namespaces `/proc/<pid>` is seen in (`NSpid`'s length).
fn nspid_depth(pid: &str) -> Option<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(nspid_depth_of(&status))
}

fn nspid_depth_of(status: &str) -> usize {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map_or(0, |ids| ids.split_whitespace().count())
}

/// Marks `pid` as a container init its [`crate::lifecycle::Container`]
/// reaps itself: the orphan sweep leaves it.
pub(crate) fn claim(pid: i32) {
    claimed().get_or_insert_with(Default::default).insert(pid);
}

/// Gives `pid` back to the orphan sweep.
pub(crate) fn unclaim(pid: i32) {
    if let Some(claimed) = claimed().as_mut() {
        claimed.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{is_zombie_stat, sweep};
    use crate::support::reexec;

    /// A child of this process in a PID namespace below it, exited at once:
    /// a zombie nobody claims, as an orphaned container init is.
    fn an_exited_child_below() -> i32 {
        use nix::sched::{clone, CloneFlags};
        let mut stack = vec![0u8; 64 << 10];
        // SAFETY: without CLONE_VM the child has a copy of this process's
        // memory, and its callback only returns (no lock, no allocation),
        // after which it exits; SIGCHLD makes it an ordinary child.
        let pid = unsafe {
            clone(
                Box::new(|| 0),
                &mut stack,
                CloneFlags::CLONE_NEWPID,
                Some(libc::SIGCHLD),
            )
        }
        .expect("clone into a new PID namespace (as root)");
        pid.as_raw()
    }

    /// Alone in a process of its own (no other test's children), as root
    /// (a PID namespace): idle, the sweep never runs; a child below exits,
    /// and the sweep reaps it.
    #[test]
    fn an_idle_sweep_never_runs_and_an_orphan_below_is_reaped_after_it_exits() {
        if !reexec::in_mount_namespace_child() {
            assert!(
                rustix::process::geteuid().is_root(),
                "this test makes a PID namespace: run the tests as root"
            );
            let module = module_path!().split_once("::").map_or("", |(_, m)| m);
            return reexec::run_in_mount_namespace(&format!(
                "{module}::an_idle_sweep_never_runs_and_an_orphan_below_is_reaped_after_it_exits"
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let sweeps = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&sweeps);
            tokio::spawn(sweep(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                true
            }));
            // Once a second, before: three sweeps.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(sweeps.load(Ordering::SeqCst), 0, "an idle sweep ran");

            let orphan = an_exited_child_below();
            let proc = std::path::PathBuf::from(format!("/proc/{orphan}"));
            // A bound against never, not a timing check: it is reaped
            // within two sweeps.
            let started = Instant::now();
            while proc.exists() {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the orphan {orphan} was never reaped"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(sweeps.load(Ordering::SeqCst) >= 2, "seen, then reaped");
        });
    }

    #[test]
    fn a_zombie_is_told_by_the_state_after_the_last_parenthesis() {
        assert!(is_zombie_stat("4242 (crun) Z 1 4242 4242 0 -1"));
        assert!(!is_zombie_stat("4242 (crun) S 1 4242 4242 0 -1"));
        // A command name may hold ") Z" itself.
        assert!(!is_zombie_stat("4242 (a) Z (b) R 1 4242 4242 0 -1"));
        assert!(is_zombie_stat("4242 (a) R (b) Z 1 4242 4242 0 -1"));
        assert!(!is_zombie_stat(""));
    }
}
