//! crun, the OCI runtime: `crun create` and what `crun start` does (the
//! lifecycle around them is `crate::lifecycle`), removal of crun's state on
//! every path, and the capped readers of a container's stdout and stderr.
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

/// How much of stderr an error carries.
pub const STDERR_TAIL_BYTES: usize = 4096;

/// Errors of a container run.
#[derive(Debug, thiserror::Error)]
pub enum CrunError {
    /// crun could not be started.
    #[error("cannot start the OCI runtime {runtime}")]
    Spawn {
        /// The runtime binary.
        runtime: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Reading or writing the container's stdio failed.
    #[error("container i/o failed")]
    Io(#[from] std::io::Error),
    /// The run took too long and was killed.
    #[error("the function did not finish within {0:?} and was killed")]
    Timeout(Duration),
    /// The function wrote more than allowed.
    #[error("the function wrote more than {limit} bytes to {stream} and was killed")]
    OutputTooLarge {
        /// `stdout` or `stderr`.
        stream: &'static str,
        /// The cap in bytes.
        limit: usize,
    },
    /// The function (or crun starting it) exited non-zero.
    #[error("the function exited with code {code}: {}", String::from_utf8_lossy(stderr_tail).trim_end())]
    Failed {
        /// The exit code (128 + signal when killed by a signal).
        code: i32,
        /// The last bytes of stderr.
        stderr_tail: Vec<u8>,
    },
}

/// A stderr tail as a message ends: trimmed, or "(no stderr)".
pub(crate) fn tail_text(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim();
    if text.is_empty() {
        "(no stderr)".to_string()
    } else {
        text.to_string()
    }
}

/// What a container produced.
#[derive(Debug, Clone)]
pub struct CrunOutput {
    /// All of stdout.
    pub stdout: Vec<u8>,
    /// The last [`STDERR_TAIL_BYTES`] of stderr.
    pub stderr_tail: Vec<u8>,
    /// What the run used, where its cgroup measured it (filled in by the
    /// sandbox, which owns the cgroup).
    pub usage: Option<super::cgroup::run::RunUsage>,
}

/// The OCI runtime: a crun binary and its state root.
#[derive(Debug, Clone)]
pub(crate) struct Crun {
    /// The crun binary (a path, or a name looked up in PATH).
    pub(crate) binary: PathBuf,
    /// crun's `--root`: where it keeps container state.
    pub(crate) state_root: PathBuf,
    /// Whether crun manages cgroups (cgroupfs, in a delegated v2 subtree);
    /// otherwise its cgroup manager is disabled.
    pub(crate) cgroups: bool,
}

impl Crun {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.state_root)
            .arg(self.cgroup_manager());
        cmd
    }

