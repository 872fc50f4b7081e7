//! Containers created ahead of their call: everything of a run that does not
//! depend on the input (bundle, spec, namespaces, mounts, cgroup, seccomp
//! filter, the process itself, blocked before exec) done before the call
//! arrives, so that a call only starts the process and feeds it.
//!
//! # How
//! `crun create` sets the container up and leaves its init blocked on the
//! state dir's `exec.fifo` until `crun start` writes a byte to it. xfn gives
//! `crun create` pipes for stdio and keeps the other ends, so the
//! container's stdin, stdout and stderr are xfn's from the start. On the
//! call xfn writes that byte itself (what `crun start` does, without a
//! crun process: [`Crun::start`]), feeds the input and reads the output.
//!
//! `crun create` exits once the container exists, so the container's init is
//! no child of a crun process: it becomes xfn's, which must be a child
//! subreaper ([`become_subreaper`]) to reap it and learn its exit code,
//! through a pidfd (which names the process for good, whatever its pid
//! becomes).
//!
//! # Invariants
//! - A [`CreatedContainer`] runs at most once: [`CreatedContainer::run`]
//!   takes it by value.
//! - Whatever happens (run, error, timeout, drop), the container is killed,
//!   reaped, its crun state, cgroup and bundle removed: by
//!   [`Finished`]'s drop after a run, by the [`ContainerGuard`] before.
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use oci_spec::image::Config as ImageConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::bundle::Bundle;
use super::cgroup::run::RunCgroup;
use super::crun::{read_capped, read_tail, ContainerGuard, Crun, CrunError, CrunOutput, RunLimits};
use super::{Limits, Sandbox, SandboxError};

/// What a container is created from (a run's inputs, less the input and
/// timeout, which come with the call).
#[derive(Debug, Clone)]
pub struct CreateRequest<'a> {
    /// The prepared, per-container root filesystem.
    pub rootfs: &'a Path,
    /// The image config's `config` section.
    pub image: Option<&'a ImageConfig>,
    /// Share xfn's network (NetworkPolicy::Runner).
    pub host_network: bool,
    /// cpu and memory limits.
    pub limits: Limits,
}

/// A container set up and waiting for its call. Killed and removed when
/// dropped unused.
#[derive(Debug)]
pub struct CreatedContainer {
    // Field order is drop order: the init is killed and reaped, crun's
    // state deleted, then the cgroup and bundle go.
    init: Init,
    guard: ContainerGuard,
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    run_cgroup: Option<RunCgroup>,
    bundle: Bundle,
    memory_limit: Option<u64>,
    max_output_bytes: usize,
}

/// What is left of a container once it ran: its crun state, cgroup and
/// bundle, removed when dropped (blocking: drop it off the async threads).
#[derive(Debug)]
pub struct Finished {
    crun: Crun,
    id: String,
    run_cgroup: Option<RunCgroup>,
    _bundle: Bundle,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.crun.forget(&self.id);
        // Then the cgroup (it waits for killed processes to leave) and the
        // bundle, in field order.
        drop(self.run_cgroup.take());
    }
}

/// Makes this process the reaper of its orphaned descendants, as created
/// containers' inits are once `crun create` exits. Idempotent.
pub fn become_subreaper() -> Result<(), SandboxError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| SandboxError::Crun(CrunError::Io(e.into())))
}

