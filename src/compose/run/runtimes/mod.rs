//! The real executors of pipeline steps:
//! - v1 Functions: [`Docker`] (the image served as a gRPC server for the
//!   whole render, rootless, reached inside its own network namespace),
//!   [`Development`] (a running gRPC server), [`Exec`] (one container run
//!   per call, protobuf JSON on stdin/stdout).
//! - alpha steps: [`ContainerSteps`], through the runner daemon at the step's
//!   `runner.endpoint` when one answers there, else in-process.
//!
//! Files: [`docker`], [`development`], [`exec`], [`grpc`] (a typed call
//! on the one client of function servers, [`crate::function_server`]),
//! [`alpha_steps`].
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::compose::read::model::{Function, RuntimeKind};
use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError};
use crate::image::{ImageReference, PullPolicy, RegistryAuth, UnknownPullPolicy};
use crate::runner::{Limits, NetworkPolicy, RunConfig, Runner};

mod alpha_steps;
mod development;
mod docker;
mod exec;
mod grpc;
pub(crate) mod kept;

pub(crate) use alpha_steps::{daemon_answers, ContainerSteps};
pub(crate) use development::Development;
pub(crate) use docker::Docker;
pub(crate) use exec::Exec;

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

/// The callers of a render's Functions, by name. They own the function
/// servers: [`Callers::around`] starts every one at once (pulls included)
/// before the pipeline, and stops them after it whatever its outcome;
/// kept servers (`runtime-docker-cleanup: Orphan`) are reused and left
/// running.
pub(crate) struct Callers {
    map: HashMap<String, Arc<dyn FunctionCaller>>,
}

impl Callers {
    /// A caller per Function.
    pub(crate) fn new(
        functions: &[Function],
        runner: Option<&Arc<Runner>>,
        defaults: &ContainerDefaults,
        mut kept: HashMap<String, kept::KeptStart>,
    ) -> Result<Self, ComposeError> {
        let mut map: HashMap<String, Arc<dyn FunctionCaller>> = HashMap::new();
        for function in functions {
            let caller: Arc<dyn FunctionCaller> =
                match (&function.runtime, &function.keep) {
                    (RuntimeKind::Docker, Some(name)) => {
                        let keeper = defaults.keeper.as_ref().ok_or_else(|| {
                            ComposeError::FunctionInvalid {
                                function: function.name.clone(),
                                message: "a kept server needs xfn's keeper".into(),
                            }
                        })?;
                        Arc::new(kept::Kept {
                            function: function.name.clone(),
                            image: function.image().to_string(),
                            dir: kept::KeptDir::new(&keeper.cache_dir, name),
                            start: std::sync::Mutex::new(kept.remove(&function.name)),
                            timeout: defaults.timeout,
                            client: tokio::sync::OnceCell::new(),
                        })
                    }
                    _ => caller_for(function, runner, defaults)?,
                };
            map.insert(function.name.clone(), caller);
        }
        Ok(Self { map })
    }

    /// The callers by Function name.
    pub(crate) fn map(&self) -> &HashMap<String, Arc<dyn FunctionCaller>> {
        &self.map
    }

    /// Starts every server, runs `work`, stops the servers.
    pub(crate) async fn around<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, ComposeError>>,
    ) -> Result<T, ComposeError> {
        let started = futures::future::try_join_all(self.map.values().map(|c| c.start())).await;
        let result = match started {
            Ok(_) => work.await,
            Err(err) => Err(err),
        };
        futures::future::join_all(self.map.values().map(|c| c.stop())).await;
        result
    }
}

/// The caller for `function` by its runtime annotation.
pub(crate) fn caller_for(
    function: &Function,
    runner: Option<&Arc<Runner>>,
    defaults: &ContainerDefaults,
) -> Result<Arc<dyn FunctionCaller>, ComposeError> {
    match &function.runtime {
        RuntimeKind::Development { target } => Ok(Arc::new(Development::new(
            target,
            defaults.development_wait,
        ))),
        RuntimeKind::Exec => {
            let (runner, image, config) = container_of(function, runner, defaults)?;
            Ok(Arc::new(Exec {
                runner,
                image,
                config,
            }))
        }
        RuntimeKind::Docker => {
            let (runner, image, config) = container_of(function, runner, defaults)?;
            Ok(Arc::new(Docker {
                function: function.name.clone(),
                runner,
                image,
                config,
                env: function.env.clone(),
                host_network: function.host_network,
                started: tokio::sync::OnceCell::new(),
            }))
        }
    }
}

/// The runner, image and run settings of a Function that runs a container.
fn container_of(
    function: &Function,
    runner: Option<&Arc<Runner>>,
    defaults: &ContainerDefaults,
) -> Result<(Arc<Runner>, String, RunConfig), ComposeError> {
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
    Ok((Arc::clone(runner), image, config))
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
