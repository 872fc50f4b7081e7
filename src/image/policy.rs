//! When a caller's image is fetched from its registry.

/// When to contact the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PullPolicy {
    /// Use the cache when the image is there (also the protocol's UNSPECIFIED).
    #[default]
    IfNotPresent,
    /// Re-resolve the reference every time; reuse cached layers.
    Always,
    /// Cache only.
    Never,
}