/// Pids of created containers' inits, which their [`CreatedContainer`]
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
/// the init of any container whose crun process went away before it: a
/// cold run's init after `crun run` was killed, a created container's once
/// `crun create` exits. Those are recognised by living in a pid namespace
/// below xfn's (`NSpid` in `/proc/<pid>/status` one level longer than
/// xfn's own): every process xfn spawns itself (crun, helpers) lives in
/// xfn's own pid namespace and is reaped by whoever spawned it (tokio, a
/// `waitpid`), so reaping those here would steal their exit status. Inits
/// of created containers are left to their [`CreatedContainer`]; a zombie
/// is reaped only once it was seen a second time, `settle` after the
/// first, so that an init whose creation has not yet claimed it is not
/// reaped under it.
pub fn reap_orphans(
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

impl Sandbox {
    /// Creates a container that waits for [`CreatedContainer::run`]. The
    /// caller must be a child subreaper ([`become_subreaper`]).
    pub async fn create(
        &self,
        request: &CreateRequest<'_>,
    ) -> Result<CreatedContainer, SandboxError> {
        self.ready_for(&request.limits)?;
        // The spec a cold run of the same request gets (`Sandbox::run_spec`).
        let (bundle, run_cgroup) = self.prepare_bundle(&self.run_spec(
            request.rootfs,
            request.image,
            request.host_network,
            request.limits,
        ))?;
        let io = |e: std::io::Error| SandboxError::Crun(CrunError::Io(e));
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let pipe = || nix::unistd::pipe2(cloexec).map_err(|e| io(e.into()));
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        // Armed before crun runs: a create that fails or is cancelled
        // halfway leaves nothing behind either.
        let guard = ContainerGuard {
            crun: self.crun.clone(),
            id: bundle.id.clone(),
            armed: true,
        };
        let pid_file = bundle.dir.join("container.pid");
        let status = self
            .crun
            .create(
                &bundle.id,
                &bundle.dir,
                &pid_file,
                [stdin_read, stdout_write, stderr_write],
            )
            .await?;
        let stderr = pipe::Receiver::from_owned_fd(stderr_read).map_err(io)?;
        if !status.success() {
            // crun said why on the stderr it shared with the container.
            let mut tail = Vec::new();
            let mut reader = stderr;
            let _ = tokio::time::timeout(Duration::from_millis(200), reader.read_to_end(&mut tail))
                .await;
            return Err(SandboxError::Crun(CrunError::Failed {
                code: super::crun::exit_code(&status),
                stderr_tail: tail,
            }));
        }
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| io(std::io::Error::other("crun create wrote no container pid")))?;
        // Claimed before anything else: the init is this process's child
        // now, and a claimed pid is never reaped by `reap_orphans`. Should
        // it be gone already, it is unclaimed and left to that sweep.
        let raw = pid.as_raw_nonzero().get();
        claimed().get_or_insert_with(Default::default).insert(raw);
        let init = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(pidfd) => Init {
                pid: raw,
                pidfd,
                reaped: false,
            },
            Err(err) => {
                unclaim(raw);
                return Err(io(std::io::Error::other(format!(
                    "the container is gone before it was started ({err})"
                ))));
            }
        };
        Ok(CreatedContainer {
            init,
            guard,
            stdin: pipe::Sender::from_owned_fd(stdin_write).map_err(io)?,
            stdout: pipe::Receiver::from_owned_fd(stdout_read).map_err(io)?,
            stderr,
            run_cgroup,
            bundle,
            memory_limit: request.limits.memory_bytes,
            max_output_bytes: self.options.max_output_bytes,
        })
    }
}

impl CreatedContainer {
    /// The container id.
    pub fn id(&self) -> &str {
        &self.guard.id
    }

