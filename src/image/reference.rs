//! Image references, parsed as Docker and Kubernetes do (owned by the image work).

/// A parsed image reference (registry, repository, tag and/or digest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    /// The full reference as given.
    pub original: String,
}
