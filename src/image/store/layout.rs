//! Where everything lives under the cache root (see the layout in
//! [`super`]): one function per kind of entry, and digests checked before
//! they become file names.
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::{io_err, ContentStore, ImageError};
use crate::image::descriptor::is_sha256_digest;

/// The cache root's mode where functions run under ids of their own: its
/// group, the functions' root gid (xfn's gid 1), may search it. crun sets a
/// container up as the container's root, in the run's user namespace,
/// where xfn's id 0 is unmapped: it must reach the run's rootfs under
/// `<cache>/run` through the cache root, which is otherwise 0700. Reading
/// the cache's entries still takes more: every dir below the root is 0700,
/// and what a run needs (its rootfs, its bundle) is named per run.
pub(super) const ROOT_SEARCHABLE: u32 = 0o710;

pub(super) const REFS: &str = "refs";
pub(super) const MANIFESTS: &str = "manifests";
pub(super) const CONFIGS: &str = "configs";
pub(super) const BLOBS: &str = "blobs/sha256";
pub(super) const LAYERS: &str = "layers";
pub(super) const ROOTFS: &str = "rootfs";
pub(super) const LOCKS: &str = "locks";
pub(super) const TMP: &str = "tmp";
pub(super) const PINS: &str = "pins";
/// The lock ordering pins against collections (see `pin`).
pub(super) const GATE: &str = "locks/gc.gate";
/// The lock one collection at a time holds.
pub(super) const COLLECTOR: &str = "locks/gc.run";

pub(super) const DIRS: &[&str] = &[
    REFS, MANIFESTS, CONFIGS, "blobs", BLOBS, LAYERS, ROOTFS, LOCKS, TMP, PINS,
];

/// Creates the root and the store's directories where absent, all private
/// (0700): see "Privacy" in the store's header. Existing ones, e.g. of a
/// cache made by an older xfn, are made private too. A root that is not
/// ours to change (a volume owned by someone else) is left as it is with a
/// warning: the store's own directories below it are private regardless.
pub(super) fn create_private_dirs(root: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::DirBuilderExt;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true).mode(PRIVATE);
    builder.create(root).map_err(io_err(root))?;
    if let Err(err) = make_private(root, Some(ROOT_SEARCHABLE)) {
        tracing::warn!(
            cache = %root.display(),
            "cannot make the cache dir private (mode 0700): {err}; its entries stay private"
        );
    }
    for dir in DIRS {
        let path = root.join(dir);
        builder.create(&path).map_err(io_err(&path))?;
        make_private(&path, None).map_err(io_err(&path))?;
    }
    Ok(())
}

/// The mode of every directory of the store itself.
pub(super) const PRIVATE: u32 = 0o700;

/// Sets `dir` to [`PRIVATE`] unless it already is (or is `also`).
fn make_private(dir: &Path, also: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode == PRIVATE || Some(mode) == also {
        return Ok(());
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE))
}

impl ContentStore {
    /// `<root>/<dir>/<hex of digest>`.
    fn by_digest(&self, dir: &str, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root().join(dir).join(hex_of(digest, digest)?))
    }

    /// `manifests/<hex>`.
    pub(crate) fn manifest_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        self.by_digest(MANIFESTS, digest)
    }

    /// `configs/<hex>`.
    pub(crate) fn config_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        self.by_digest(CONFIGS, digest)
    }

    /// `blobs/sha256/<hex>`.
    pub(crate) fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        self.by_digest(BLOBS, digest)
    }

    /// `layers/<hex of the compressed blob>/`.
    pub(crate) fn layer_dir(&self, digest: &str) -> Result<PathBuf, ImageError> {
        self.by_digest(LAYERS, digest)
    }

    /// `rootfs/<hex of the manifest>/`.
    pub(super) fn rootfs_dir(&self, manifest_digest: &str) -> Result<PathBuf, ImageError> {
        self.by_digest(ROOTFS, manifest_digest)
    }

    /// `refs/<escaped reference>`.
    pub(super) fn ref_path(&self, key: &str) -> PathBuf {
        self.root().join(REFS).join(ref_file_name(key))
    }

    /// `tmp/`.
    pub(super) fn tmp_root(&self) -> PathBuf {
        self.root().join(TMP)
    }

    /// The prefix of this process's temp entries of a kind: the instance id
    /// first, so a later xfn can tell whose they are.
    pub(super) fn tmp_prefix(&self, what: &str) -> String {
        format!("{}.{what}.", self.instance().id())
    }
}

/// The hex of a `sha256:` digest, checked (it becomes a file name).
pub(crate) fn hex_of<'a>(digest: &'a str, image: &str) -> Result<&'a str, ImageError> {
    if !is_sha256_digest(digest) {
        return Err(ImageError::Corrupt {
            image: image.to_string(),
            reason: format!("bad digest {digest:?}"),
        });
    }
    Ok(&digest["sha256:".len()..])
}

/// `refs/` file name of a normalised reference.
fn ref_file_name(key: &str) -> String {
    let escaped = key.replace('%', "%25").replace('/', "%2F");
    if escaped.len() <= 200 {
        escaped
    } else {
        format!("sha256-{}", hex::encode(Sha256::digest(key.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_file_names_escape_slashes_and_stay_short() {
        assert_eq!(
            ref_file_name("127.0.0.1:5000/team/fn:v1"),
            "127.0.0.1:5000%2Fteam%2Ffn:v1"
        );
        let long = format!("r.io/{}:t", "a".repeat(300));
        assert!(ref_file_name(&long).starts_with("sha256-"));
    }

    #[test]
    fn bad_digests_never_become_paths() {
        assert!(hex_of("sha256:../../etc/passwd", "x").is_err());
        assert!(hex_of("sha512:00", "x").is_err());
    }
}