    /// [`Crun::command`], blocking.
    pub(super) fn std_command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.state_root)
            .arg(self.cgroup_manager());
        cmd
    }

    /// cgroupfs in a delegated v2 subtree (the spec's limits are applied);
    /// disabled elsewhere: with a hybrid host crun would refuse to start.
    fn cgroup_manager(&self) -> &'static str {
        if self.cgroups {
            "--cgroup-manager=cgroupfs"
        } else {
            "--cgroup-manager=disabled"
        }
    }

    /// `crun create` of `bundle` as `id`, the container's stdio being
    /// `stdio` (stdin, stdout, stderr), its pid written to `pid_file`; crun
    /// in the user namespace `user_ns` where given (`nproc.rs`). Returns
    /// crun's exit status once the container waits to be started.
    pub(crate) async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        stdio: [std::os::fd::OwnedFd; 3],
        user_ns: Option<std::os::fd::OwnedFd>,
    ) -> Result<std::process::ExitStatus, CrunError> {
        if let Some(level) = user_ns {
            return self.create_in(level, id, bundle, pid_file, stdio).await;
        }
        let [stdin, stdout, stderr] = stdio;
        let mut child = {
            // Dropped right after the spawn: the container must hold the
            // only copies of its ends of the pipes, or they never close.
            let mut cmd = self.command();
            cmd.arg("create")
                .arg("--bundle")
                .arg(bundle)
                .arg("--no-new-keyring")
                .arg("--pid-file")
                .arg(pid_file)
                .arg(id)
                .stdin(Stdio::from(stdin))
                .stdout(Stdio::from(stdout))
                .stderr(Stdio::from(stderr))
                .kill_on_drop(true);
            // The container may not reach abstract sockets outside its
            // run, the daemon's among them (super::scope).
            super::scope::spawn(cmd)
                .await
                .map_err(|source| CrunError::Spawn {
                    runtime: self.binary.clone(),
                    source,
                })?
        };
        Ok(child.wait().await?)
    }

    /// [`Crun::create`] with crun in the user namespace `level`
    /// (`nproc.rs`), killed and reaped if dropped before it exits.
    async fn create_in(
        &self,
        level: std::os::fd::OwnedFd,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        stdio: [std::os::fd::OwnedFd; 3],
    ) -> Result<std::process::ExitStatus, CrunError> {
        use std::os::unix::process::ExitStatusExt;
        let spawn_error = |source| CrunError::Spawn {
            runtime: self.binary.clone(),
            source,
        };
        let program = resolve_binary(&self.binary)
            .ok_or_else(|| spawn_error(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
        let args: Vec<std::ffi::OsString> = [
            "--root".as_ref(),
            self.state_root.as_os_str(),
            self.cgroup_manager().as_ref(),
            "create".as_ref(),
            "--bundle".as_ref(),
            bundle.as_os_str(),
            "--no-new-keyring".as_ref(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
            id.as_ref(),
        ]
        .map(std::ffi::OsStr::to_os_string)
        .into();
        // crun starts in the abstract-socket domain (super::scope) too: the
        // spawn runs on its thread, with what it needs moved there.
        // Killed on drop from here on, even when this call was dropped
        // before the thread's answer came.
        let crun = super::scope::in_domain(move || {
            let args: Vec<&std::ffi::OsStr> = args.iter().map(|arg| arg.as_os_str()).collect();
            super::nproc::spawn_in(level.as_fd(), &program, &args, stdio)
                .map(|pidfd| KilledUnlessReaped(Some(pidfd)))
        })
        .await
        .map_err(spawn_error)?;
        let Some(pidfd) = &crun.0 else {
            return Err(CrunError::Io(std::io::Error::other("no crun process")));
        };
        let code = wait_exit(pidfd).await?;
        let mut crun = crun;
        crun.0 = None;
        Ok(std::process::ExitStatus::from_raw((code & 0xff) << 8))
    }

    /// Starts the created container `id`: what `crun start` does (open the
    /// container's `exec.fifo` in crun's state dir, unlink it, write a
    /// byte, on which the container's init execs the function), without
    /// starting a crun process for it. Where the fifo is not where crun
    /// 1.x keeps it, `crun start` itself.
    pub(crate) async fn start(&self, id: &str) -> Result<(), CrunError> {
        use rustix::fs::{Mode, OFlags};
        let fifo = self.state_root.join(id).join("exec.fifo");
        // Non-blocking: with no reader (the init is gone) the open fails
        // with ENXIO instead of waiting for one forever.
        match rustix::fs::open(
            &fifo,
            OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => {
                let _ = std::fs::remove_file(&fifo);
                rustix::io::write(&fd, &[0]).map_err(std::io::Error::from)?;
                Ok(())
            }
            Err(rustix::io::Errno::NOENT) => {
                let mut start = self.command();
                start.arg("start").arg(id).stdin(Stdio::null());
                let output = crate::fork_lock::output_async(&mut start).await?;
                if output.status.success() {
                    Ok(())
                } else {
                    Err(CrunError::Failed {
                        code: exit_code(&output.status),
                        stderr_tail: output.stderr,
                    })
                }
            }
            Err(err) => Err(CrunError::Io(std::io::Error::other(format!(
                "the container is gone before it started ({err})"
            )))),
        }
    }

    /// Removes crun's state of the container `id`, which has exited and
    /// been reaped: its state dir, as `crun delete` would (with no cgroup of
    /// crun's to remove: run cgroups are xfn's), without a crun process;
    /// `crun delete -f` where that fails.
    pub(crate) fn forget(&self, id: &str) {
        match std::fs::remove_dir_all(self.state_root.join(id)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => delete_sync(self, id),
        }
    }

    /// Makes the crun binary read-only where xfn's containers see it, so
    /// that each crun process starts once instead of twice.
    ///
    /// crun guards against CVE-2019-5736 (a container overwriting the
    /// runtime through `/proc/self/exe`) by copying itself to a sealed
    /// memfd, or bind-mounting itself read-only, and re-executing that copy
    /// before anything else: a second exec and dynamic link on every call,
    /// about a fifth of its CPU (benches/PROFILE.md). It skips that when its
    /// binary already is on a read-only mount. xfn has a mount namespace of
    /// its own, entered at start, so it binds the binary read-only onto
    /// itself there, once: the same protection, given ahead of time. Host and
    /// other processes do not see the mount. Nothing is done where the
    /// binary already is read-only, or cannot be found; a failure only costs
    /// the re-exec.
    pub(crate) fn pin_read_only(&self) {
        let Some(path) = resolve_binary(&self.binary) else {
            return;
        };
        match pin_read_only(&path) {
            Ok(true) => tracing::debug!(runtime = %path.display(), "runtime bound read-only"),
            Ok(false) => {}
            Err(err) => tracing::debug!(
                runtime = %path.display(),
                %err,
                "cannot bind the runtime read-only; it re-executes itself per call"
            ),
        }
    }

    /// Removes containers left in the state root by an xfn that died, as told
    /// by `is_stale(id)`.
    pub(crate) fn delete_stale(&self, is_stale: impl Fn(&str) -> bool) {
        let Ok(entries) = std::fs::read_dir(&self.state_root) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_stale(&name) {
                tracing::info!(container = %name, "deleting a container left by an earlier xfn");
                delete_sync(self, &name);
            }
        }
    }
}

/// `binary` as given when it has a slash, else found in PATH (as exec
/// does), made absolute.
pub(super) fn resolve_binary(binary: &Path) -> Option<PathBuf> {
    if binary.as_os_str().as_encoded_bytes().contains(&b'/') {
        return std::fs::canonicalize(binary).ok();
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
        .and_then(|found| std::fs::canonicalize(found).ok())
}

/// Binds `path` read-only onto itself unless its mount already is
/// read-only; whether it bound.
fn pin_read_only(path: &Path) -> std::io::Result<bool> {
    use rustix::fs::StatVfsMountFlags;
    use rustix::mount::{mount_bind, mount_remount, MountFlags};
    let current = rustix::fs::statvfs(path)?.f_flag;
    if current.contains(StatVfsMountFlags::RDONLY) {
        return Ok(false);
    }
    // In a user namespace a remount must keep the flags the mount was
    // locked with (nosuid, nodev, noexec, atime).
    let mut flags = MountFlags::BIND | MountFlags::RDONLY;
    for (has, keep) in [
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if current.contains(has) {
            flags |= keep;
        }
    }
    mount_bind(path, path)?;
    mount_remount(path, flags, "")?;
    Ok(true)
}

pub(super) fn delete_sync(crun: &Crun, id: &str) {
    let run = |args: &[&str]| {
        let mut command = crun.std_command();
        command
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = crate::fork_lock::status(&mut command);
    };
    run(&["kill", id, "KILL"]);
    run(&["delete", "-f", id]);
}

/// Kills and deletes a container when dropped while armed.
#[derive(Debug)]
pub(crate) struct ContainerGuard {
    pub(crate) crun: Crun,
    pub(crate) id: String,
    pub(crate) armed: bool,
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if self.armed {
            // Synchronous on purpose: when the future is dropped (a cancelled
            // call), nothing may be left behind once drop returns.
            delete_sync(&self.crun, &self.id);
        }
    }
}

pub(crate) fn exit_code(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

pub(crate) async fn read_capped(
    stream: Option<impl AsyncRead + Unpin>,
    cap: usize,
    name: &'static str,
) -> Result<Vec<u8>, CrunError> {
    let mut out = Vec::new();
    let Some(stream) = stream else {
        return Ok(out);
    };
    // Read one byte past the cap to tell "exactly the cap" from "more".
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    stream.take(limit).read_to_end(&mut out).await?;
    if out.len() > cap {
        return Err(CrunError::OutputTooLarge {
            stream: name,
            limit: cap,
        });
    }
    Ok(out)
}

pub(crate) async fn read_tail(
    stream: Option<impl AsyncRead + Unpin>,
    cap: usize,
    name: &'static str,
) -> Result<Vec<u8>, CrunError> {
    let mut tail = Vec::with_capacity(2 * STDERR_TAIL_BYTES);
    let Some(mut stream) = stream else {
        return Ok(tail);
    };
    let mut total = 0usize;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total = total.saturating_add(n);
        if total > cap {
            return Err(CrunError::OutputTooLarge {
                stream: name,
                limit: cap,
            });
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > 2 * STDERR_TAIL_BYTES {
            tail.drain(..tail.len() - STDERR_TAIL_BYTES);
        }
    }
    if tail.len() > STDERR_TAIL_BYTES {
        tail.drain(..tail.len() - STDERR_TAIL_BYTES);
    }
    Ok(tail)
}

/// A process of xfn's (through its pidfd), killed and reaped when dropped
/// unless it was reaped already (the field is then `None`).
struct KilledUnlessReaped(Option<std::os::fd::OwnedFd>);

impl Drop for KilledUnlessReaped {
    fn drop(&mut self) {
        if let Some(pidfd) = self.0.take() {
            use rustix::process::{pidfd_send_signal, waitid, Signal, WaitId, WaitIdOptions};
            let _ = pidfd_send_signal(&pidfd, Signal::KILL);
            let _ = waitid(
                WaitId::PidFd(std::os::fd::AsFd::as_fd(&pidfd)),
                WaitIdOptions::EXITED,
            );
        }
    }
}

/// Waits for the process of `pidfd` (a child of this process) to exit,
/// reaps it and returns its exit code (128 + signal when killed by one).
pub(crate) async fn wait_exit(pidfd: &OwnedFd) -> Result<i32, CrunError> {
    let watch = super::exit_watch::ExitWatch::new(pidfd.as_fd())?;
    loop {
        if let Some(code) = try_reap(pidfd)? {
            return Ok(code);
        }
        watch.exited().await?;
    }
}

/// Reaps the process of `pidfd` if it has exited, returning its exit code.
pub(crate) fn try_reap(pidfd: &OwnedFd) -> std::io::Result<Option<i32>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capped_reader_refuses_one_byte_more() {
        let exact = read_capped(Some(&b"12345"[..]), 5, "stdout").await.unwrap();
        assert_eq!(exact, b"12345");
        let err = read_capped(Some(&b"123456"[..]), 5, "stdout")
            .await
            .unwrap_err();
        assert!(
            matches!(err, CrunError::OutputTooLarge { limit: 5, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn tail_keeps_the_last_bytes() {
        let data: Vec<u8> = (0..10 * STDERR_TAIL_BYTES)
            .map(|i| (i % 251) as u8)
            .collect();
        let tail = read_tail(Some(&data[..]), usize::MAX, "stderr")
            .await
            .unwrap();
        assert_eq!(tail, &data[data.len() - STDERR_TAIL_BYTES..]);
        let err = read_tail(Some(&data[..]), 100, "stderr").await.unwrap_err();
        assert!(matches!(
            err,
            CrunError::OutputTooLarge {
                stream: "stderr",
                ..
            }
        ));
    }
}
