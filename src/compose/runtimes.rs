//! The real executors of pipeline steps:
//! - v1 Functions: [`Development`] (a running gRPC server), [`Exec`] (one
//!   container run per call, protobuf JSON on stdin/stdout). The `Docker`
//!   runtime needs a long-running container, which the runner cannot start
//!   yet, and is refused with a clear error rather than faked.
//! - alpha steps: [`ContainerSteps`], through the runner daemon at the step's
//!   `runner.endpoint` when one answers there, else in-process.
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tonic::transport::{Channel, Endpoint, Uri};

use super::alpha::{AlphaStep, ContainerConfig};
use super::inputs::{Function, RuntimeKind};
use super::json::{request_to_json, response_from_json};
use super::v1::FunctionCaller;
use super::ComposeError;
use crate::image::{ImageReference, PullPolicy, RegistryAuth};
use crate::proto::{v1, v1alpha1, v1beta1};
use crate::runner::{NetworkPolicy, RunConfig, Runner};

/// Largest gRPC message accepted from a function (Crossplane's functions
/// default to 4 MiB; render is generous).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Settings shared by every container xfn runs for a render.
#[derive(Debug, Clone)]
pub struct ContainerDefaults {
    /// Registry for references that name none (for credential lookup).
    pub default_registry: String,
    /// Kill a run after this long.
    pub timeout: Duration,
    /// Pull policy of Exec Functions that set none.
    pub pull_policy: PullPolicy,
}

/// The caller for `function` by its runtime annotation.
pub fn caller_for(
    function: &Function,
    runner: Option<&Arc<Runner>>,
    defaults: &ContainerDefaults,
) -> Result<Arc<dyn FunctionCaller>, ComposeError> {
    match &function.runtime {
        RuntimeKind::Development { target } => Ok(Arc::new(Development::new(target))),
        RuntimeKind::Exec => {
            let runner = runner.ok_or_else(|| ComposeError::StepFailed {
                step: function.name.clone(),
                message: "the Exec runtime needs the in-process runner".into(),
            })?;
            if function.package.is_empty() {
                return Err(ComposeError::StepFailed {
                    step: function.name.clone(),
                    message: "Function has no spec.package".into(),
                });
            }
            let pull_policy = match function.pull_policy.as_deref() {
                Some(policy) => {
                    parse_pull_policy(Some(policy)).map_err(|m| ComposeError::StepFailed {
                        step: function.name.clone(),
                        message: m,
                    })?
                }
                None => defaults.pull_policy,
            };
            Ok(Arc::new(Exec {
                runner: Arc::clone(runner),
                image: function.package.clone(),
                config: RunConfig {
                    pull_policy,
                    auth: docker_auth(&function.package, &defaults.default_registry),
                    timeout: defaults.timeout,
                    network: NetworkPolicy::Isolated,
                    cpu: None,
                    memory: None,
                },
            }))
        }
        RuntimeKind::Docker => Err(ComposeError::DockerUnsupported {
            function: function.name.clone(),
        }),
    }
}

fn parse_pull_policy(policy: Option<&str>) -> Result<PullPolicy, String> {
    match policy.unwrap_or("IfNotPresent") {
        "IfNotPresent" => Ok(PullPolicy::IfNotPresent),
        "Always" => Ok(PullPolicy::Always),
        "Never" => Ok(PullPolicy::Never),
        other => Err(format!(
            "unknown pull policy {other:?} (IfNotPresent, Always or Never)"
        )),
    }
}

/// Credentials for `image` from the docker config; anonymous when there are
/// none or the config cannot be read (the pull then says what is wrong).
fn docker_auth(image: &str, default_registry: &str) -> RegistryAuth {
    ImageReference::parse(image, default_registry)
        .ok()
        .and_then(|r| RegistryAuth::from_docker_config(&r.registry).ok())
        .unwrap_or_default()
}

/// A function server that is already running (`Development` runtime).
#[derive(Debug)]
pub struct Development {
    target: String,
    channel: tokio::sync::OnceCell<Channel>,
}

impl Development {
    /// A caller of the server at `target` (`host:port`).
    pub fn new(target: &str) -> Self {
        Self {
            target: target.to_string(),
            channel: tokio::sync::OnceCell::new(),
        }
    }

