//! How an alpha step's container runs, from its `container` spec.
use std::time::Duration;

pub(crate) use crate::duration::parse_go_duration;

use crate::compose::read::model::ContainerSpec;

/// The runner endpoint alpha functions use unless they name another.
pub(crate) const DEFAULT_RUNNER_ENDPOINT: &str = "unix-abstract:crossplane/fn/default.sock";

/// How to run one alpha step's container, from its `container` spec.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ContainerConfig {
    /// OCI reference.
    pub(crate) image: String,
    /// IfNotPresent, Always or Never.
    pub(crate) pull_policy: String,
    /// Kill it after this long.
    pub(crate) timeout: Duration,
    /// Isolated or Runner.
    pub(crate) network: String,
    /// CPU limit quantity.
    pub(crate) cpu: String,
    /// Memory limit quantity.
    pub(crate) memory: String,
    /// The runner daemon's endpoint.
    pub(crate) endpoint: String,
}

impl ContainerConfig {
    /// The config of `spec`, with Crossplane's defaults (20s, 100m, 128Mi).
    pub(crate) fn from_spec(spec: &ContainerSpec) -> Result<Self, String> {
        let timeout = match &spec.timeout {
            Some(t) => parse_go_duration(t)?,
            None => Duration::from_secs(20),
        };
        let limits = spec.resources.as_ref().and_then(|r| r.limits.clone());
        Ok(Self {
            image: spec.image.clone(),
            pull_policy: spec
                .image_pull_policy
                .clone()
                .unwrap_or_else(|| "IfNotPresent".into()),
            timeout,
            network: spec
                .network
                .as_ref()
                .and_then(|n| n.policy.clone())
                .unwrap_or_else(|| "Isolated".into()),
            cpu: limits
                .as_ref()
                .and_then(|l| l.cpu.clone())
                .unwrap_or_else(|| "100m".into()),
            memory: limits
                .as_ref()
                .and_then(|l| l.memory.clone())
                .unwrap_or_else(|| "128Mi".into()),
            endpoint: spec
                .runner
                .as_ref()
                .and_then(|r| r.endpoint.clone())
                .unwrap_or_else(|| DEFAULT_RUNNER_ENDPOINT.into()),
        })
    }
}
