//! Containers that keep running: a function image started as a gRPC server
//! for as long as its caller needs it (the `Docker` runtime of `xfn
//! render`), instead of one run per input.
//!
//! The container gets everything a run gets (rootfs, spec, seccomp, own
//! network namespace, cgroup limits where enforced); only its lifetime
//! differs. It is reached through [`ServedContainer::network`], never through
//! a port on the host. Whatever happens, nothing outlives the
//! [`ServedContainer`]: [`ServedContainer::stop`] kills it and removes its
//! state, and so does dropping it.
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oci_spec::image::Config as ImageConfig;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::bundle::Bundle;
use super::cgroup::run::{RunCgroup, RunUsage};
use super::crun::{exit_code, ContainerGuard, CrunError, STDERR_TAIL_BYTES};
use super::netns::NetworkNamespace;
use super::{spec, Limits, Sandbox, SandboxError};

/// What a served container is started from.
#[derive(Debug, Clone)]
pub struct ServeRequest<'a> {
    /// The prepared root filesystem, which must outlive the container.
    pub rootfs: &'a Path,
    /// The image config's `config` section.
    pub image: Option<&'a ImageConfig>,
    /// Replaces the image's `Cmd` (the entrypoint stays).
    pub cmd: &'a [String],
    /// Added to the image's environment.
    pub env: &'a [String],
    /// Share xfn's network (egress) instead of an empty namespace of its own.
    pub host_network: bool,
    /// cpu and memory limits.
    pub limits: Limits,
    /// Give up when the container has not started within this long.
    pub startup_timeout: Duration,
}

/// A running container. Killed and removed by [`ServedContainer::stop`], or
/// when dropped.
#[derive(Debug)]
pub struct ServedContainer {
    process: Process,
    network: NetworkNamespace,
}

/// The container's process and everything that must go with it.
#[derive(Debug)]
struct Process {
    // Field order is drop order: the container is killed (synchronously)
    // before its cgroup and bundle are removed.
    guard: ContainerGuard,
    child: tokio::process::Child,
    run_cgroup: Option<RunCgroup>,
    bundle: Bundle,
    output: Arc<Output>,
    memory_limit: Option<u64>,
    /// The container's init, to kill without a round trip through crun.
    init: Option<std::os::fd::OwnedFd>,
}

impl Sandbox {
    /// Starts a container that keeps running, and returns once its process
    /// exists (not once it serves: see [`ServedContainer::wait_listening`]).
    pub async fn serve(&self, request: &ServeRequest<'_>) -> Result<ServedContainer, SandboxError> {
        self.ready_for(&request.limits)?;
        // A one-shot run's spec, with the server's command and environment.
        let (bundle, run_cgroup) = self.prepare_bundle(&spec::SpecInput {
            cmd: Some(request.cmd),
            env: request.env,
            ..self.run_spec(
                request.rootfs,
                request.image,
                request.host_network,
                request.limits,
            )
        })?;
        let pid_file = bundle.dir.join("container.pid");
        // No stdin: a server reads none; its output is logged.
        let mut child =
            self.crun
                .spawn_run(&bundle.id, &bundle.dir, Some(&pid_file), Stdio::null())?;
        let output = Arc::new(Output::default());
        for stream in [
            child.stdout.take().map(boxed),
            child.stderr.take().map(boxed),
        ]
        .into_iter()
        .flatten()
        {
            output.open_streams.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(forward_output(
                stream,
                bundle.id.clone(),
                Arc::clone(&output),
            ));
        }
        // From here on, an early return drops `process`, which kills the
        // container and removes what it had.
        let mut process = Process {
            guard: ContainerGuard {
                crun: self.crun.clone(),
                id: bundle.id.clone(),
                armed: true,
            },
            child,
            run_cgroup,
            bundle,
            output,
            memory_limit: request.limits.memory_bytes,
            init: None,
        };
        let pid = process
            .wait_for_pid(&pid_file, request.startup_timeout)
            .await?;
        // A pidfd names this process for good, even once its pid is reused.
        process.init = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .and_then(|pid| {
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
            });
        let network = match if request.host_network {
            Ok(NetworkNamespace::own())
        } else {
            NetworkNamespace::of_pid(pid)
        } {
            Ok(network) => network,
            Err(err) => {
                // Gone already (a server that fails at once): crun returns
                // in a moment, and its exit says more than ENOENT.
                let _ = tokio::time::timeout(Duration::from_secs(5), process.child.wait()).await;
                return Err(process
                    .exit_error()
                    .await
                    .unwrap_or(SandboxError::Crun(CrunError::Io(err))));
            }
        };
        tracing::debug!(container = %process.bundle.id, pid, "served container started");
        Ok(ServedContainer { process, network })
    }

