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
        /// `MAX_LAYERS` (the store's).
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
    /// Content does not parse, decode or unpack as what it must be (a
    /// config, an index, an archive, a layer's compression).
    #[error("image {image}: {what}")]
    BadContent {
        /// The reference, digest or file.
        image: String,
        /// What was being read (`index.json`, `the image config`).
        what: &'static str,
        /// Why it does not.
        source: ContentError,
    },
    /// Extracting a layer failed.
    #[error("extracting layer {digest}")]
    Extract {
        /// The layer blob digest.
        digest: String,
        /// Why.
        source: ExtractError,
    },
    /// The pull did not finish in time.
    #[error("pulling {image} took longer than {timeout:?} ({bound})")]
    Timeout {
        /// The reference.
        image: String,
        /// The bound.
        timeout: Duration,
        /// Whose bound it was.
        bound: PullBound,
    },
    /// The cache dir is not xfn's alone.
    #[error(transparent)]
    UnsafeCache(#[from] super::store::trust::UnsafeCacheDir),
    /// Local file system trouble.
    #[error("{path}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why content does not parse or decode: the source of
/// [`ImageError::BadContent`].
#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    /// JSON that does not parse (or encode) as the document it must be.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Bytes that do not decompress or unpack.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What ended a pull that took too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullBound {
    /// `--pull-timeout`, the bound of every pull.
    PullTimeout,
    /// The time the call it served had left (its timeout, or its caller's
    /// deadline).
    Call,
}

impl std::fmt::Display for PullBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PullBound::PullTimeout => "the --pull-timeout bound",
            PullBound::Call => {
                "the time the call had; the layers fetched so far are kept for the next call"
            }
        })
    }
}

impl ImageError {
    /// How to classify this error (e.g. for a gRPC status).
    pub fn kind(&self) -> ImageErrorKind {
        match self {
            ImageError::InvalidReference(_) => ImageErrorKind::InvalidArgument,
            ImageError::NotPresent { .. } => ImageErrorKind::NotPresent,
            ImageError::Pull(PullError::Io { source, .. }) if no_space(source) => {
                ImageErrorKind::NoSpace
            }
            ImageError::Pull(e) => e.kind(),
            ImageError::TooManyLayers { .. } => ImageErrorKind::TooManyLayers,
            ImageError::Corrupt { .. } | ImageError::BadContent { .. } => ImageErrorKind::Corrupt,
            ImageError::Extract {
                source: ExtractError::Bound { .. },
                ..
            } => ImageErrorKind::TooLarge,
            // A layer that is no tar, or whose entries would escape: a bad
            // image, whoever asks for it.
            ImageError::Extract {
                source: ExtractError::Unsafe { .. } | ExtractError::Read { .. },
                ..
            } => ImageErrorKind::InvalidArgument,
            ImageError::Extract {
                source: ExtractError::Io { source, .. },
                ..
            } if no_space(source) => ImageErrorKind::NoSpace,
            ImageError::Extract { .. } => ImageErrorKind::Extract,
            ImageError::Timeout { .. } => ImageErrorKind::Timeout,
            ImageError::Io { source, .. } if no_space(source) => ImageErrorKind::NoSpace,
            ImageError::Io { .. } | ImageError::UnsafeCache(_) => ImageErrorKind::Io,
        }
    }
}

/// Whether `err` says the file system is full (ENOSPC) or the user's quota
/// is (EDQUOT).
fn no_space(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || err.kind() == std::io::ErrorKind::StorageFull
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
    fn a_bad_layer_is_the_image_s_fault_and_a_full_disk_is_no_space() {
        use std::io::{Error, ErrorKind};
        let extract = |source| ImageError::Extract {
            digest: "sha256:ab".into(),
            source,
        };
        let unsafe_entry = extract(ExtractError::Unsafe {
            entry: "../x".into(),
            reason: "outside the rootfs".into(),
        });
        assert_eq!(unsafe_entry.kind(), ImageErrorKind::InvalidArgument);
        let not_a_tar = extract(ExtractError::Read {
            after: String::new(),
            source: Error::new(ErrorKind::InvalidData, "not a tar"),
        });
        assert_eq!(not_a_tar.kind(), ImageErrorKind::InvalidArgument);
        let full = || Error::from_raw_os_error(libc::ENOSPC);
        let entry_io = |source| ExtractError::Io {
            entry: "a".into(),
            source,
        };
        assert_eq!(extract(entry_io(full())).kind(), ImageErrorKind::NoSpace);
        assert_eq!(
            extract(entry_io(Error::from_raw_os_error(libc::EIO))).kind(),
            ImageErrorKind::Extract
        );
        let stored = ImageError::Io {
            path: PathBuf::from("/cache/tmp/x"),
            source: full(),
        };
        assert_eq!(stored.kind(), ImageErrorKind::NoSpace);
        let blob = ImageError::Pull(PullError::Io {
            digest: "sha256:ab".into(),
            source: Error::from_raw_os_error(libc::EDQUOT),
        });
        assert_eq!(blob.kind(), ImageErrorKind::NoSpace);
    }

    #[test]
    fn a_pull_past_its_call_s_time_says_so() {
        let e = ImageError::Timeout {
            image: "r/x:v1".into(),
            timeout: Duration::from_secs(2),
            bound: PullBound::Call,
        };
        assert_eq!(e.kind(), ImageErrorKind::Timeout);
        assert!(e.to_string().contains("the time the call had"), "{e}");
    }

    #[test]
    fn errors_name_their_image_and_kind() {
        let e = ImageError::NotPresent { image: "x".into() };
        assert_eq!(e.kind(), ImageErrorKind::NotPresent);
        assert!(e.to_string().contains("x"));
        let e: ImageError = ReferenceError::Empty.into();
        assert_eq!(e.kind(), ImageErrorKind::InvalidArgument);
    }
}