    /// Starts the container with `input` on stdin and waits for it, as a
    /// run does (output caps, `timeout` from now, OOM mapping). Returns the
    /// outcome and what is left to remove, which the caller drops off the
    /// reply path.
    pub async fn run(
        self,
        input: &[u8],
        timeout: Duration,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        let Self {
            mut init,
            mut guard,
            stdin,
            stdout,
            stderr,
            run_cgroup,
            bundle,
            memory_limit,
            max_output_bytes,
        } = self;
        let limits = RunLimits {
            timeout,
            max_output_bytes,
        };
        let began = std::time::Instant::now();
        let outcome = async {
            guard.crun.start(&guard.id).await?;
            let started_at = began.elapsed();
            let cap = limits.max_output_bytes;
            let writer = async move {
                let mut stdin = stdin;
                // A function may exit without reading its input: a broken
                // pipe is not an error of the run. Dropping stdin closes it.
                let _ = stdin.write_all(input).await;
                Ok::<(), CrunError>(())
            };
            let (_, out, err) = tokio::try_join!(
                writer,
                read_capped(Some(stdout), cap, "stdout"),
                read_tail(Some(stderr), cap, "stderr"),
            )?;
            let output_at = began.elapsed();
            let code = wait_exit(&init.pidfd).await?;
            // Where a warm call's time goes (benches/PROFILE.md): the start,
            // the function's run until its output ends, its exit (the
            // kernel tearing its namespaces down before the exit status).
            tracing::debug!(
                container = %guard.id,
                ?started_at,
                ?output_at,
                exited_at = ?began.elapsed(),
                "warm container phases (cumulative)"
            );
            Ok::<_, CrunError>((code, out, err))
        };
        let result = match tokio::time::timeout(limits.timeout, outcome).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(CrunError::Timeout(limits.timeout)),
        };
        if result.is_err() {
            // Killing the init ends its pid namespace, every process in it.
            let _ = rustix::process::pidfd_send_signal(&init.pidfd, rustix::process::Signal::KILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), wait_exit(&init.pidfd)).await;
        }
        // Reaped by now, or reaped when `init` drops below.
        init.reaped = result.is_ok();
        drop(init);
        // Reaped (or killed and being reaped): crun's state is all that is
        // left of the container, which `Finished` removes.
        guard.armed = false;
        let usage = run_cgroup.as_ref().map(RunCgroup::usage);
        let finished = Finished {
            crun: guard.crun.clone(),
            id: guard.id.clone(),
            run_cgroup,
            _bundle: bundle,
        };
        let result = match result {
            Ok((0, stdout, stderr_tail)) => Ok(CrunOutput {
                stdout,
                stderr_tail,
                usage,
            }),
            Ok((code, _, stderr_tail)) => Err(super::failure(
                code,
                stderr_tail,
                usage.as_ref(),
                memory_limit,
            )),
            Err(err) => Err(err.into()),
        };
        (result, finished)
    }
}

/// Waits for the process of `pidfd` (a child of this process) to exit,
/// reaps it and returns its exit code (128 + signal when killed by one).
async fn wait_exit(pidfd: &OwnedFd) -> Result<i32, CrunError> {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    // A pidfd turns readable when its process exits.
    let owned = pidfd.as_fd().try_clone_to_owned()?;
    // SAFETY: `owned` is an open descriptor the AsyncFd takes ownership of:
    // it stays open, naming the same pidfd, until the AsyncFd drops it.
    let readable = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)
    }
    .map_err(|e| e.into_parts().1)?;
    loop {
        let status = waitid(
            WaitId::PidFd(pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        )
        .map_err(std::io::Error::from)?;
        if let Some(status) = status {
            return Ok(status
                .exit_status()
                .or_else(|| status.terminating_signal().map(|s| 128 + s))
                .unwrap_or(-1));
        }
        let mut ready = readable.readable().await?;
        ready.clear_ready();
    }
}

/// The container's init, through a pidfd. Unless it was reaped, it is
/// killed and reaped when dropped: it is this process's child, and would
/// stay a zombie.
#[derive(Debug)]
struct Init {
    pid: i32,
    pidfd: OwnedFd,
    reaped: bool,
}

impl Drop for Init {
    fn drop(&mut self) {
        if !self.reaped {
            use rustix::process::{waitid, WaitId, WaitIdOptions};
            let _ = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
            // Blocking, and short: a SIGKILLed process exits at once.
            let _ = waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED);
        }
        unclaim(self.pid);
    }
}

fn unclaim(pid: i32) {
    if let Some(claimed) = claimed().as_mut() {
        claimed.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::is_zombie_stat;

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
