//! A function's container as the runner holds it, in every path (a cold
//! call, a warm container of the pool, a served function): the sandbox's
//! [`Container`] in one of its states (`sandbox/container.rs` draws them),
//! with the root filesystem under it and the pin that keeps its image's
//! layers from the cache's collector. One type, so that every path makes,
//! starts, feeds and tears down a container the same way.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use oci_spec::image::Config as ImageConfig;

use super::teardown::Teardown;
use super::{RootfsMaker, RunError};
use crate::image::ImagePin;
use crate::rootfs::Rootfs;
use crate::sandbox::{
    Container, ContainerRequest, Created, CrunOutput, Finished, Limits, Sandbox, Started,
};

/// What a function's container is made from: its image (config, layers or
/// flattened copy, pin) and settings.
#[derive(Debug, Clone)]
pub(super) struct Recipe {
    /// The image config's `config` section.
    pub(super) config: Option<ImageConfig>,
    /// The layer dirs (the overlay's lower dirs).
    pub(super) layers: Vec<PathBuf>,
    /// The flattened copy of the image, in copy mode.
    pub(super) flattened: Option<PathBuf>,
    /// Keeps the image's layers from the cache's collector while its
    /// containers may be made (see `image::store::pin`); each container
    /// holds a clone until its teardown is done.
    pub(super) pin: ImagePin,
}

/// How a container runs besides its image.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Settings<'a> {
    /// NetworkPolicy::Runner.
    pub(super) host_network: bool,
    /// cpu and memory limits.
    pub(super) limits: Limits,
    /// Replaces the image's `Cmd` (a served function).
    pub(super) cmd: Option<&'a [String]>,
    /// Added to the image's environment.
    pub(super) env: &'a [String],
}

/// A function's container in state `S`, with its rootfs and pin.
#[derive(Debug)]
pub(super) struct FunctionContainer<S> {
    // Field order is drop order: the container dies before its rootfs
    // goes, and the rootfs (an overlay of the image's layer dirs) before
    // the pin that keeps those dirs from the cache's collector.
    pub(super) container: Container<S>,
    pub(super) rootfs: Rootfs,
    pub(super) pin: ImagePin,
}

/// What is left once a container ran: removed when dropped (blocking: drop
/// it off the reply path). A tuple drops in order: the pin goes last, after
/// the unmount.
pub(super) type Remains = (Finished, Rootfs, ImagePin);

impl FunctionContainer<Created> {
    /// Prepares a rootfs and creates a container on it. On failure it
    /// cleans up after itself (the rootfs through `teardown`, awaited):
    /// no caller ever holds a half-made container.
    pub(super) async fn create(
        sandbox: &Sandbox,
        rootfs: &RootfsMaker,
        recipe: &Recipe,
        settings: Settings<'_>,
        teardown: &Teardown,
    ) -> Result<Self, RunError> {
        let made = rootfs
            .prepare(recipe.layers.clone(), recipe.flattened.clone())
            .await?;
        let container = sandbox
            .create(&ContainerRequest {
                rootfs: made.path(),
                image: recipe.config.as_ref(),
                host_network: settings.host_network,
                limits: settings.limits,
                cmd: settings.cmd,
                env: settings.env,
            })
            .await;
        match container {
            Ok(container) => Ok(Self {
                container,
                rootfs: made,
                pin: recipe.pin.clone(),
            }),
            Err(err) => {
                teardown.drop_later(made).await;
                Err(err.into())
            }
        }
    }

    /// Starts the function ahead of its call. On failure what is left goes
    /// through `teardown` (awaited).
    pub(super) async fn start(
        self,
        teardown: &Teardown,
    ) -> Result<FunctionContainer<Started>, RunError> {
        let Self {
            container,
            rootfs,
            pin,
        } = self;
        match container.start().await {
            Ok(container) => Ok(FunctionContainer {
                container,
                rootfs,
                pin,
            }),
            Err((err, finished)) => {
                let remains: Remains = (finished, rootfs, pin);
                teardown.drop_later(remains).await;
                Err(err.into())
            }
        }
    }

    /// Starts and feeds the container within `timeout` from `since`.
    pub(super) async fn run(
        self,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> (Result<CrunOutput, RunError>, Remains) {
        let (result, finished) = self.container.run(input, timeout, since).await;
        (
            result.map_err(RunError::from),
            (finished, self.rootfs, self.pin),
        )
    }
}

impl FunctionContainer<Started> {
    /// Feeds the started function within `timeout` from now.
    pub(super) async fn feed(
        self,
        input: &[u8],
        timeout: Duration,
    ) -> (Result<CrunOutput, RunError>, Remains) {
        let (result, finished) = self.container.feed(input, timeout).await;
        (
            result.map_err(RunError::from),
            (finished, self.rootfs, self.pin),
        )
    }
}
