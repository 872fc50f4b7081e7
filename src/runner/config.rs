//! What one run asks for, typed: front ends parse their wire format (flags,
//! a protobuf request, a manifest) into a [`RunConfig`] at their edge, so
//! the runner and the sandbox never see a string.
use std::time::Duration;

use crate::image::{PullPolicy, RegistryAuth};
use crate::proto::v1alpha1::NetworkPolicy as ProtoNetworkPolicy;
pub use crate::sandbox::Limits;

/// Network policy of a run, spelled `Isolated` or `Runner` on every wire
/// (`--network-policy`, an alpha step's `network.policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum NetworkPolicy {
    /// An own, empty network namespace (also the protocol's UNSPECIFIED).
    #[default]
    Isolated,
    /// The runner's network; /etc/resolv.conf bound read-only.
    Runner,
}

impl NetworkPolicy {
    /// Its one spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkPolicy::Isolated => "Isolated",
            NetworkPolicy::Runner => "Runner",
        }
    }
}

/// A network policy spelled otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown network policy {0:?} (Isolated or Runner)")]
pub struct UnknownNetworkPolicy(pub String);

impl std::str::FromStr for NetworkPolicy {
    type Err = UnknownNetworkPolicy;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [NetworkPolicy::Isolated, NetworkPolicy::Runner]
            .into_iter()
            .find(|policy| policy.as_str() == text)
            .ok_or_else(|| UnknownNetworkPolicy(text.to_string()))
    }
}

impl From<ProtoNetworkPolicy> for NetworkPolicy {
    fn from(policy: ProtoNetworkPolicy) -> Self {
        match policy {
            ProtoNetworkPolicy::Unspecified | ProtoNetworkPolicy::Isolated => {
                NetworkPolicy::Isolated
            }
            ProtoNetworkPolicy::Runner => NetworkPolicy::Runner,
        }
    }
}

impl From<NetworkPolicy> for ProtoNetworkPolicy {
    fn from(policy: NetworkPolicy) -> Self {
        match policy {
            NetworkPolicy::Isolated => ProtoNetworkPolicy::Isolated,
            NetworkPolicy::Runner => ProtoNetworkPolicy::Runner,
        }
    }
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
    /// CPU and memory limits, parsed from quantities by the front end.
    pub limits: Limits,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            pull_policy: PullPolicy::IfNotPresent,
            auth: RegistryAuth::default(),
            timeout: Duration::from_secs(30),
            network: NetworkPolicy::Isolated,
            limits: Limits::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_policies_read_back_from_manifests_and_the_protocol() {
        for policy in [NetworkPolicy::Isolated, NetworkPolicy::Runner] {
            assert_eq!(format!("{policy:?}").parse::<NetworkPolicy>(), Ok(policy));
            assert_eq!(
                NetworkPolicy::from(ProtoNetworkPolicy::from(policy)),
                policy
            );
        }
        assert_eq!(
            NetworkPolicy::from(ProtoNetworkPolicy::Unspecified),
            NetworkPolicy::Isolated
        );
        assert_eq!(
            "Host".parse::<NetworkPolicy>().unwrap_err().to_string(),
            "unknown network policy \"Host\" (Isolated or Runner)"
        );
    }
}
