//! The one pipeline every front end calls: (image, input, config) -> output.
//! Owned by the sandbox work; the server work codes against this API.
use std::time::Duration;

use crate::image::{PullPolicy, RegistryAuth};

/// Network policy of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// An own, empty network namespace (also the protocol's UNSPECIFIED).
    #[default]
    Isolated,
    /// The runner's network; /etc/resolv.conf bound read-only.
    Runner,
}

/// What one run needs besides the image and input.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Pull policy for the image.
    pub pull_policy: PullPolicy,
    /// Registry credentials.
    pub auth: RegistryAuth,
    /// Kill the run after this long.
    pub timeout: Duration,
    /// Network policy.
    pub network: NetworkPolicy,
    /// CPU limit as a Kubernetes quantity (`100m`), if any.
    pub cpu: Option<String>,
    /// Memory limit as a Kubernetes quantity (`128Mi`), if any.
    pub memory: Option<String>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            pull_policy: PullPolicy::IfNotPresent,
            auth: RegistryAuth::default(),
            timeout: Duration::from_secs(30),
            network: NetworkPolicy::Isolated,
            cpu: None,
            memory: None,
        }
    }
}

/// What a successful run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// What the function wrote to stdout.
    pub stdout: Vec<u8>,
    /// The tail of what it wrote to stderr.
    pub stderr_tail: Vec<u8>,
}

/// Errors of a run. The server maps each to a gRPC status.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Getting the image failed.
    #[error(transparent)]
    Image(#[from] crate::image::store::ImageError),
    /// Not built yet.
    #[error("the runner is not built yet")]
    NotBuilt,
}

/// The runner: shared by every call, cheap to clone behind an `Arc`.
#[derive(Debug)]
pub struct Runner {
    store: crate::image::ImageStore,
}

impl Runner {
    /// A runner over `store`.
    pub fn new(store: crate::image::ImageStore) -> Self {
        Self { store }
    }

    /// Runs `image` once with `input` on stdin and returns its stdout.
    pub async fn run(
        &self,
        image: &str,
        input: &[u8],
        config: &RunConfig,
    ) -> Result<RunOutput, RunError> {
        let _ = (image, input, config, &self.store);
        Err(RunError::NotBuilt)
    }
}
