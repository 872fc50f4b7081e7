//! Create: a rootfs, a bundle with its spec and cgroup, and `crun create`,
//! whose init then waits on the state dir's `exec.fifo` for its start.
//! xfn holds the container's stdio pipes from here on, and the init's mount,
//! IPC and network namespaces until the teardown, so that their kernel
//! teardown never runs on a call's path (docs/design.md, "Container
//! lifecycle"). A create that fails or is cancelled leaves nothing.
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

use super::seam::Sandboxing;
use super::teardown::{HeldNamespaces, Teardown};
use super::{Container, Created, FunctionContainer, Parts, Recipe, RunError, Settings, Stdio};
use crate::rootfs::{ResolvedMode, Rootfs, RootfsOptions};
use crate::sandbox::crun::{exit_code, ContainerGuard, CrunError};
use crate::sandbox::reaper::{claim, unclaim};
use crate::sandbox::{ContainerRequest, Sandbox, SandboxError};

/// Makes per-run root filesystems, each under
/// `<cache>/run/rootfs/<instance>-<n>` (swept with its instance).
#[derive(Debug)]
pub(crate) struct RootfsMaker {
    pub(crate) mode: ResolvedMode,
    pub(crate) options: RootfsOptions,
    pub(crate) dir: PathBuf,
    pub(crate) instance: Arc<crate::instance::Instance>,
    pub(crate) next: AtomicU64,
}

impl RootfsMaker {
    /// A fresh rootfs over `layers` (overlay) or a copy of `flattened`;
    /// unmounted and removed when dropped.
    pub(crate) async fn prepare(
        &self,
        layers: Vec<PathBuf>,
        flattened: Option<PathBuf>,
    ) -> Result<Rootfs, RunError> {
        let dir = self.dir.join(
            self.instance
                .name(self.next.fetch_add(1, Ordering::Relaxed)),
        );
        let mode = self.mode;
        let options = self.options.clone();
        // A copy can take a while: off the async threads. Should this future
        // be dropped meanwhile, the finished Rootfs is dropped, which cleans it.
        tokio::task::spawn_blocking(move || {
            Rootfs::prepare_with(mode, &layers, flattened.as_deref(), &dir, &options)
        })
        .await
        .map_err(RunError::RootfsPanicked)?
        .map_err(RunError::Rootfs)
    }
}

impl<B: Sandboxing> FunctionContainer<Created, B> {
    /// Prepares a rootfs and creates a container on it. On failure it
    /// cleans up after itself (the rootfs through `teardown`, awaited):
    /// no caller ever holds a half-made container.
    pub(crate) async fn create(
        sandbox: &B,
        rootfs: &B::RootfsMaker,
        recipe: &Recipe<B::Pin>,
        settings: Settings<'_>,
        teardown: &Teardown,
    ) -> Result<Self, RunError> {
        let since = std::time::Instant::now();
        let made = B::prepare(rootfs, recipe.layers.clone(), recipe.flattened.clone()).await?;
        let rootfs_took = since.elapsed();
        match sandbox.create(&made, recipe, settings).await {
            Ok(container) => {
                tracing::trace!(container = B::id(&container), rootfs = ?rootfs_took, created = ?since.elapsed(), "container created (cumulative)");
                Ok(Self {
                    container,
                    rootfs: made,
                    pin: recipe.pin.clone(),
                })
            }
            Err(err) => {
                teardown.drop_later(made).await;
                Err(err.into())
            }
        }
    }
}

impl Container<Created> {
    /// Prepares and creates a container (bundle, spec, cgroup, `crun
    /// create`), which waits for [`Container::start`]. The process must be
    /// a child subreaper (the sandbox makes it one).
    pub(crate) async fn create(
        sandbox: &Sandbox,
        request: &ContainerRequest<'_>,
    ) -> Result<Self, SandboxError> {
        let since = std::time::Instant::now();
        let (bundle, run_cgroup) = sandbox.prepare(request)?;
        let spec_took = since.elapsed();
        let io = |e: std::io::Error| SandboxError::Crun(CrunError::Io(e));
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let pipe = || nix::unistd::pipe2(cloexec).map_err(|e| io(e.into()));
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        // Armed before crun runs: a create that fails or is cancelled
        // halfway leaves nothing behind either.
        let guard = ContainerGuard {
            crun: sandbox.crun().clone(),
            id: bundle.id.clone(),
            armed: true,
        };
        let pid_file = bundle.dir.join("container.pid");
        // Where the spec's RLIMIT_NPROC bounds the run (no cgroup's
        // pids.max), crun makes the run's namespace in one of its own, so
        // that the limit counts this run alone (`nproc.rs`).
        let own_level = if run_cgroup.is_none() {
            Some(sandbox.run_level()?)
        } else {
            None
        };
        let status = sandbox
            .crun()
            .create(
                &bundle.id,
                &bundle.dir,
                &pid_file,
                [stdin_read, stdout_write, stderr_write],
                own_level,
            )
            .await?;
        tracing::trace!(container = %bundle.id, spec = ?spec_took, crun_create = ?since.elapsed().saturating_sub(spec_took), "bundle, spec and cgroup; crun create");
        let stderr = pipe::Receiver::from_owned_fd(stderr_read).map_err(io)?;
        if !status.success() {
            // crun said why on the stderr it shared with the container.
            let mut tail = Vec::new();
            let mut reader = stderr;
            let _ = tokio::time::timeout(Duration::from_millis(200), reader.read_to_end(&mut tail))
                .await;
            return Err(SandboxError::Crun(CrunError::Failed {
                code: exit_code(&status),
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
        if let Err(err) = sandbox.bound_counts(init.pidfd.as_fd()) {
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
                max_output_bytes: sandbox.max_output_bytes(),
            },
        })
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
