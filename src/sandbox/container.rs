//! One container lifecycle, for every way xfn runs a function:
//!
//! ```text
//!  Sandbox::create ──► Container<Created> ──start──► Container<Started> ──feed──► (output, Finished)
//!  (prepare: bundle,   init blocked on             function running,       │        crun state, cgroup,
//!   spec, cgroup;      exec.fifo, stdio held       blocked on its stdin    │        bundle: dropped off
//!   crun create)       by xfn                                              │        the reply path
//!                                                                          └─serve──► Served (sandbox/function_server.rs)
//! ```
//!
//! Each front end composes the same steps (the runner does it for them):
//! - **one run** (a cold call, `xfn run`, a render step): create, start,
//!   feed, at once;
//! - **a warm container** (`runner/pool.rs`): create ahead of the call, and
//!   either start ahead too (a *pre-started* function, blocked reading its
//!   stdin when the call arrives) or on the call; then feed;
//! - **a served function** (render's Docker runtime): create, start, serve
//!   until stopped.
//!
//! # Choice: `crun create` and the fifo on every path
//! `crun create` sets the container up (namespaces, mounts, cgroup, seccomp,
//! the process itself) and leaves its init blocked on the state dir's
//! `exec.fifo` until a byte is written there; xfn writes that byte itself
//! ([`Crun::start`]), which is all `crun start` does, without a second crun
//! process. The container's stdin, stdout and stderr are pipes whose other
//! ends xfn holds from the start. So a container that runs at once costs
//! the same crun processes as `crun run` (one), and the cold, warm and
//! served paths are the same code: the cold path is the warm path with no
//! wait in between. (Measured in benches/PROFILE.md, fourth pass: the cold
//! path as `crun run` and as create + fifo, side by side.)
//!
//! `crun create` exits once the container exists, so the init is no child
//! of a crun process: it becomes xfn's, which is a child subreaper
//! ([`super::reaper::become_subreaper`]) to reap it and learn its exit
//! code, through a pidfd (which names the process for good, whatever its
//! pid becomes).
//!
//! # Invariants
//! - **One call per container.** [`Container::feed`] and
//!   [`Container::serve`] take the container by value: it runs at most once.
//! - **Nothing is left, whatever happens** (a run, an error, a timeout, a
//!   drop mid-way): the init is killed and reaped, crun's state, the
//!   cgroup and the bundle removed; by [`Finished`]'s drop after a feed, by
//!   [`Parts`]' drop before. Field order is drop order throughout.
//! - **A call's timeout starts at the call**: [`Container::feed`] and
//!   `Container::<Created>::run` bound what they wait for from the call's
//!   start, whenever the container was made or started.
//!
//! # Choice: xfn holds the container's namespaces until its teardown
//! When the last process of a mount namespace exits, the kernel tears the
//! namespace down inside that exit: it detaches every mount (waiting for
//! an expedited RCU grace period) and, through the exiting task's work
//! list, shuts their filesystems down (the rootfs overlay, `/tmp`, `/dev`,
//! `/proc`, the masked paths' binds), all before the task's own files are
//! released, so before the function's stdout reaches end of file and
//! before its exit can be reaped. Its IPC and network namespaces queue
//! kernel work at the same moment, on the CPUs the reply needs. A call
//! waited for all of that: about 250 µs a call, measured (benches/PROFILE.md,
//! sixth pass). So xfn opens the init's mount, IPC and network namespaces
//! (`/proc/<pid>/ns/…`: the init is its unreaped child, so the pid names
//! it) right after `crun create` and closes them in the teardown
//! ([`Finished`]'s drop, off the reply path). Nothing runs in them by
//! then (the init's exit ended its PID namespace, every process with it)
//! and nothing can enter them (only xfn holds them): each call still gets
//! fresh namespaces, and what the function sees does not change. Should
//! they not open (another `/proc`), the call only pays for the teardown
//! as before.
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use oci_spec::image::Config as ImageConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::bundle::Bundle;
use super::cgroup::run::RunCgroup;
use super::crun::{read_capped, read_tail, ContainerGuard, Crun, CrunError, CrunOutput};
use super::reaper::{claim, unclaim};
use super::{Limits, Sandbox, SandboxError};

