//! OCI layer extraction: applies one uncompressed layer tar to a directory.
//!
//! Follows the OCI image-spec layer rules: `.wh.NAME` whiteouts and
//! `.wh..wh..opq` opaque markers (in any order within the layer), hardlinks,
//! symlinks, FIFOs, directory↔file replacement, modes (setuid/setgid/sticky
//! included), ownership where the user namespace maps it, mtimes (directories'
//! set after their contents) and `user.*` xattrs from PAX headers. Device
//! nodes are skipped. Regular files are streamed, never held in memory.
//!
//! Whiteouts only hide what *lower* layers have: a path this same layer
//! also creates stays, whichever of the two comes first (see [`WhiteoutMode`]).
//!
//! A hostile layer never writes outside `dest`: see `extract/tree.rs` for how
//! paths are resolved (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or an
//! `O_NOFOLLOW` walk) and `extract/paths.rs` for how `..` is refused.
pub mod bounds;
mod entry;
pub(crate) mod fsops;
mod meta;
mod paths;
mod seen;
mod tree;

use std::io::Read;
use std::path::Path;

pub use bounds::{Bound, Budget, LayerBounds};

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
    #[error("layer entry {entry:?}")]
    Io {
        /// The entry's path in the tar.
        entry: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The entry would write, link or delete outside the destination, or
    /// through a symlink: the layer is refused.
    #[error("layer entry {entry:?} refused: {reason}")]
    Unsafe {
        /// The entry's path in the tar.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The layer broke a bound (size, entries, header size) or its pull was
    /// abandoned: refused while streaming.
    #[error("layer refused after entry {after:?}: {bound}")]
    Bound {
        /// The last entry read (cut to a readable length).
        after: String,
        /// Which bound.
        bound: Bound,
    },
    /// The tar stream itself could not be read.
    #[error("reading the layer tar (after entry {after:?})")]
    Read {
        /// The last entry read successfully (empty at the start).
        after: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// What an extraction did.
#[derive(Debug, Default, Clone)]
pub struct ExtractStats {
    /// Entries written (files, dirs, links, FIFOs, whiteouts).
    pub entries: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// Whiteout and opaque entries applied.
    pub whiteouts: u64,
    /// Entries skipped (device nodes, unknown types).
    pub skipped: u64,
}

/// Tuning of an extraction; the default is right for production.
#[derive(Debug, Clone, Copy)]
pub struct ExtractOptions {
    /// Entry count and header size bounds of one layer.
    pub bounds: LayerBounds,
    /// Resolve parent directories with `openat2(RESOLVE_BENEATH |
    /// RESOLVE_NO_SYMLINKS)` (one syscall) when the kernel allows it. When
    /// false, always use the portable `O_NOFOLLOW` component walk (the
    /// fallback for old kernels or seccomp filters refusing openat2; tests
    /// use it to exercise that path).
    pub use_openat2: bool,
    /// Added to every entry's uid and gid: 1 where xfn's namespace keeps
    /// its id 0 apart from its functions' (`store::owners`).
    pub owner_shift: u32,
}

impl Default for ExtractOptions {
    fn default() -> Self {
        Self {
            bounds: LayerBounds::default(),
            use_openat2: true,
            owner_shift: 0,
        }
    }
}

/// Extracts one uncompressed layer tar stream into `dest` (an existing
/// directory: empty for [`WhiteoutMode::Overlay`], holding the lower layers
/// for [`WhiteoutMode::Flatten`]).
pub fn extract_layer<R: Read>(
    reader: R,
    dest: &Path,
    mode: WhiteoutMode,
) -> Result<ExtractStats, ExtractError> {
    extract_layer_with(reader, dest, mode, ExtractOptions::default())
}

/// [`extract_layer`] with explicit [`ExtractOptions`] and the default
/// image size [`Budget`].
pub fn extract_layer_with<R: Read>(
    reader: R,
    dest: &Path,
    mode: WhiteoutMode,
    options: ExtractOptions,
) -> Result<ExtractStats, ExtractError> {
    extract_layer_bounded(reader, dest, mode, options, &Budget::default())
}

/// [`extract_layer_with`] charging every byte (and every hole of a sparse
/// file) to `budget`, shared with the image's other layers; refuses the
/// layer, while streaming, when it breaks a bound (see [`bounds`]).
pub fn extract_layer_bounded<R: Read>(
    reader: R,
    dest: &Path,
    mode: WhiteoutMode,
    options: ExtractOptions,
    budget: &Budget,
) -> Result<ExtractStats, ExtractError> {
    let reader = bounds::Guard::new(reader, budget, options.bounds);
    let mut last = String::new();
    extract_guarded(reader, dest, mode, options, &mut last).map_err(|e| lift(e, &last))
}

fn extract_guarded<R: Read>(
    reader: R,
    dest: &Path,
    mode: WhiteoutMode,
    options: ExtractOptions,
    last: &mut String,
) -> Result<ExtractStats, ExtractError> {
    let tree = tree::Tree::open(dest, mode == WhiteoutMode::Overlay, options.use_openat2).map_err(
        |source| ExtractError::Io {
            entry: String::new(),
            source,
        },
    )?;
    let mut job = entry::Extraction::new(tree, options.owner_shift);
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|source| ExtractError::Read {
        after: String::new(),
        source,
    })?;
    for item in entries {
        let mut item = item.map_err(|source| ExtractError::Read {
            after: last.clone(),
            source,
        })?;
        *last = quote(&item.path_bytes());
        job.apply(&mut item, last)?;
    }
    job.finish()
}

/// Turns an I/O error carrying a [`Bound`] into [`ExtractError::Bound`].
fn lift(e: ExtractError, last: &str) -> ExtractError {
    let source = match &e {
        ExtractError::Io { source, .. } | ExtractError::Read { source, .. } => source,
        _ => return e,
    };
    match Bound::of(source) {
        Some(bound) => ExtractError::Bound {
            after: last.to_string(),
            bound: bound.clone(),
        },
        None => e,
    }
}

/// Longest part of a hostile name quoted in an error.
const QUOTE_MAX: usize = 200;

/// A name from a layer as errors quote it: lossy UTF-8, cut to
/// `QUOTE_MAX` bytes with its full length noted, so a 300 MiB path
/// makes a one-line error, not a 300 MiB one.
pub fn quote(name: &[u8]) -> String {
    if name.len() <= QUOTE_MAX {
        return String::from_utf8_lossy(name).into_owned();
    }
    let mut cut = String::from_utf8_lossy(&name[..QUOTE_MAX]).into_owned();
    // A multi-byte character cut in half reads as U+FFFD: drop it.
    while cut.ends_with('\u{fffd}') {
        cut.pop();
    }
    format!("{cut}… ({} bytes)", name.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    mod throughput;

    #[test]
    fn long_names_are_quoted_cut() {
        assert_eq!(quote(b"etc/passwd"), "etc/passwd");
        let long = quote(&vec![b'a'; 300 << 20]);
        assert!(long.len() < 300, "{long}");
        assert!(
            long.ends_with(&format!("… ({} bytes)", 300u64 << 20)),
            "{long}"
        );
    }
}