    async fn channel(&self) -> Result<Channel, ComposeError> {
        let unreachable = |e: String| {
            ComposeError::Call(format!(
                "cannot reach the function server at {}: {e}",
                self.target
            ))
        };
        self.channel
            .get_or_try_init(|| async {
                let uri = if self.target.contains("://") {
                    self.target.clone()
                } else {
                    format!("http://{}", self.target)
                };
                Endpoint::from_shared(uri)
                    .map_err(|e| unreachable(e.to_string()))?
                    .connect()
                    .await
                    .map_err(|e| unreachable(error_chain(&e)))
            })
            .await
            .cloned()
    }
}

#[async_trait::async_trait(?Send)]
impl FunctionCaller for Development {
    async fn run_function(
        &self,
        request: v1::RunFunctionRequest,
    ) -> Result<v1::RunFunctionResponse, ComposeError> {
        let channel = self.channel().await?;
        let mut client =
            v1::function_runner_service_client::FunctionRunnerServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES);
        match client.run_function(request.clone()).await {
            Ok(response) => Ok(response.into_inner()),
            // Functions built before v1 only serve v1beta1; the messages are
            // identical on the wire, so re-encode rather than map by hand.
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                let beta = v1beta1::RunFunctionRequest::decode(request.encode_to_vec().as_slice())
                    .map_err(|e| ComposeError::Protocol(e.to_string()))?;
                let mut client =
                    v1beta1::function_runner_service_client::FunctionRunnerServiceClient::new(
                        channel,
                    )
                    .max_decoding_message_size(MAX_MESSAGE_BYTES);
                let response = client
                    .run_function(beta)
                    .await
                    .map_err(|s| grpc_error(&self.target, &s))?
                    .into_inner();
                v1::RunFunctionResponse::decode(response.encode_to_vec().as_slice())
                    .map_err(|e| ComposeError::Protocol(e.to_string()))
            }
            Err(status) => Err(grpc_error(&self.target, &status)),
        }
    }
}

fn grpc_error(target: &str, status: &tonic::Status) -> ComposeError {
    ComposeError::Call(format!(
        "{target}: {:?}: {}",
        status.code(),
        status.message()
    ))
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One container run per call (`Exec` runtime): the JSON RunFunctionRequest
/// on stdin, the JSON RunFunctionResponse on stdout.
#[derive(Debug)]
pub struct Exec {
    runner: Arc<Runner>,
    image: String,
    config: RunConfig,
}

#[async_trait::async_trait(?Send)]
impl FunctionCaller for Exec {
    async fn run_function(
        &self,
        request: v1::RunFunctionRequest,
    ) -> Result<v1::RunFunctionResponse, ComposeError> {
        let input = request_to_json(&request)?;
        let output = self
            .runner
            .run(&self.image, &input, &self.config)
            .await
            .map_err(|e| ComposeError::Call(format!("{}: {}", self.image, one_line(&e))))?;
        response_from_json(&output.stdout)
            .map_err(|e| ComposeError::Call(format!("{}: {e}", self.image)))
    }
}

fn one_line(err: &dyn std::error::Error) -> String {
    error_chain(err).trim().replace('\n', " | ")
}

/// Runs alpha steps' containers: through the runner daemon at the step's
/// endpoint when it answers, else in-process with `runner`.
#[derive(Debug)]
pub struct ContainerSteps {
    /// The in-process runner, if xfn could make one.
    pub runner: Option<Arc<Runner>>,
    /// Registry and defaults.
    pub defaults: ContainerDefaults,
}

#[async_trait::async_trait(?Send)]
impl AlphaStep for ContainerSteps {
    async fn run(&self, input: &[u8], config: &ContainerConfig) -> Result<Vec<u8>, ComposeError> {
        let pull_policy =
            parse_pull_policy(Some(&config.pull_policy)).map_err(ComposeError::Call)?;
        let network = match config.network.as_str() {
            "Isolated" => NetworkPolicy::Isolated,
            "Runner" => NetworkPolicy::Runner,
            other => {
                return Err(ComposeError::Call(format!(
                    "unknown network policy {other:?} (Isolated or Runner)"
                )))
            }
        };
        match connect_daemon(&config.endpoint).await {
            Ok(channel) => {
                tracing::debug!(endpoint = %config.endpoint, "running through the runner daemon");
                return run_on_daemon(channel, input, config, pull_policy, network).await;
            }
            Err(why) => {
                tracing::debug!(endpoint = %config.endpoint, %why, "no runner daemon; running in-process");
            }
        }
        let runner = self.runner.as_ref().ok_or_else(|| {
            ComposeError::Call(format!(
                "no runner daemon answers at {} and there is no in-process runner",
                config.endpoint
            ))
        })?;
        let run_config = RunConfig {
            pull_policy,
            auth: docker_auth(&config.image, &self.defaults.default_registry),
            timeout: config.timeout,
            network,
            cpu: Some(config.cpu.clone()),
            memory: Some(config.memory.clone()),
        };
        let output = runner
            .run(&config.image, input, &run_config)
            .await
            .map_err(|e| ComposeError::Call(format!("{}: {}", config.image, one_line(&e))))?;
        Ok(output.stdout)
    }
}

/// Dials the daemon at `endpoint` (`unix-abstract:NAME`, `unix:PATH`, or
/// `host:port`); an error means nothing answers there.
async fn connect_daemon(endpoint: &str) -> Result<Channel, String> {
    // The URI is a placeholder for unix sockets: the connector dials.
    let placeholder = Endpoint::from_static("http://xfn.runner");
    if let Some(name) = endpoint.strip_prefix("unix-abstract:") {
        let name = name.trim_start_matches('@').to_string();
        return placeholder
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let name = name.clone();
                async move {
                    let stream = dial_abstract(&name)?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| error_chain(&e));
    }
    if let Some(path) = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
    {
        let path = path.to_string();
        return placeholder
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| error_chain(&e));
    }
    let uri = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    Endpoint::from_shared(uri)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| error_chain(&e))
}

