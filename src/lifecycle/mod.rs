//! A function's container, its whole life, read top to bottom:
//!
//! ```text
//!  create ──► Created ──start──► Started ──feed──► (output, Finished) ──teardown──► gone
//!  (rootfs, bundle,  init blocked   function blocked   │                 (off the reply path)
//!   spec, cgroup,    on exec.fifo   on its stdin       └─serve──► Serving ──stop──► gone
//!   crun create)
//! ```
//! [`FunctionContainer`] is a [`Container`] with the rootfs under it and
//! the pin that keeps its image's layers from the cache's collector. Each
//! path composes the same steps: one run (create, start, feed at once), a
//! warm container of the [`pool`] (create and maybe start ahead, feed on
//! the call), a function server (create, start, serve until stopped; or
//! created ahead as a [`serve::PreparedServer`] and only started, served,
//! by its first call).
//!
//! # Invariants
//! - **One call per container**: `feed` and `serve` take it by value.
//! - **No caller holds a half-made container**: a failed `create` or
//!   `start` tears down what it made before it returns its error.
//! - **Nothing is left, whatever happens** (a run, an error, a timeout, a
//!   drop mid-way): the init is killed and reaped, crun's state, the
//!   cgroup, the bundle, the rootfs and the pin go, in that order (field
//!   order is drop order), through one [`teardown::Teardown`].
//! - **A call's timeout starts at the call**, whenever the container was
//!   made. Below this: `crate::sandbox` (the mechanics), reached through
//!   `seam::Sandboxing` (a fake in unit tests); above: the runner.
use std::fmt::Debug;
use std::path::PathBuf;
use std::time::Instant;

use oci_spec::image::Config as ImageConfig;
use tokio::net::unix::pipe;

use crate::image::ImagePin;
use crate::sandbox::bundle::Bundle;
use crate::sandbox::cgroup::run::RunCgroup;
use crate::sandbox::crun::ContainerGuard;
use crate::sandbox::{Limits, Sandbox, SandboxError};
use create::Init;
use seam::Sandboxing;
use teardown::HeldNamespaces;

mod create;
mod error;
#[cfg(test)]
mod fake;
mod feed;
mod output;
pub(crate) mod pool;
mod seam;
pub(crate) mod serve;
mod start;
pub(crate) mod teardown;
#[cfg(test)]
mod tests;

pub(crate) use create::RootfsMaker;
pub use error::RunError;
pub(crate) use start::Origin;

/// What a function's container is made from: its image (config, layers or
/// flattened copy, pin) and settings.
#[derive(Debug, Clone)]
pub(crate) struct Recipe<P = ImagePin> {
    /// The image config's `config` section.
    pub(crate) config: Option<ImageConfig>,
    /// The layer dirs (the overlay's lower dirs).
    pub(crate) layers: Vec<PathBuf>,
    /// The flattened copy of the image, in copy mode.
    pub(crate) flattened: Option<PathBuf>,
    /// Keeps the image's layers from the cache's collector while its
    /// containers may be made (see `image::store::pin`); each container
    /// holds a clone until its teardown is done.
    pub(crate) pin: P,
}

/// How a container runs besides its image.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Settings<'a> {
    /// NetworkPolicy::Runner.
    pub(crate) host_network: bool,
    /// cpu and memory limits.
    pub(crate) limits: Limits,
    /// Replaces the image's `Cmd` (a served function).
    pub(crate) cmd: Option<&'a [String]>,
    /// Added to the image's environment.
    pub(crate) env: &'a [String],
}

/// A function's container in state `S`, with its rootfs and pin, made
/// by `B` (crun in the [`Sandbox`]; a fake in unit tests).
#[derive(Debug)]
pub(crate) struct FunctionContainer<S: Debug + Send + 'static, B: Sandboxing = Sandbox> {
    // Field order is drop order: the container dies before its rootfs
    // goes, and the rootfs (an overlay of the image's layer dirs) before
    // the pin that keeps those dirs from the cache's collector.
    pub(crate) container: B::Container<S>,
    pub(crate) rootfs: B::Rootfs,
    pub(crate) pin: B::Pin,
}

/// A container in state `S`: [`Created`], [`Started`] (or, once serving,
/// [`serve::Serving`]).
#[derive(Debug)]
pub(crate) struct Container<S> {
    // The state first: its pipes close before the init is killed.
    state: S,
    parts: Parts,
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
    stdio: Stdio,
    at: Instant,
}

/// xfn's ends of the container's stdin, stdout and stderr.
#[derive(Debug)]
pub(crate) struct Stdio {
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

/// What every state holds: the container's init and what is removed with
/// it. Dropped, it kills and reaps the init (`Init`), removes crun's state
/// (`ContainerGuard`), then the cgroup and the bundle.
#[derive(Debug)]
pub(crate) struct Parts {
    init: Init,
    namespaces: HeldNamespaces,
    guard: ContainerGuard,
    run_cgroup: Option<RunCgroup>,
    bundle: Bundle,
    limits: Limits,
    max_output_bytes: usize,
}

impl Parts {
    /// How a container that exited with `code` failed: past its memory
    /// limit where its cgroup saw the OOM killer act, else by its exit code;
    /// with the tail of its output.
    fn failure(&self, code: i32, stderr_tail: Vec<u8>) -> SandboxError {
        let usage = self.run_cgroup.as_ref().map(RunCgroup::usage);
        crate::sandbox::failure(code, stderr_tail, usage.as_ref(), self.limits.memory_bytes)
    }
}

impl<S> Container<S> {
    /// The container id.
    pub(crate) fn id(&self) -> &str {
        &self.parts.guard.id
    }
}
