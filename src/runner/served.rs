//! Function images started as long-running servers (the `Docker` runtime of
//! `xfn render`): the same pull, rootfs and sandbox as a run, but the
//! container keeps running until [`ServedFunction::stop`].
use std::net::SocketAddr;
use std::time::Duration;

use super::{RunConfig, RunError, Runner};
use crate::image::ImagePin;
use crate::rootfs::Rootfs;
use crate::sandbox::cgroup::run::RunUsage;
use crate::sandbox::netns::NetworkNamespace;
use crate::sandbox::served::{ServeRequest, ServedContainer};

/// A function image running as a server in its own network namespace.
/// Killed, and its rootfs removed, by [`ServedFunction::stop`] or on drop.
#[derive(Debug)]
pub struct ServedFunction {
    // Field order is drop order: the container dies before its rootfs
    // goes, and the rootfs before the pin that keeps its image's layers
    // from the cache's collector (see `image::store::pin`).
    container: ServedContainer,
    rootfs: Rootfs,
    pin: ImagePin,
}

/// How a function image is served.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeOptions<'a> {
    /// Replaces the image's `Cmd` (its entrypoint stays).
    pub cmd: &'a [String],
    /// Added to the image's environment (`KEY=VALUE`).
    pub env: &'a [String],
    /// Share xfn's network, for a function that needs egress; by default
    /// the server has an empty network namespace of its own and is reached
    /// inside it, never through the host's.
    pub host_network: bool,
}

impl Runner {
    /// Starts `image` as `options` say and leaves it running.
    /// `config.timeout` bounds the start (pull excluded); `config.network`
    /// is not used (see [`ServeOptions::host_network`]).
    pub async fn serve(
        &self,
        image: &str,
        options: ServeOptions<'_>,
        config: &RunConfig,
    ) -> Result<ServedFunction, RunError> {
        self.sandbox.check_limits()?;
        let pulled = self
            .store
            .ensure(image, config.pull_policy, &config.auth)
            .await?;
        let rootfs = self.prepare_rootfs(&pulled).await?;
        let container = self
            .sandbox
            .serve(&ServeRequest {
                rootfs: rootfs.path(),
                image: pulled.config.config().as_ref(),
                cmd: options.cmd,
                env: options.env,
                host_network: options.host_network,
                limits: config.limits,
                startup_timeout: config.timeout,
            })
            .await?;
        tracing::debug!(image, container = container.id(), "function serving");
        Ok(ServedFunction {
            container,
            rootfs,
            pin: pulled.pin,
        })
    }
}

impl ServedFunction {
    /// The container's own network namespace, to connect in.
    pub fn network(&self) -> &NetworkNamespace {
        self.container.network()
    }

    /// Waits until the server listens on `address` inside its namespace;
    /// fails with its exit code and output when it exits first.
    pub async fn wait_listening(
        &mut self,
        address: SocketAddr,
        timeout: Duration,
    ) -> Result<(), RunError> {
        Ok(self.container.wait_listening(address, timeout).await?)
    }

    /// Why the server is gone, if it is (exit code, OOM kill, output tail).
    pub fn exited(&mut self) -> Option<RunError> {
        self.container.exited().map(RunError::from)
    }

    /// The last bytes the server wrote to stdout and stderr.
    pub fn output_tail(&self) -> Vec<u8> {
        self.container.output_tail()
    }

    /// Kills the server and removes its container, cgroup and rootfs.
    /// Returns what its cgroup measured, where it had one.
    pub async fn stop(self) -> Option<RunUsage> {
        let Self {
            container,
            rootfs,
            pin,
        } = self;
        let usage = container.stop().await;
        // Unmounting takes milliseconds: off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(rootfs)).await;
        drop(pin);
        usage
    }
}