    /// Warns, once per process, when limits were asked for but are not
    /// enforced here.
    pub(super) fn warn_unenforced(&self, limits: &Limits) {
        if let (Some(why), true) = (&self.limits_unavailable, *limits != Limits::default()) {
            // Once per process, not per run: a daemon must not flood its log.
            super::LIMITS_WARNING.call_once(|| {
                tracing::warn!("cpu and memory limits are NOT enforced: {why}");
            });
        }
    }
}

impl ServedContainer {
    /// The container id.
    pub fn id(&self) -> &str {
        &self.process.bundle.id
    }

    /// The container's own network namespace, to connect in.
    pub fn network(&self) -> &NetworkNamespace {
        &self.network
    }

    /// The last bytes the container wrote (stdout and stderr, interleaved).
    pub fn output_tail(&self) -> Vec<u8> {
        self.process.output.tail()
    }

    /// Why the container is gone, if it is: its exit code (and an OOM kill
    /// where its cgroup saw one) with the tail of its output so far.
    pub fn exited(&mut self) -> Option<SandboxError> {
        let code = self.process.exit_code()?;
        Some(self.process.error_for(code))
    }

    /// Waits until something listens on `address` inside the container
    /// (connecting, as a client will), or fails when the container exits or
    /// `timeout` passes first.
    pub async fn wait_listening(
        &mut self,
        address: SocketAddr,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        let started = Instant::now();
        // Servers start in milliseconds (Go, Rust) to a second or two
        // (Python): poll often at first, then back off gently, so that a
        // slow start is not overshot by much. An attempt costs a thread and
        // a refused connect: microseconds.
        let mut pause = Duration::from_millis(1);
        loop {
            let last_error = match self.network.connect(address).await {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            if let Some(err) = self.process.exit_error().await {
                return Err(err);
            }
            if started.elapsed() >= timeout {
                return Err(SandboxError::NotServing {
                    address,
                    after: timeout,
                    last_error: last_error.to_string(),
                    output_tail: self.output_tail(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 3 / 2).min(Duration::from_millis(20));
        }
    }

    /// Kills the container, waits for it and removes its state and cgroup.
    /// Returns what its cgroup measured, where it had one.
    pub async fn stop(self) -> Option<RunUsage> {
        let mut process = self.process;
        // SIGKILL to the container's init ends its pid namespace, and with
        // it every process of the container; `crun run` then sees it exit and
        // deletes the container itself. That saves the two crun processes
        // (kill, delete) of the general path, which remains the fallback.
        let killed = process.init.as_ref().is_some_and(|init| {
            rustix::process::pidfd_send_signal(init, rustix::process::Signal::KILL).is_ok()
        });
        let exited = killed
            && tokio::time::timeout(Duration::from_secs(5), process.child.wait())
                .await
                .is_ok_and(|status| status.is_ok());
        if !exited {
            let crun = process.guard.crun.clone();
            crun.kill(&process.guard.id, &mut process.child).await;
        }
        process.guard.armed = false;
        let usage = process.run_cgroup.as_ref().map(RunCgroup::usage);
        // Removing the cgroup waits for killed processes to leave; removing
        // the bundle is file I/O: both off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(process)).await;
        usage
    }
}

impl Process {
    /// The exit code, once the container is gone.
    fn exit_code(&mut self) -> Option<i32> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(exit_code(&status))
    }

    /// Why a container that exited with `code` is gone: an OOM kill where
    /// its cgroup saw one, else its exit code; with the tail of its output.
    fn error_for(&self, code: i32) -> SandboxError {
        let usage = self.run_cgroup.as_ref().map(RunCgroup::usage);
        super::failure(code, self.output.tail(), usage.as_ref(), self.memory_limit)
    }

    /// [`Process::error_for`] once the container is gone, after its last
    /// output was read (the readers may lag behind its exit).
    async fn exit_error(&mut self) -> Option<SandboxError> {
        let code = self.exit_code()?;
        let started = Instant::now();
        while self.output.open_streams.load(Ordering::SeqCst) > 0
            && started.elapsed() < Duration::from_millis(500)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Some(self.error_for(code))
    }

    /// Waits for crun to write the container's pid.
    async fn wait_for_pid(
        &mut self,
        pid_file: &Path,
        timeout: Duration,
    ) -> Result<u32, SandboxError> {
        let started = Instant::now();
        loop {
            // crun writes the file once the container process exists; a
            // partial write does not parse and is read again.
            if let Some(pid) = std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|text| text.trim().parse::<u32>().ok())
            {
                return Ok(pid);
            }
            if let Some(err) = self.exit_error().await {
                return Err(err);
            }
            if started.elapsed() >= timeout {
                return Err(SandboxError::Crun(CrunError::Timeout(timeout)));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// What the container wrote: the last [`STDERR_TAIL_BYTES`] of it, and how
/// many of its streams are still open.
#[derive(Debug, Default)]
struct Output {
    tail: Mutex<Tail>,
    open_streams: AtomicUsize,
}

impl Output {
    fn tail(&self) -> Vec<u8> {
        self.tail
            .lock()
            .map(|t| t.bytes.clone())
            .unwrap_or_default()
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a container's output.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
        if self.bytes.len() > STDERR_TAIL_BYTES {
            self.bytes.drain(..self.bytes.len() - STDERR_TAIL_BYTES);
        }
    }
}

fn boxed(stream: impl AsyncRead + Send + Unpin + 'static) -> Box<dyn AsyncRead + Send + Unpin> {
    Box::new(stream)
}

/// Logs what the container writes, line by line (at debug level: a server's
/// log is noise unless something goes wrong), and keeps the tail for errors.
/// A line without end is logged in pieces of [`MAX_LOG_LINE`] rather than
/// held without bound.
async fn forward_output(
    mut stream: Box<dyn AsyncRead + Send + Unpin>,
    container: String,
    output: Arc<Output>,
) {
    let mut buf = vec![0u8; 8 * 1024];
    let mut line = Vec::new();
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Ok(mut tail) = output.tail.lock() {
            tail.push(&buf[..n]);
        }
        for piece in buf[..n].split_inclusive(|b| *b == b'\n') {
            line.extend_from_slice(piece);
            if line.ends_with(b"\n") || line.len() >= MAX_LOG_LINE {
                log_line(&container, &line);
                line.clear();
            }
        }
    }
    if !line.is_empty() {
        log_line(&container, &line);
    }
    output.open_streams.fetch_sub(1, Ordering::SeqCst);
}

/// The longest piece of a container's output logged as one line.
const MAX_LOG_LINE: usize = 8 * 1024;

fn log_line(container: &str, line: &[u8]) {
    tracing::debug!(
        container,
        "function: {}",
        String::from_utf8_lossy(line).trim_end()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes_of_the_last_lines() {
        let mut tail = Tail::default();
        for i in 0..10_000 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(tail.bytes.len(), STDERR_TAIL_BYTES);
        assert!(tail.bytes.ends_with(b"line 9999\n"));
    }
}