/// What a container is made from: everything of a run but its input and
/// timeout, which come with the call.
#[derive(Debug, Clone)]
pub(crate) struct ContainerRequest<'a> {
    /// The prepared, per-container root filesystem; it must outlive the
    /// container.
    pub rootfs: &'a Path,
    /// The image config's `config` section.
    pub image: Option<&'a ImageConfig>,
    /// Share xfn's network (NetworkPolicy::Runner) instead of an empty
    /// network namespace of its own.
    pub host_network: bool,
    /// cpu and memory limits (pids: the sandbox's `pids_limit`).
    pub limits: Limits,
    /// Replaces the image's `Cmd` (its entrypoint stays): how a function
    /// image is started as a server. `None` runs the image as it is.
    pub cmd: Option<&'a [String]>,
    /// `KEY=VALUE`s added to the image's environment.
    pub env: &'a [String],
}

/// A container in state `S`: [`Created`], [`Started`] (or, once serving,
/// a [`super::function_server::Served`]).
#[derive(Debug)]
pub(crate) struct Container<S> {
    // The state first: its pipes close before the init is killed.
    pub(super) state: S,
    pub(super) parts: Parts,
}

/// Set up, its init blocked before it execs the function.
#[derive(Debug)]
pub(crate) struct Created {
    stdio: Stdio,
}

/// The function's process runs (blocked on its stdin until a call feeds
/// it), since `at`.
#[derive(Debug)]
pub(crate) struct Started {
    pub(super) stdio: Stdio,
    at: Instant,
}

/// xfn's ends of the container's stdin, stdout and stderr.
#[derive(Debug)]
pub(super) struct Stdio {
    pub(super) stdin: pipe::Sender,
    pub(super) stdout: pipe::Receiver,
    pub(super) stderr: pipe::Receiver,
}

/// What every state holds: the container's init and what is removed with
/// it. Dropped, it kills and reaps the init (`Init`), removes crun's state
/// (`ContainerGuard`), then the cgroup and the bundle.
#[derive(Debug)]
pub(super) struct Parts {
    pub(super) init: Init,
    pub(super) namespaces: HeldNamespaces,
    pub(super) guard: ContainerGuard,
    pub(super) run_cgroup: Option<RunCgroup>,
    pub(super) bundle: Bundle,
    pub(super) limits: Limits,
    pub(super) max_output_bytes: usize,
}

/// What is left of a container once it ran: its crun state, cgroup and
/// bundle, removed when dropped (blocking: drop it off the async threads).
#[derive(Debug)]
pub(crate) struct Finished {
    namespaces: HeldNamespaces,
    crun: Crun,
    id: String,
    run_cgroup: Option<RunCgroup>,
    _bundle: Bundle,
}

impl Drop for Finished {
    fn drop(&mut self) {
        // The namespaces first: their mounts go before the rootfs under
        // them is unmounted on xfn's side.
        drop(std::mem::take(&mut self.namespaces));
        self.crun.forget(&self.id);
        // Then the cgroup (it waits for killed processes to leave) and the
        // bundle, in field order.
        drop(self.run_cgroup.take());
    }
}

impl Parts {
    /// The init is reaped (or killed and reaped here): what is left is
    /// crun's state, the cgroup and the bundle, for the caller to drop off
    /// the reply path.
    pub(super) fn finish(self) -> Finished {
        let Self {
            init,
            namespaces,
            mut guard,
            run_cgroup,
            bundle,
            ..
        } = self;
        drop(init);
        guard.armed = false;
        Finished {
            namespaces,
            crun: guard.crun.clone(),
            id: guard.id.clone(),
            run_cgroup,
            _bundle: bundle,
        }
    }

    /// How a container that exited with `code` failed: past its memory
    /// limit where its cgroup saw the OOM killer act, else by its exit code;
    /// with the tail of its output.
    pub(super) fn failure(&self, code: i32, stderr_tail: Vec<u8>) -> SandboxError {
        let usage = self.run_cgroup.as_ref().map(RunCgroup::usage);
        super::failure(code, stderr_tail, usage.as_ref(), self.limits.memory_bytes)
    }
}

