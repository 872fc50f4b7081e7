//! OCI layer extraction (owned by the extraction work; see issue 2).
use std::io::Read;
use std::path::Path;

/// How whiteouts in a layer are materialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhiteoutMode {
    /// The layer is extracted into its own directory, to be an overlay lower
    /// dir: whiteouts become overlay whiteouts (char device 0:0) and opaque
    /// dirs get the `user.overlay.opaque` xattr (overlay mounted `userxattr`).
    Overlay,
    /// The layer is applied on top of the layers below it in one directory
    /// (the flattened rootfs for copy mode): whiteouts delete.
    Flatten,
}

/// Errors extracting a layer.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// An I/O error on an entry.
    #[error("layer entry {entry:?}: {source}")]
    Io {
        /// The entry's path in the tar.
        entry: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// What an extraction did.
#[derive(Debug, Default, Clone)]
pub struct ExtractStats {
    /// Entries written.
    pub entries: u64,
}

/// Extracts one uncompressed layer tar stream into `dest`.
pub fn extract_layer<R: Read>(
    _reader: R,
    _dest: &Path,
    _mode: WhiteoutMode,
) -> Result<ExtractStats, ExtractError> {
    Err(ExtractError::Io {
        entry: String::new(),
        source: std::io::Error::other("layer extraction is not built yet"),
    })
}
