//! The seam where crun stands (as youki's `Syscall`): the steps of a
//! container's life that touch the system — prepare a rootfs, create,
//! start, feed, run — behind [`Sandboxing`]. The lifecycle's own logic
//! (what a failed step leaves, what goes through the teardown and in which
//! order, what a dropped call leaves) is written once over it, so the unit
//! tests drive it over a fake while every real path monomorphizes to the
//! [`Sandbox`] (no boxing, the same code as before the seam).
use std::fmt::Debug;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::teardown::Finished;
use super::{Container, Created, RootfsMaker, RunError, Settings, Started};
use crate::image::ImagePin;
use crate::rootfs::Rootfs;
use crate::sandbox::{ContainerRequest, CrunOutput, Sandbox, SandboxError};

/// What is left once a container ran: removed when dropped (blocking: drop
/// it off the reply path). A tuple drops in order: the pin goes last, after
/// the unmount.
pub(crate) type Remains<B = Sandbox> = (
    <B as Sandboxing>::Finished,
    <B as Sandboxing>::Rootfs,
    <B as Sandboxing>::Pin,
);

/// What the lifecycle asks of the system. Each step takes a container by
/// value and gives back either the next state or, on failure, what is
/// left of it ([`Sandboxing::Finished`]) for the teardown.
pub(crate) trait Sandboxing: Debug + Send + Sync + Sized + 'static {
    /// Makes root filesystems.
    type RootfsMaker: Debug + Send + Sync;
    /// A container's root filesystem: removed when dropped.
    type Rootfs: Debug + Send + 'static;
    /// Keeps an image's layers from the cache's collector while cloned.
    type Pin: Debug + Clone + Send + Sync + 'static;
    /// A container in state `S`: killed and removed when dropped.
    type Container<S: Debug + Send + 'static>: Debug + Send + 'static;
    /// What is left of a container once it ran: removed when dropped.
    type Finished: Debug + Send + 'static;

    /// The container's id, for the logs.
    fn id<S: Debug + Send + 'static>(container: &Self::Container<S>) -> &str;

    /// A fresh rootfs over `layers` or a copy of `flattened`.
    fn prepare(
        maker: &Self::RootfsMaker,
        layers: Vec<PathBuf>,
        flattened: Option<PathBuf>,
    ) -> impl Future<Output = Result<Self::Rootfs, RunError>> + Send;

    /// Creates a container on `rootfs`; a failure leaves nothing of it.
    fn create(
        &self,
        rootfs: &Self::Rootfs,
        recipe: &super::Recipe<Self::Pin>,
        settings: Settings<'_>,
    ) -> impl Future<Output = Result<Self::Container<Created>, SandboxError>> + Send;

    /// Lets the function exec.
    fn start(
        container: Self::Container<Created>,
    ) -> impl Future<Output = Result<Self::Container<Started>, (SandboxError, Self::Finished)>> + Send;

    /// Starts and feeds, both within `timeout` from `since`.
    fn run(
        container: Self::Container<Created>,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> impl Future<Output = (Result<CrunOutput, SandboxError>, Self::Finished)> + Send;

    /// Feeds a started function within `timeout` from now.
    fn feed(
        container: Self::Container<Started>,
        input: &[u8],
        timeout: Duration,
    ) -> impl Future<Output = (Result<CrunOutput, SandboxError>, Self::Finished)> + Send;
}

/// The real thing: crun in the sandbox, on rootfs made by [`RootfsMaker`].
impl Sandboxing for Sandbox {
    type RootfsMaker = RootfsMaker;
    type Rootfs = Rootfs;
    type Pin = ImagePin;
    type Container<S: Debug + Send + 'static> = Container<S>;
    type Finished = Finished;

    fn id<S: Debug + Send + 'static>(container: &Container<S>) -> &str {
        container.id()
    }

    fn prepare(
        maker: &RootfsMaker,
        layers: Vec<PathBuf>,
        flattened: Option<PathBuf>,
    ) -> impl Future<Output = Result<Rootfs, RunError>> + Send {
        maker.prepare(layers, flattened)
    }

    async fn create(
        &self,
        rootfs: &Rootfs,
        recipe: &super::Recipe,
        settings: Settings<'_>,
    ) -> Result<Container<Created>, SandboxError> {
        let request = ContainerRequest {
            rootfs: rootfs.path(),
            image: recipe.config.as_ref(),
            host_network: settings.host_network,
            limits: settings.limits,
            cmd: settings.cmd,
            env: settings.env,
        };
        Container::create(self, &request).await
    }

    fn start(
        container: Container<Created>,
    ) -> impl Future<Output = Result<Container<Started>, (SandboxError, Finished)>> + Send {
        container.start()
    }

    fn run(
        container: Container<Created>,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> impl Future<Output = (Result<CrunOutput, SandboxError>, Finished)> + Send {
        container.run(input, timeout, since)
    }

    fn feed(
        container: Container<Started>,
        input: &[u8],
        timeout: Duration,
    ) -> impl Future<Output = (Result<CrunOutput, SandboxError>, Finished)> + Send {
        container.feed(input, timeout)
    }
}
