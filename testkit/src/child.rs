//! Child processes of tests: [`ChildGuard`] kills and reaps a child when the
//! test ends, however it ends, and waits for one with a bound
//! ([`output_within`]); [`measure`] runs one to completion and reports
//! what it cost: the peak resident memory (`VmHWM`) of the program it runs
//! and the bytes it wrote to files.
//!
//! Why not `wait4`'s `ru_maxrss` for the peak: exec records the *replaced*
//! memory's high-water mark too, and a child forked from a test process
//! starts as a copy of it (a test holding a 100 MB blob would "peak" at
//! 100 MB). `VmHWM` is of the program's own address space; it is sampled
//! every few milliseconds from /proc while `/proc/PID/exe` is that program
//! (never the forked copy of the test), and only rises, so the last sample
//! misses at most the final milliseconds. The bytes written are exact:
//! `wait4`'s `ru_oublock` (page-cache bytes dirtied, files deleted since
//! included; tmpfs does not count, so point caches at a disk).
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Kills (SIGKILL) and reaps the child when dropped, unless it was waited for.
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    /// Spawns `cmd` under a guard.
    pub fn spawn(cmd: &mut Command) -> ChildGuard {
        ChildGuard(Some(cmd.spawn().expect("spawn child")))
    }

    /// Spawns `cmd` under a guard with its stdio piped, writes `input` to
    /// its stdin and closes it (`xfn run IMAGE -` reads its input whole
    /// before it starts anything).
    pub fn spawn_with_input(cmd: &mut Command, input: &[u8]) -> ChildGuard {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn(cmd);
        let mut stdin = guard.child().stdin.take().expect("piped stdin");
        std::io::Write::write_all(&mut stdin, input).expect("write the child's stdin");
        guard
    }

    /// The child.
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("child already reaped")
    }

    /// Takes the child out: the caller reaps it.
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("child already reaped")
    }

    /// Waits for the child to end, at most `limit`, collecting what it
    /// writes to its piped stdout and stderr; kills it and panics, with
    /// what it wrote so far, past `limit`: a hang becomes a failure naming
    /// `what`, never a hung test.
    pub fn output_within(mut self, what: &str, limit: Duration) -> Output {
        let child = self.child();
        let out = child.stdout.take().map(read_in_background);
        let err = child.stderr.take().map(read_in_background);
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.0 = None;
        let collect = |reader: Option<std::thread::JoinHandle<Vec<u8>>>| {
            reader.map_or_else(Vec::new, |r| r.join().expect("pipe reader"))
        };
        let (stdout, stderr) = (collect(out), collect(err));
        let Some(status) = status else {
            panic!(
                "{what} did not end within {limit:?}; stdout: {}\nstderr: {}",
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            );
        };
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) to its end, for at
/// most `limit` (see [`ChildGuard::output_within`]).
pub fn output_within(cmd: &mut Command, what: &str, limit: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ChildGuard::spawn(cmd).output_within(what, limit)
}

fn read_in_background(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How long a server a test started gets to exit after SIGTERM before it
/// is SIGKILLed: xfn's drain removes its warm containers and run state at
/// once when no call is in flight, and a test that ends with calls running
/// should not wait out their timeouts.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends SIGTERM to `pid` (the child, or what stands for it, e.g. PID 1
/// under `unshare`) and waits up to [`STOP_GRACE`] for `child` to exit.
/// Whether it did (reaped then); if not, the caller kills what is left.
pub fn sigterm_and_wait(child: &mut Child, pid: u32) -> bool {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let started = std::time::Instant::now();
    while started.elapsed() < STOP_GRACE {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Stops a server a test started as its supervisor would: SIGTERM, up to
/// [`STOP_GRACE`], then SIGKILL; reaped. So a test's daemon removes what it
/// made instead of leaving it on the machine.
pub fn stop(child: &mut Child) {
    if !sigterm_and_wait(child, child.id()) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// `pid`'s descendants, each with its command line, children before their
/// own (from `/proc/PID/task/TID/children`).
pub fn descendants(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push((child, cmdline(child)));
                next.push(child);
            }
        }
    }
    found
}

/// The command line of `pid`, arguments joined by spaces (empty for a
/// zombie or a process gone).
pub fn cmdline(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim_end()
        .to_string()
}

/// Those of `processes` still running (not gone, not zombies), waiting up
/// to [`STOP_GRACE`] for them to go: empty when they all did.
pub fn still_running_after_grace(processes: &[(u32, String)]) -> Vec<(u32, String)> {
    let running = || {
        processes
            .iter()
            .filter(|(pid, _)| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                        .is_some_and(|state| state != "Z")
                })
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    let started = std::time::Instant::now();
    while started.elapsed() < STOP_GRACE && !running().is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    running()
}

/// A finished child and its cost.
#[derive(Debug)]
pub struct Measured {
    /// How it ended.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// Peak resident set size, bytes.
    pub peak_rss: u64,
    /// Bytes written to files (page-cache pages dirtied), bytes.
    pub written: u64,
}

impl Measured {
    /// Asserts the program failed with an error naming `cause`, short
    /// (hostile input is quoted cut, never whole), having peaked under
    /// `peak_max` bytes of memory; `case` names the case in a failure.
    pub fn assert_refused(&self, case: &str, cause: &str, peak_max: u64) {
        assert!(
            !self.status.success(),
            "{case}: must fail; stdout {}",
            self.stdout
        );
        assert!(
            self.stderr.contains(cause),
            "{case}: the error must name the cause {cause:?}: {}",
            self.stderr
        );
        assert!(
            self.stderr.len() < 2048,
            "{case}: the error quotes hostile input whole ({} bytes)",
            self.stderr.len()
        );
        assert!(
            self.peak_rss < peak_max,
            "{case}: peak memory {} MiB",
            self.peak_rss >> 20
        );
    }

    /// One line for a report: `peak 12.3 MiB, wrote 0.1 MiB`.
    pub fn cost(&self) -> String {
        format!(
            "peak {:.1} MiB, wrote {:.1} MiB",
            self.peak_rss as f64 / 1048576.0,
            self.written as f64 / 1048576.0
        )
    }
}

/// Runs `cmd` to the end (stdin closed, stdout and stderr captured) and
/// measures the program `program` it runs (itself, or what it execs, as
/// `setpriv` does).
pub fn measure(cmd: &mut Command, program: &std::path::Path) -> Measured {
    let program = std::fs::canonicalize(program).expect("program path");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(cmd);
    let child = guard.child();
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let pid = child.id() as libc::pid_t;
    let out_reader = read_in_background(out);
    let err_reader = read_in_background(err);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
                if exe.is_ok_and(|e| e == program) {
                    if let Some(hwm) = vm_hwm(pid) {
                        peak = peak.max(hwm);
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak
        })
    };
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our unreaped child; `status` and `usage` are valid
    // for writes for the duration of the call.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    // Reaped: the guard must not signal a pid that may be reused.
    std::mem::forget(guard.into_inner());
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak_rss = sampler.join().expect("sampler");
    Measured {
        status: ExitStatus::from_raw(status),
        stdout: String::from_utf8_lossy(&out_reader.join().expect("stdout reader")).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().expect("stderr reader")).into_owned(),
        peak_rss,
        written: usage.ru_oublock as u64 * 512,
    }
}

/// `VmHWM` of `pid` in bytes (None once its memory is gone).
fn vm_hwm(pid: libc::pid_t) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