/// Whether something accepts connections at `endpoint` (blocking; for use
/// before the async runtime starts, to decide whether the in-process runner
/// and its user namespace are needed at all).
pub fn daemon_answers(endpoint: &str) -> bool {
    if let Some(name) = endpoint.strip_prefix("unix-abstract:") {
        use std::os::linux::net::SocketAddrExt;
        let name = name.trim_start_matches('@');
        return std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
            .is_ok();
    }
    if let Some(path) = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
    {
        return std::os::unix::net::UnixStream::connect(path).is_ok();
    }
    let address = endpoint.split_once("://").map_or(endpoint, |(_, a)| a);
    std::net::TcpStream::connect(address).is_ok()
}

/// Connects to the abstract Unix socket `@name`.
fn dial_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let stream = std::os::unix::net::UnixStream::connect_addr(&address)?;
    stream.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(stream)
}

async fn run_on_daemon(
    channel: Channel,
    input: &[u8],
    config: &ContainerConfig,
    pull_policy: PullPolicy,
    network: NetworkPolicy,
) -> Result<Vec<u8>, ComposeError> {
    let request = v1alpha1::RunFunctionRequest {
        image: config.image.clone(),
        input: input.to_vec(),
        image_pull_config: Some(v1alpha1::ImagePullConfig {
            pull_policy: match pull_policy {
                PullPolicy::IfNotPresent => v1alpha1::ImagePullPolicy::IfNotPresent,
                PullPolicy::Always => v1alpha1::ImagePullPolicy::Always,
                PullPolicy::Never => v1alpha1::ImagePullPolicy::Never,
            } as i32,
            auth: None,
        }),
        run_function_config: Some(v1alpha1::RunFunctionConfig {
            resources: Some(v1alpha1::ResourceConfig {
                limits: Some(v1alpha1::ResourceLimits {
                    memory: config.memory.clone(),
                    cpu: config.cpu.clone(),
                }),
            }),
            network: Some(v1alpha1::NetworkConfig {
                policy: match network {
                    NetworkPolicy::Isolated => v1alpha1::NetworkPolicy::Isolated,
                    NetworkPolicy::Runner => v1alpha1::NetworkPolicy::Runner,
                } as i32,
            }),
            timeout: prost_types::Duration::try_from(config.timeout).ok(),
        }),
    };
    let mut client =
        v1alpha1::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let response = client
        .run_function(request)
        .await
        .map_err(|s| grpc_error(&config.endpoint, &s))?;
    Ok(response.into_inner().output)
}

#[cfg(test)]
#[path = "runtimes_tests.rs"]
mod tests;
