//! Function images started as long-running servers (the `Docker` runtime of
//! `xfn render`): the same pull, rootfs and container lifecycle as a run
//! (`container.rs`: create, start), but served until
//! [`ServedFunction::stop`] instead of fed once.
use std::net::SocketAddr;
use std::time::Duration;

use super::container::{FunctionContainer, Remains, Settings};
use super::teardown::Teardown;
use super::{RunConfig, RunError, Runner};
use crate::sandbox::cgroup::run::RunUsage;
use crate::sandbox::function_server::Serving;
use crate::sandbox::netns::NetworkNamespace;

/// A function image running as a server in its own network namespace.
/// Killed, and its rootfs removed, by [`ServedFunction::stop`] or on drop.
#[derive(Debug)]
pub struct ServedFunction(FunctionContainer<Serving>);

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
        let recipe = self.recipe(&pulled).await?;
        let settings = Settings {
            host_network: options.host_network,
            limits: config.limits,
            cmd: Some(options.cmd),
            env: options.env,
        };
        let teardown = &self.teardown;
        let started = tokio::time::timeout(config.timeout, async {
            FunctionContainer::create(&self.sandbox, &self.rootfs, &recipe, settings, teardown)
                .await?
                .start(teardown)
                .await
        })
        .await
        .map_err(|_| RunError::Timeout(config.timeout))??;
        let FunctionContainer {
            container,
            rootfs,
            pin,
        } = started;
        let container = container.serve(options.host_network)?;
        tracing::debug!(image, container = container.id(), "function serving");
        Ok(ServedFunction(FunctionContainer {
            container,
            rootfs,
            pin,
        }))
    }
}

impl ServedFunction {
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