impl Sandbox {
    /// Prepares and creates a container (bundle, spec, cgroup, `crun
    /// create`), which waits for [`Container::start`]. The process must be
    /// a child subreaper (the sandbox makes it one).
    pub(crate) async fn create(
        &self,
        request: &ContainerRequest<'_>,
    ) -> Result<Container<Created>, SandboxError> {
        self.ready_for(&request.limits)?;
        let (bundle, run_cgroup) = self.prepare_bundle(&self.spec_input(request))?;
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
        // Where the spec's RLIMIT_NPROC bounds the run (no cgroup's
        // pids.max), crun makes the run's namespace in one of its own, so
        // that the limit counts this run alone (`nproc.rs`).
        let own_level = if run_cgroup.is_none() {
            Some(super::nproc::run_level(&self.own_ids)?)
        } else {
            None
        };
        let status = self
            .crun
            .create(
                &bundle.id,
                &bundle.dir,
                &pid_file,
                [stdin_read, stdout_write, stderr_write],
                own_level,
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
        // now, and a claimed pid is never reaped by the orphan sweep. Should
        // it be gone already, it is unclaimed and left to that sweep.
        let raw = pid.as_raw_nonzero().get();
        claim(raw);
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
        // Before the function execs: its user namespace gets its share of
        // the per-uid kernel counts (`ucounts.rs`).
        if let Err(err) = self.ucounts.bound_run(init.pidfd.as_fd()) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(%err, "cannot bound the inotify and fanotify counts of a run");
            });
        }
        Ok(Container {
            state: Created {
                stdio: Stdio {
                    stdin: pipe::Sender::from_owned_fd(stdin_write).map_err(io)?,
                    stdout: pipe::Receiver::from_owned_fd(stdout_read).map_err(io)?,
                    stderr,
                },
            },
            parts: Parts {
                namespaces: HeldNamespaces::of(init.pid),
                init,
                guard,
                run_cgroup,
                bundle,
                limits: request.limits,
                max_output_bytes: self.options.max_output_bytes,
            },
        })
    }
}

impl<S> Container<S> {
    /// The container id.
    pub(crate) fn id(&self) -> &str {
        &self.parts.guard.id
    }
}

impl Container<Created> {
    /// Starts the function: it execs and runs until it reads its stdin.
    /// Fails when the container is gone, handing back what is left to
    /// remove (off the async threads).
    pub(crate) async fn start(self) -> Result<Container<Started>, (SandboxError, Finished)> {
        let Self { state, parts } = self;
        if let Err(err) = parts.guard.crun.start(&parts.guard.id).await {
            return Err((err.into(), parts.finish()));
        }
        Ok(Container {
            state: Started {
                stdio: state.stdio,
                at: Instant::now(),
            },
            parts,
        })
    }

    /// Starts the container and feeds it, both within `timeout` counted
    /// from `since` (the call's start: a cold call's creation counts).
    pub(crate) async fn run(
        self,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        let budget = |since: Instant| timeout.saturating_sub(since.elapsed());
        let Self { state, parts } = self;
        let started =
            tokio::time::timeout(budget(since), parts.guard.crun.start(&parts.guard.id)).await;
        let started = match started {
            Ok(Ok(())) => Container {
                state: Started {
                    stdio: state.stdio,
                    at: Instant::now(),
                },
                parts,
            },
            Ok(Err(err)) => return (Err(err.into()), parts.finish()),
            Err(_) => {
                return (
                    Err(SandboxError::Crun(CrunError::Timeout(timeout))),
                    parts.finish(),
                )
            }
        };
        started.feed_within(input, budget(since), timeout).await
    }
}

impl Container<Started> {
    /// Writes `input` to the function's stdin, closes it, reads its output
    /// and waits for it to exit, all within `timeout` from now (output caps
    /// and OOM mapping as for every run). Returns the outcome and what is
    /// left to remove, which the caller drops off the reply path.
    pub(crate) async fn feed(
        self,
        input: &[u8],
        timeout: Duration,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        self.feed_within(input, timeout, timeout).await
    }

