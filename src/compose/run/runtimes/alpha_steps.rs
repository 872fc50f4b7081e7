//! Alpha steps: through the runner daemon (`xfn start`, or Crossplane's own
//! runner) at the step's endpoint when one answers, else in-process.
use std::sync::Arc;

use tonic::transport::{Channel, Endpoint, Uri};

use super::{docker_auth, grpc_error};
use super::{ContainerDefaults, MAX_MESSAGE_BYTES};
use crate::chain::Chain;
use crate::compose::run::alpha::{AlphaStep, ContainerConfig};
use crate::compose::{CallError, ComposeError};
use crate::image::{PullPolicy, UnknownPullPolicy};
use crate::proto::v1alpha1;
use crate::runner::{Limits, NetworkPolicy, RunConfig, Runner, UnknownNetworkPolicy};

/// Runs alpha steps' containers: through the runner daemon at the step's
/// endpoint when it answers, else in-process with `runner`.
#[derive(Debug)]
pub(crate) struct ContainerSteps {
    /// The in-process runner, if xfn could make one.
    pub(crate) runner: Option<Arc<Runner>>,
    /// Registry and defaults.
    pub(crate) defaults: ContainerDefaults,
}

#[async_trait::async_trait]
impl AlphaStep for ContainerSteps {
    /// In-process, the step's container is made (and started) ahead in the
    /// runner's warm pool; a daemon at the endpoint has its own.
    async fn prepare(&self, config: &ContainerConfig) -> Result<(), ComposeError> {
        if connect_daemon(&config.endpoint).await.is_ok() {
            return Ok(());
        }
        let (Some(runner), Ok(run_config)) = (self.runner.as_ref(), self.run_config(config)) else {
            // Said by the step itself when it runs.
            return Ok(());
        };
        runner
            .prewarm(&config.image, &run_config)
            .await
            .map_err(|e| failed(config, e.into()))
    }

    async fn run(&self, input: &[u8], config: &ContainerConfig) -> Result<Vec<u8>, ComposeError> {
        let run_config = self.run_config(config)?;
        match connect_daemon(&config.endpoint).await {
            Ok(channel) => {
                tracing::debug!(endpoint = %config.endpoint, "running through the runner daemon");
                return run_on_daemon(
                    channel,
                    input,
                    config,
                    run_config.pull_policy,
                    run_config.network,
                )
                .await;
            }
            Err(why) => {
                tracing::debug!(endpoint = %config.endpoint, why = %Chain(&why), "no runner daemon; running in-process");
            }
        }
        let runner = self.runner.as_ref().ok_or_else(|| {
            failed(
                config,
                CallError::NoRunner {
                    endpoint: config.endpoint.clone(),
                },
            )
        })?;
        let output = runner
            .run(&config.image, input, &run_config)
            .await
            .map_err(|e| failed(config, e.into()))?;
        Ok(output.stdout)
    }
}

impl ContainerSteps {
    /// How a step's container runs, from its spec: checked here whichever
    /// runs it (the daemon gets the step's text).
    fn run_config(&self, config: &ContainerConfig) -> Result<RunConfig, ComposeError> {
        let pull_policy: PullPolicy = config
            .pull_policy
            .parse()
            .map_err(|e: UnknownPullPolicy| failed(config, e.into()))?;
        let network: NetworkPolicy = config
            .network
            .parse()
            .map_err(|e: UnknownNetworkPolicy| failed(config, e.into()))?;
        // Checked here whichever runs it; the daemon gets the step's text.
        let limits = Limits::parse(Some(&config.cpu), Some(&config.memory))
            .map_err(|e| failed(config, CallError::Limits(e)))?;
        Ok(RunConfig {
            pull_policy,
            auth: docker_auth(&config.image, &self.defaults.default_registry),
            timeout: config.timeout,
            network,
            limits,
        })
    }
}

/// Calling the step's image failed.
fn failed(config: &ContainerConfig, source: CallError) -> ComposeError {
    ComposeError::Call {
        target: config.image.clone(),
        source: Box::new(source),
    }
}

/// Dials the daemon at `endpoint` (`unix-abstract:NAME`, `unix:PATH`, or
/// `host:port`); an error means nothing answers there.
async fn connect_daemon(endpoint: &str) -> Result<Channel, tonic::transport::Error> {
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
            .await;
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
            .await;
    }
    let uri = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    Endpoint::from_shared(uri)?.connect().await
}

/// Whether something accepts connections at `endpoint` (blocking; for use
/// before the async runtime starts, to decide whether the in-process runner
/// and its user namespace are needed at all).
pub(crate) fn daemon_answers(endpoint: &str) -> bool {
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
            pull_policy: v1alpha1::ImagePullPolicy::from(pull_policy) as i32,
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
                policy: v1alpha1::NetworkPolicy::from(network) as i32,
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
        .map_err(|s| grpc_error(&config.endpoint, s))?;
    Ok(response.into_inner().output)
}
