//! How render runs a Function (its `render.crossplane.io/runtime`,
//! Crossplane's word): each runtime a backend of the one call seam
//! ([`crate::call::FunctionRunner`]: the request's bytes in, the answer's
//! bytes out) with a start before the pipeline's first step and a stop
//! after its last ([`Runtime`], in [`runtime`]):
//! - [`Docker`]: the image served as a function server for the whole render
//!   (rootless, reached inside its own network namespace); kept
//!   ([`kept::Kept`]): one left running for the next render, reached
//!   through its keeper's socket file;
//! - [`Development`]: a function server already running;
//! - [`Exec`]: one container run per call (protobuf JSON on stdin and
//!   stdout), the engine's own backend (`call::container`).
//!
//! The pipeline's typed messages meet bytes in one place, [`answer`]. Alpha
//! steps (FunctionIO, not a request of the seam) run through
//! [`ContainerSteps`]: the runner daemon at the step's `runner.endpoint`
//! when one answers there, else in-process.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::call;
use crate::compose::read::model::{Function, RuntimeKind};
use crate::compose::{CallError, ComposeError};
use crate::image::{ImageReference, PullPolicy, RegistryAuth, UnknownPullPolicy};
use crate::runner::{Limits, NetworkPolicy, RunConfig, Runner};

mod alpha_steps;
mod development;
mod docker;
mod exec;
pub(crate) mod kept;
mod runtime;

pub(crate) use alpha_steps::{daemon_answers, ContainerSteps};
pub(crate) use development::Development;
pub(crate) use docker::Docker;
pub(crate) use exec::Exec;
pub(crate) use runtime::{answer, Runtime, RuntimeMap};

/// Largest gRPC message accepted from a function (Crossplane's functions
/// default to 4 MiB; render is generous).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Settings shared by every container xfn runs for a render.
#[derive(Debug, Clone)]
pub(crate) struct ContainerDefaults {
    /// Registry for references that name none (for credential lookup).
    pub(crate) default_registry: String,
    /// Kill a run after this long.
    pub(crate) timeout: Duration,
    /// Pull policy of Exec Functions that set none.
    pub(crate) pull_policy: PullPolicy,
    /// How to start keepers of kept servers (`runtime-docker-cleanup:
    /// Orphan`); without one, kept servers are refused.
    pub(crate) keeper: Option<kept::KeeperCommand>,
    /// How long a Development runtime's server may take to accept its
    /// first connection (`--development-wait`).
    pub(crate) development_wait: Duration,
}

/// The runtimes of a render's Functions. They own the function servers:
/// [`Runtimes::around`] starts every one at once (pulls included) before
/// the pipeline, and stops them after it whatever its outcome; kept
/// servers (`runtime-docker-cleanup: Orphan`) are reused and left running.
pub(crate) struct Runtimes {
    map: RuntimeMap,
}

impl Runtimes {
    /// A runtime per Function.
    pub(crate) fn new(
        functions: &[Function],
        runner: Option<&Arc<Runner>>,
        defaults: &ContainerDefaults,
        mut kept: HashMap<String, kept::KeptStart>,
    ) -> Result<Self, ComposeError> {
        let mut map = RuntimeMap::new();
        for function in functions {
            let runtime: Arc<dyn Runtime> =
                match (&function.runtime, &function.keep) {
                    (RuntimeKind::Docker, Some(name)) => {
                        let keeper = defaults.keeper.as_ref().ok_or_else(|| {
                            ComposeError::FunctionInvalid {
                                function: function.name.clone(),
                                message: "a kept server needs xfn's keeper".into(),
                            }
                        })?;
                        Arc::new(kept::Kept::new(
                            function,
                            kept::KeptDir::new(&keeper.cache_dir, name),
                            kept.remove(&function.name),
                            defaults.timeout,
                        ))
                    }
                    _ => runtime_for(function, runner, defaults)?,
                };
            map.insert(function.name.clone(), runtime);
        }
        Ok(Self { map })
    }

    /// The runtimes by Function name.
    pub(crate) fn map(&self) -> &RuntimeMap {
        &self.map
    }

    /// Starts every runtime, runs `work`, stops them.
    pub(crate) async fn around<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, ComposeError>>,
    ) -> Result<T, ComposeError> {
        let started = futures::future::try_join_all(self.map.values().map(|r| r.start())).await;
        let result = match started {
            Ok(_) => work.await,
            Err(err) => Err(err),
        };
        futures::future::join_all(self.map.values().map(|r| r.stop())).await;
        result
    }
}

/// The runtime of `function` by its runtime annotation.
pub(crate) fn runtime_for(
    function: &Function,
    runner: Option<&Arc<Runner>>,
    defaults: &ContainerDefaults,
) -> Result<Arc<dyn Runtime>, ComposeError> {
    match &function.runtime {
        RuntimeKind::Development { target } => Ok(Arc::new(Development::new(
            function,
            target,
            defaults.development_wait,
        ))),
        RuntimeKind::Exec => {
            let (runner, call) = container_of(function, runner, defaults)?;
            Ok(Arc::new(Exec {
                runner,
                function: call,
            }))
        }
        RuntimeKind::Docker => {
            let (runner, call) = container_of(function, runner, defaults)?;
            Ok(Arc::new(Docker {
                runner,
                function: call,
                env: function.env.clone(),
                host_network: function.host_network,
                started: tokio::sync::OnceCell::new(),
            }))
        }
    }
}

/// The runner, and the Function as the seam names it (image, run
/// settings), of a Function that runs a container.
fn container_of(
    function: &Function,
    runner: Option<&Arc<Runner>>,
    defaults: &ContainerDefaults,
) -> Result<(Arc<Runner>, call::Function), ComposeError> {
    let invalid = |message: String| ComposeError::FunctionInvalid {
        function: function.name.clone(),
        message,
    };
    let image = function.image().to_string();
    if image.is_empty() {
        return Err(invalid("it has no spec.package".into()));
    }
    let pull_policy = match function.pull_policy.as_deref() {
        Some(policy) => policy.parse().map_err(|source: UnknownPullPolicy| {
            ComposeError::FunctionPullPolicy {
                function: function.name.clone(),
                source,
            }
        })?,
        None => defaults.pull_policy,
    };
    let runner = runner
        .ok_or_else(|| invalid("running its container needs the in-process runner".into()))?;
    let config = RunConfig {
        pull_policy,
        auth: docker_auth(&image, &defaults.default_registry),
        timeout: defaults.timeout,
        network: NetworkPolicy::Isolated,
        limits: Limits::default(),
    };
    let call = call::Function {
        name: Some(function.name.clone()),
        image,
        config,
    };
    Ok((Arc::clone(runner), call))
}

/// Credentials for `image` from the docker config; anonymous when there are
/// none or the config cannot be read (the pull then says what is wrong).
fn docker_auth(image: &str, default_registry: &str) -> RegistryAuth {
    ImageReference::parse(image, default_registry)
        .ok()
        .and_then(|r| RegistryAuth::from_docker_config(&r.registry).ok())
        .unwrap_or_default()
}

/// A call to `target` its server answered with an error `status`.
fn grpc_error(target: &str, status: tonic::Status) -> ComposeError {
    ComposeError::Call {
        target: target.to_string(),
        source: Box::new(CallError::Status(status)),
    }
}

#[cfg(test)]
mod tests;
