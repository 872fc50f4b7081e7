//! What `/proc` shows of the processes a test started or left: by command
//! line or root mount, their children, zombies, memory, open files and
//! mounts.
use std::path::Path;
use std::time::Duration;

/// The peak resident memory (`VmHWM`) of `pid`, in bytes: what an attack
/// cost a daemon is the growth of this across it.
pub fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib << 10
}

/// The pids of the processes whose command line (arguments joined by
/// spaces) passes `test`, as the host sees them: a test's view of what its
/// functions run, and of what they left.
pub fn processes_where(test: impl Fn(&str) -> bool) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            test(
                String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .trim_end(),
            )
            .then_some(pid)
        })
        .collect()
}

/// The pid of a process whose command line passes `test` (see
/// [`processes_where`]).
pub fn process_where(test: impl Fn(&str) -> bool) -> Option<u32> {
    processes_where(test).first().copied()
}

/// Pids of processes whose command line contains `needle` (to prove a run
/// left no process behind).
pub fn processes_with(needle: &str) -> Vec<u32> {
    processes_where(|cmdline| cmdline.contains(needle))
}

/// Pids of the container processes of the xfn on `cache`, whatever state
/// their container is in (created and blocked before the function's exec,
/// started, running a call): those whose root mount is an overlay of
/// `cache`'s layers (its mount options name them). Neither the daemon (its
/// root is the host's) nor another cache's containers match.
pub fn processes_rooted_under(cache: &Path) -> Vec<u32> {
    let cache = cache.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let mounts = std::fs::read_to_string(entry.path().join("mountinfo")).unwrap_or_default();
        // `id parent major:minor root mount-point options … - type source super`
        let rooted = mounts
            .lines()
            .any(|line| line.split_whitespace().nth(4) == Some("/") && line.contains(&cache));
        if rooted {
            pids.push(pid);
        }
    }
    pids
}

/// The mount points under `dir` in the mount namespace of `pid`
/// (`/proc/PID/mountinfo`, field 5).
pub fn mounts_under(pid: u32, dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount| Path::new(mount).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// Host pids of the zombies whose parent is in the PID namespace of `pid`
/// (a zombie has no command line, so [`processes_with`] does not see it,
/// and no namespaces of its own any more; its parent, alive, has).
pub fn zombies_in_pid_namespace_of(pid: u32) -> Vec<u32> {
    in_pid_namespace_of(pid, |p| match state_and_parent(p) {
        Some(('Z', parent)) => Some(parent),
        _ => None,
    })
}

/// Host pids of the live processes in the PID namespace of `pid`, `pid`
/// among them.
pub fn processes_in_pid_namespace_of(pid: u32) -> Vec<u32> {
    in_pid_namespace_of(pid, |p| (!is_zombie(p)).then_some(p))
}

/// How many tasks the PID namespace of `pid` holds, as the kernel counts
/// them against `RLIMIT_NPROC`: each thread of its live processes, and
/// each zombie not yet reaped ([`zombies_in_pid_namespace_of`]); a task
/// between its fork and its exec too, whatever its command line says yet.
pub fn tasks_in_pid_namespace_of(pid: u32) -> usize {
    let threads =
        |p: u32| std::fs::read_dir(format!("/proc/{p}/task")).map_or(0, |tasks| tasks.count());
    processes_in_pid_namespace_of(pid)
        .into_iter()
        .map(threads)
        .sum::<usize>()
        + zombies_in_pid_namespace_of(pid).len()
}

/// Host pids `p` for which `member(p)` names a process in the PID
/// namespace of `pid` (`p` itself, or its parent for a zombie).
fn in_pid_namespace_of(pid: u32, member: impl Fn(u32) -> Option<u32>) -> Vec<u32> {
    let namespace = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let target = namespace(pid).expect("the PID namespace");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|&p| member(p).and_then(namespace).as_ref() == Some(&target))
        .collect()
}

/// Host pids of the children of `pid` (of all its threads; zombies too).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if parent_of(p) == Some(pid) {
            children.push(p);
        }
    }
    children
}

/// Whether `pid` is a zombie.
pub fn is_zombie(pid: u32) -> bool {
    state_and_parent(pid).is_some_and(|(state, _)| state == 'Z')
}

/// How many file descriptors `pid` has open.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count()
}

/// A number field of `/proc/PID/status` (`Threads`, `VmRSS` in KiB, …).
pub fn status_field(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
}

/// Each thread of `pid`: its id, its name (`comm`) and how often it was
/// switched in so far (voluntary and involuntary context switches, from
/// `/proc/PID/task/TID/status`): what wakes which thread, counted.
pub fn thread_switches(pid: u32) -> Vec<(u32, String, u64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc/PID/task");
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(str::trim)
            };
            let switches = ["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"]
                .iter()
                .filter_map(|name| field(name)?.parse::<u64>().ok())
                .sum();
            Some((tid, field("Name")?.to_string(), switches))
        })
        .collect()
}

/// The parent (host pid) of `pid`, if it exists.
pub fn parent_of(pid: u32) -> Option<u32> {
    state_and_parent(pid).map(|(_, parent)| parent)
}

/// The state letter and the parent of `pid`, from `/proc/PID/stat`
/// (`pid (comm) S ppid ...`: the comm may hold anything, so after its last ')').
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Waits until the PID namespace of `pid` holds no zombie.
pub async fn wait_until_no_zombies(pid: u32) {
    for _ in 0..200 {
        if zombies_in_pid_namespace_of(pid).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "zombies {:?} are never reaped in the PID namespace of {pid}",
        zombies_in_pid_namespace_of(pid)
    );
}

/// Waits until no process has `needle` in its command line.
pub async fn wait_until_gone(needle: &str) {
    for _ in 0..200 {
        if processes_with(needle).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: Vec<String> = processes_with(needle)
        .into_iter()
        .map(|pid| format!("{pid}: {}", crate::child::cmdline(pid)))
        .collect();
    panic!(
        "processes with {needle:?} still running:\n{}",
        left.join("\n")
    );
}
