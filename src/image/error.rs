//! The errors of getting an image: from the store, the registry client and
//! layer extraction, each classified by an [`ImageErrorKind`].
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::extract::ExtractError;
use super::kind::ImageErrorKind;
use super::pull::PullError;
use super::reference::ReferenceError;

/// Errors of the image store and of pulls into it.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The reference does not parse.
    #[error(transparent)]
    InvalidReference(#[from] ReferenceError),
    /// Pull policy `Never` and the image is not (wholly) in the cache.
    #[error("image {image} is not in the cache and the pull policy is Never")]
    NotPresent {
        /// The normalised reference.
        image: String,
    },
    /// Resolving or downloading failed.
    #[error(transparent)]
    Pull(#[from] PullError),
    /// Too many layers.
    #[error("image {image} has {count} layers; at most {max} are supported")]
    TooManyLayers {
        /// The reference.
        image: String,
        /// Its layer count.
        count: usize,
        /// [`MAX_LAYERS`](super::store::MAX_LAYERS).
        max: usize,
    },
    /// Content is inconsistent (config, diff ids, cached entries).
    #[error("image {image}: {reason}")]
    Corrupt {
        /// The reference or digest.
        image: String,
        /// What is wrong.
        reason: String,
    },
    /// Extracting a layer failed.
    #[error("extracting layer {digest}: {source}")]
    Extract {
        /// The layer blob digest.
        digest: String,
        /// Why.
        source: ExtractError,
    },
    /// The pull did not finish in time.
    #[error("pulling {image} took longer than {timeout:?} (the --pull-timeout bound)")]
    Timeout {
        /// The reference.
        image: String,
        /// The bound.
        timeout: Duration,
    },
    /// Local file system trouble.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl ImageError {
    /// How to classify this error (e.g. for a gRPC status).
    pub fn kind(&self) -> ImageErrorKind {
        match self {
            ImageError::InvalidReference(_) => ImageErrorKind::InvalidArgument,
            ImageError::NotPresent { .. } => ImageErrorKind::NotPresent,
            ImageError::Pull(e) => e.kind(),
            ImageError::TooManyLayers { .. } => ImageErrorKind::TooManyLayers,
            ImageError::Corrupt { .. } => ImageErrorKind::Corrupt,
            ImageError::Extract {
                source: ExtractError::Bound { .. },
                ..
            } => ImageErrorKind::TooLarge,
            ImageError::Extract { .. } => ImageErrorKind::Extract,
            ImageError::Timeout { .. } => ImageErrorKind::Timeout,
            ImageError::Io { .. } => ImageErrorKind::Io,
        }
    }
}

/// Maps an I/O error on `path` to [`ImageError::Io`].
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A blocking worker that panicked or was cancelled.
pub(crate) fn join_err(e: tokio::task::JoinError) -> ImageError {
    ImageError::Io {
        path: PathBuf::new(),
        source: std::io::Error::other(format!("worker task failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_image_and_kind() {
        let e = ImageError::NotPresent { image: "x".into() };
        assert_eq!(e.kind(), ImageErrorKind::NotPresent);
        assert!(e.to_string().contains("x"));
        let e: ImageError = ReferenceError::Empty.into();
        assert_eq!(e.kind(), ImageErrorKind::InvalidArgument);
    }
}
