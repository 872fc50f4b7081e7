//! When a caller's image is fetched from its registry, and the policy's one
//! spelling on every wire: the
//! Kubernetes names (`IfNotPresent`, `Always`, `Never`) on the command line
//! (`--image-pull-policy`) and in manifests (an alpha step's
//! `imagePullPolicy`, `render.crossplane.io/runtime-docker-pull-policy`,
//! `spec.packagePullPolicy`), and the alpha protocol's `ImagePullPolicy`.
use crate::proto::v1alpha1::ImagePullPolicy as ProtoPullPolicy;

/// When to contact the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    /// Pull only when not cached (also the protocol's UNSPECIFIED).
    #[default]
    IfNotPresent,
    /// Re-resolve the reference every time; cached layers are reused.
    Always,
    /// Never contact the registry: the image must be cached.
    Never,
}

/// A pull policy spelled otherwise than Kubernetes spells it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pull policy {0:?} (IfNotPresent, Always or Never)")]
pub struct UnknownPullPolicy(pub String);

impl PullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Always => "Always",
            PullPolicy::Never => "Never",
        }
    }
}

impl std::fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Manifests spell it exactly as Kubernetes does (the command line also
/// takes lowercase, through clap).
impl std::str::FromStr for PullPolicy {
    type Err = UnknownPullPolicy;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [
            PullPolicy::IfNotPresent,
            PullPolicy::Always,
            PullPolicy::Never,
        ]
        .into_iter()
        .find(|policy| policy.as_str() == text)
        .ok_or_else(|| UnknownPullPolicy(text.to_string()))
    }
}

impl From<ProtoPullPolicy> for PullPolicy {
    fn from(policy: ProtoPullPolicy) -> Self {
        match policy {
            ProtoPullPolicy::Unspecified | ProtoPullPolicy::IfNotPresent => {
                PullPolicy::IfNotPresent
            }
            ProtoPullPolicy::Always => PullPolicy::Always,
            ProtoPullPolicy::Never => PullPolicy::Never,
        }
    }
}

impl From<PullPolicy> for ProtoPullPolicy {
    fn from(policy: PullPolicy) -> Self {
        match policy {
            PullPolicy::IfNotPresent => ProtoPullPolicy::IfNotPresent,
            PullPolicy::Always => ProtoPullPolicy::Always,
            PullPolicy::Never => ProtoPullPolicy::Never,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [PullPolicy; 3] = [
        PullPolicy::IfNotPresent,
        PullPolicy::Always,
        PullPolicy::Never,
    ];

    #[test]
    fn every_policy_reads_back_from_its_kubernetes_spelling_and_its_protocol_value() {
        for policy in ALL {
            assert_eq!(policy.to_string().parse::<PullPolicy>(), Ok(policy));
            assert_eq!(PullPolicy::from(ProtoPullPolicy::from(policy)), policy);
        }
    }

    #[test]
    fn an_unspecified_protocol_policy_is_if_not_present() {
        assert_eq!(
            PullPolicy::from(ProtoPullPolicy::Unspecified),
            PullPolicy::IfNotPresent
        );
    }

    #[test]
    fn manifests_must_spell_it_as_kubernetes_does() {
        let err = "Sometimes".parse::<PullPolicy>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown pull policy \"Sometimes\" (IfNotPresent, Always or Never)"
        );
        assert!("always".parse::<PullPolicy>().is_err());
    }
}