    /// [`Container::feed`] with `budget` left of a `timeout` (which errors
    /// name).
    async fn feed_within(
        self,
        input: &[u8],
        budget: Duration,
        timeout: Duration,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        let Self { state, mut parts } = self;
        let Stdio {
            stdin,
            stdout,
            stderr,
        } = state.stdio;
        let began = Instant::now();
        let running_before = began.saturating_duration_since(state.at);
        let cap = parts.max_output_bytes;
        let pidfd = &parts.init.pidfd;
        let outcome = async {
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
            let code = wait_exit(pidfd).await?;
            tracing::debug!(
                ?running_before,
                ?output_at,
                exited_at = ?began.elapsed(),
                "container feed phases (cumulative)"
            );
            Ok::<_, CrunError>((code, out, err))
        };
        let result = match tokio::time::timeout(budget, outcome).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(CrunError::Timeout(timeout)),
        };
        // Reaped by `wait_exit`; else killed and reaped here without
        // blocking an async thread (or, past 5 s, when `parts` finishes).
        parts.init.reaped = result.is_ok()
            || (parts.init.kill()
                && tokio::time::timeout(Duration::from_secs(5), wait_exit(&parts.init.pidfd))
                    .await
                    .is_ok_and(|code| code.is_ok()));
        let usage = parts.run_cgroup.as_ref().map(RunCgroup::usage);
        let result = match result {
            Ok((0, stdout, stderr_tail)) => Ok(CrunOutput {
                stdout,
                stderr_tail,
                usage,
            }),
            Ok((code, _, stderr_tail)) => Err(parts.failure(code, stderr_tail)),
            Err(err) => Err(err.into()),
        };
        super::log_usage(usage.as_ref(), &parts.limits, &result);
        (result, parts.finish())
    }
}

/// Waits for the process of `pidfd` (a child of this process) to exit,
/// reaps it and returns its exit code (128 + signal when killed by one).
pub(super) async fn wait_exit(pidfd: &OwnedFd) -> Result<i32, CrunError> {
    // A pidfd turns readable when its process exits.
    let owned = pidfd.as_fd().try_clone_to_owned()?;
    // SAFETY: `owned` is an open descriptor the AsyncFd takes ownership of:
    // it stays open, naming the same pidfd, until the AsyncFd drops it.
    let readable = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)
    }
    .map_err(|e| e.into_parts().1)?;
    loop {
        if let Some(code) = try_reap(pidfd)? {
            return Ok(code);
        }
        let mut ready = readable.readable().await?;
        ready.clear_ready();
    }
}

/// Reaps the process of `pidfd` if it has exited, returning its exit code.
pub(super) fn try_reap(pidfd: &OwnedFd) -> std::io::Result<Option<i32>> {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let status = waitid(
        WaitId::PidFd(pidfd.as_fd()),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    )?;
    Ok(status.map(|status| {
        status
            .exit_status()
            .or_else(|| status.terminating_signal().map(|s| 128 + s))
            .unwrap_or(-1)
    }))
}

/// The namespaces of a container whose exit would tear them down on a
/// call's path, held open until its teardown (see "Choice" above).
#[derive(Debug, Default)]
pub(super) struct HeldNamespaces {
    _fds: Vec<OwnedFd>,
}

impl HeldNamespaces {
    /// The namespaces held: those whose last process's exit does work the
    /// reply would wait for or share its CPUs with.
    const KINDS: [&'static str; 3] = ["mnt", "ipc", "net"];

    /// Opens the namespaces of the process `pid` (an unreaped child of
    /// this process, in this process's `/proc`); those that do not open
    /// are left to end with it.
    fn of(pid: i32) -> Self {
        let mut held = Vec::with_capacity(Self::KINDS.len());
        for kind in Self::KINDS {
            match std::fs::File::open(format!("/proc/{pid}/ns/{kind}")) {
                Ok(file) => held.push(OwnedFd::from(file)),
                Err(err) => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        tracing::warn!(%err, kind, "cannot hold a container's namespace: calls wait for its teardown");
                    });
                }
            }
        }
        Self { _fds: held }
    }
}

/// The container's init, through a pidfd. Unless it was reaped, it is
/// killed and reaped when dropped: it is this process's child, and would
/// stay a zombie.
#[derive(Debug)]
pub(super) struct Init {
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    pub(super) reaped: bool,
}

impl Init {
    /// SIGKILL: killing the init ends its pid namespace, every process of
    /// the container with it.
    pub(super) fn kill(&self) -> bool {
        rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL).is_ok()
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        if !self.reaped {
            use rustix::process::{waitid, WaitId, WaitIdOptions};
            self.kill();
            // Blocking, and short: a SIGKILLed process exits at once.
            let _ = waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED);
        }
        unclaim(self.pid);
    }
}
