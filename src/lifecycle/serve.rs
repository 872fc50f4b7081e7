//! Serve: a function image started as a gRPC server for as long as its
//! caller needs it (the `Docker` runtime of `xfn render`), instead of fed
//! once. It gets everything a run gets (rootfs, spec, seccomp, own network
//! namespace, cgroup limits where enforced); only its lifetime differs. It
//! is reached inside its own network namespace, never through a port on
//! the host. Its container may be created ahead ([`PreparedServer`]: `xfn
//! host` makes each function's next one so) and only started by its first
//! call; one made for another image or settings, or gone by then, is
//! replaced. Whatever happens, nothing outlives it: [`FunctionServer::stop`]
//! kills it and tears it down, and so does dropping it (or a prepared one).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::output::{Output, OutputLog};
use super::seam::Remains;
use super::teardown::{Finished, Teardown};
use super::{
    Container, Created, FunctionContainer, Origin, Recipe, RootfsMaker, RunError, Settings, Started,
};
use crate::sandbox::cgroup::run::{RunCgroup, RunUsage};
use crate::sandbox::crun::{try_reap, wait_exit};
use crate::sandbox::exit_watch::ExitWatch;
use crate::sandbox::netns::NetworkNamespace;
use crate::sandbox::{Limits, Sandbox, SandboxError};

/// A container serving: its output is logged, its tail kept for errors.
#[derive(Debug)]
pub(crate) struct Serving {
    output: Arc<Output>,
    network: NetworkNamespace,
    /// The init's exit code, once it was reaped.
    exit_code: Option<i32>,
}

impl Container<Started> {
    /// Leaves the function running as a server: its stdin is closed (a
    /// server reads none), its stdout and stderr go to xfn's log (see
    /// [`OutputLog`]) and to a tail kept for errors.
    pub(crate) async fn serve(
        self,
        host_network: bool,
        log_as: Option<&str>,
    ) -> Result<Container<Serving>, SandboxError> {
        let Self { state, mut parts } = self;
        let stdio = state.stdio;
        drop(stdio.stdin);
        let output = Arc::new(Output::default());
        let function: Option<Arc<str>> = log_as.map(Arc::from);
        for stream in [stdio.stdout, stdio.stderr] {
            // Read on this task's runtime (a serving thread's when a call
            // starts the server, `grpc::threads`), not the one that created
            // the container ahead: its lines wake no other.
            let stream = stream
                .into_nonblocking_fd()
                .map_err(|e| SandboxError::Crun(crate::sandbox::CrunError::Io(e)))?;
            let log = OutputLog::new(parts.bundle.id.clone(), function.clone());
            output.forward(stream, log);
        }
        let network = if host_network {
            Ok(NetworkNamespace::own())
        } else {
            u32::try_from(parts.init.pid)
                .map_err(std::io::Error::other)
                .and_then(NetworkNamespace::of_pid)
        };
        let network = match network {
            Ok(network) => network,
            Err(err) => {
                // Gone already (a server that fails at once): its exit says
                // more than ENOENT.
                if let Ok(Some(code)) = try_reap(&parts.init.pidfd) {
                    parts.init.reaped = true;
                    output.drained().await;
                    return Err(parts.failure(code, output.tail()));
                }
                return Err(SandboxError::Crun(crate::sandbox::CrunError::Io(err)));
            }
        };
        tracing::debug!(container = %parts.bundle.id, pid = parts.init.pid, "served container started");
        Ok(Container {
            state: Serving {
                output,
                network,
                exit_code: None,
            },
            parts,
        })
    }
}

impl Container<Serving> {
    /// The container's own network namespace, to connect in.
    pub(crate) fn network(&self) -> &NetworkNamespace {
        &self.state.network
    }

    /// The last bytes the container wrote (stdout and stderr, interleaved).
    pub(crate) fn output_tail(&self) -> Vec<u8> {
        self.state.output.tail()
    }

    /// A watch woken when the container's init exits.
    pub(crate) fn exit_watch(&self) -> std::io::Result<ExitWatch> {
        ExitWatch::new(std::os::fd::AsFd::as_fd(&self.parts.init.pidfd))
    }

    /// The exit code, once the container is gone (reaping it).
    fn exit_code(&mut self) -> Option<i32> {
        if self.state.exit_code.is_none() {
            if let Ok(Some(code)) = try_reap(&self.parts.init.pidfd) {
                self.parts.init.reaped = true;
                self.state.exit_code = Some(code);
            }
        }
        self.state.exit_code
    }

    /// Why the container is gone, if it is: its exit code (and an OOM kill
    /// where its cgroup saw one) with the tail of its output so far.
    pub(crate) fn exited(&mut self) -> Option<SandboxError> {
        let code = self.exit_code()?;
        Some(self.parts.failure(code, self.output_tail()))
    }

    /// [`Container::exited`] after the container's last output was read
    /// (the readers may lag behind its exit).
    async fn exit_error(&mut self) -> Option<SandboxError> {
        let code = self.exit_code()?;
        self.state.output.drained().await;
        Some(self.parts.failure(code, self.output_tail()))
    }

    /// Waits until something listens on `address` inside the container
    /// (connecting, as a client will), or fails when the container exits or
    /// `timeout` passes first.
    pub(crate) async fn wait_listening(
        &mut self,
        address: SocketAddr,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        let started = Instant::now();
        // Servers start in milliseconds (Go, Rust) to a second or two
        // (Python): poll every millisecond at first (a backoff from the
        // first poll on overshot a 5 ms start by 3 ms: benches/PROFILE.md),
        // then back off gently, so that a slow start is not overshot by
        // much. An attempt costs a thread and a refused connect:
        // microseconds.
        let mut pause = Duration::from_millis(1);
        loop {
            let last_error = match self.state.network.connect(address).await {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            if let Some(err) = self.exit_error().await {
                return Err(err);
            }
            if started.elapsed() >= timeout {
                return Err(crate::sandbox::NotServing {
                    address,
                    after: timeout,
                    output_tail: self.output_tail(),
                    source: last_error,
                }
                .into());
            }
            tokio::time::sleep(pause).await;
            if started.elapsed() >= EVERY_MILLISECOND_FOR {
                pause = (pause * 3 / 2).min(Duration::from_millis(20));
            }
        }
    }

    /// Kills the container and waits for it. Returns what its cgroup
    /// measured, where it had one, and what is left to remove (its state,
    /// cgroup and bundle: blocking, so off the async threads).
    pub(crate) async fn stop(self) -> (Option<RunUsage>, Finished) {
        let Self { mut parts, state } = self;
        // SIGKILL to the init ends its pid namespace, and with it every
        // process of the container.
        if !parts.init.reaped && parts.init.kill() {
            parts.init.reaped =
                tokio::time::timeout(Duration::from_secs(5), wait_exit(&parts.init.pidfd))
                    .await
                    .is_ok_and(|code| code.is_ok());
        }
        // Its last lines logged before a caller (a render, a drain) exits.
        state.output.drained().await;
        let usage = parts.run_cgroup.as_ref().map(RunCgroup::usage);
        (usage, parts.finish())
    }
}

/// How long a server's listening is looked for every millisecond before
/// the looks back off: a Go or Rust server listens within it.
const EVERY_MILLISECOND_FOR: Duration = Duration::from_millis(50);

/// A function image running as a server in its own network namespace.
/// Killed, and its rootfs removed, by [`FunctionServer::stop`] or on drop.
#[derive(Debug)]
pub struct FunctionServer(FunctionContainer<Serving>);

/// How a function image is served.
#[derive(Debug, Clone, Copy, Default)]
pub struct FunctionServerOptions<'a> {
    /// Replaces the image's `Cmd` (its entrypoint stays).
    pub cmd: &'a [String],
    /// Added to the image's environment (`KEY=VALUE`).
    pub env: &'a [String],
    /// Share xfn's network, for a function that needs egress; by default
    /// the server has an empty network namespace of its own and is reached
    /// inside it, never through the host's.
    pub host_network: bool,
    /// The function's name: its output is logged at INFO as
    /// `function=NAME`, rate-limited; without, at DEBUG (a render's
    /// servers).
    pub log_as: Option<&'a str>,
}

/// A function server's container created ahead of its first call
/// (rootfs, bundle, spec, cgroup, `crun create`): its init waits on
/// `exec.fifo` before it execs the server, so all a call still pays is the
/// server's exec and its own start ([`FunctionServer::start`] consumes it).
/// It costs the init's blocked process, the rootfs's mount and the held
/// namespaces until then (docs/host.md). Dropped, it is torn down (blocking:
/// prefer [`PreparedServer::discard`]).
#[derive(Debug)]
pub(crate) struct PreparedServer {
    created: FunctionContainer<Created>,
    /// The image's manifest digest it was made from: a start for another
    /// digest discards it.
    digest: String,
    /// The settings it was made with, a start with others discards it.
    host_network: bool,
    cmd: Vec<String>,
    env: Vec<String>,
}

impl PreparedServer {
    /// Its container's id.
    pub(crate) fn id(&self) -> &str {
        self.created.container.id()
    }

    /// Tears it down off the async threads, awaited.
    pub(crate) async fn discard(self) {
        Teardown::inline().drop_later(self).await;
    }

    /// Whether it was made for `digest` served as `options` say.
    fn fits(&self, digest: &str, options: &FunctionServerOptions<'_>) -> bool {
        self.digest == digest
            && self.host_network == options.host_network
            && self.cmd == options.cmd
            && self.env == options.env
    }
}

/// What a server's container is made from, ahead or on its start: the
/// runner's parts, the recipe of the image `digest` and how it is served.
pub(crate) struct ServerPlan<'a> {
    /// The runner's sandbox.
    pub(crate) sandbox: &'a Sandbox,
    /// The runner's rootfs maker.
    pub(crate) rootfs: &'a RootfsMaker,
    /// The runner's teardown.
    pub(crate) teardown: &'a Teardown,
    /// The image's recipe.
    pub(crate) recipe: Recipe,
    /// The image's manifest digest.
    pub(crate) digest: String,
    /// How it is served.
    pub(crate) options: FunctionServerOptions<'a>,
    /// Its limits.
    pub(crate) limits: Limits,
    /// Bounds the creation (and a start: the whole of it).
    pub(crate) timeout: Duration,
}

impl ServerPlan<'_> {
    /// The settings of its container.
    fn settings(&self) -> Settings<'_> {
        Settings {
            host_network: self.options.host_network,
            limits: self.limits,
            cmd: Some(self.options.cmd),
            env: self.options.env,
        }
    }
}

impl FunctionServer {
    /// Creates, within its timeout, the container of a server as `plan`
    /// says, ahead of its start; on failure nothing is left.
    pub(crate) async fn prepare(plan: ServerPlan<'_>) -> Result<PreparedServer, RunError> {
        let created = tokio::time::timeout(
            plan.timeout,
            FunctionContainer::create(
                plan.sandbox,
                plan.rootfs,
                &plan.recipe,
                plan.settings(),
                plan.teardown,
            ),
        )
        .await
        .map_err(|_| RunError::Timeout(plan.timeout))??;
        Ok(PreparedServer {
            created,
            host_network: plan.options.host_network,
            cmd: plan.options.cmd.to_vec(),
            env: plan.options.env.to_vec(),
            digest: plan.digest,
        })
    }

    /// Starts a server as `plan` says: `prepared`'s container when it was
    /// made for the same digest and options and is still there, else one
    /// created now (a `prepared` that does not fit is discarded); the whole
    /// within the plan's timeout; on failure nothing is left. Says whether
    /// it was prepared.
    pub(crate) async fn start(
        plan: ServerPlan<'_>,
        prepared: Option<PreparedServer>,
    ) -> Result<(Self, Origin), RunError> {
        let since = Instant::now();
        let prepared = match prepared {
            Some(prepared) if prepared.fits(&plan.digest, &plan.options) => Some(prepared.created),
            Some(stale) => {
                tracing::info!(container = stale.id(), made_for = %stale.digest, digest = %plan.digest, "the container created ahead was made for another image or settings: discarded");
                stale.discard().await;
                None
            }
            None => None,
        };
        let (started, origin) = tokio::time::timeout(
            plan.timeout,
            FunctionContainer::start_or_create(
                prepared,
                plan.sandbox,
                plan.rootfs,
                &plan.recipe,
                plan.settings(),
                plan.teardown,
            ),
        )
        .await
        .map_err(|_| RunError::Timeout(plan.timeout))??;
        let options = plan.options;
        let started_at = since.elapsed();
        let FunctionContainer {
            container,
            rootfs,
            pin,
        } = started;
        let container = container
            .serve(options.host_network, options.log_as)
            .await?;
        tracing::debug!(container = container.id(), ?origin, ?started_at, served_at = ?since.elapsed(), "function serving");
        Ok((
            Self(FunctionContainer {
                container,
                rootfs,
                pin,
            }),
            origin,
        ))
    }

    /// The container's own network namespace, to connect in.
    pub fn network(&self) -> &NetworkNamespace {
        self.0.container.network()
    }

    /// Waits until the server listens on `address` inside its namespace;
    /// fails with its exit code and output when it exits first.
    pub async fn wait_listening(
        &mut self,
        address: SocketAddr,
        timeout: Duration,
    ) -> Result<(), RunError> {
        Ok(self.0.container.wait_listening(address, timeout).await?)
    }

    /// A watch woken when the server exits (it reaps nothing: [`Self::exited`]
    /// then says why).
    pub(crate) fn exit_watch(&self) -> std::io::Result<ExitWatch> {
        self.0.container.exit_watch()
    }

    /// Why the server is gone, if it is (exit code, OOM kill, output tail).
    pub fn exited(&mut self) -> Option<RunError> {
        self.0.container.exited().map(RunError::from)
    }

    /// The last bytes the server wrote to stdout and stderr.
    pub fn output_tail(&self) -> Vec<u8> {
        self.0.container.output_tail()
    }

    /// Kills the server and removes its container, cgroup and rootfs.
    /// Returns what its cgroup measured, where it had one.
    pub async fn stop(self) -> Option<RunUsage> {
        let FunctionContainer {
            container,
            rootfs,
            pin,
        } = self.0;
        let (usage, finished) = container.stop().await;
        // Unmounting takes milliseconds: off the async threads, like every
        // teardown.
        let remains: Remains = (finished, rootfs, pin);
        Teardown::inline().drop_later(remains).await;
        usage
    }
}
