//! The content-addressed image store under the cache dir (owned by the image work).
use std::path::{Path, PathBuf};

use super::RegistryAuth;

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

/// Options that hold for every pull of a store.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Registry for references that name none (`-r/--registry`).
    pub default_registry: String,
    /// Registries reached over plain HTTP (loopback ones always are).
    pub insecure_registries: Vec<String>,
    /// A PEM CA bundle trusted in addition to the system roots.
    pub ca_bundle: Option<PathBuf>,
}

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Not built yet.
    #[error("the image store is not built yet")]
    NotBuilt,
}

/// An image that is whole in the store: config read, every layer extracted.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The reference it was asked for by.
    pub reference: String,
    /// The manifest digest (`sha256:…`).
    pub digest: String,
    /// The image config.
    pub config: oci_spec::image::ImageConfiguration,
    /// The extracted layer directories, bottom layer first: overlay lower dirs.
    pub layers: Vec<PathBuf>,
}

/// The store.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

impl ImageStore {
    /// Opens (creating when absent) the store under `cache_dir`.
    pub fn open(cache_dir: &Path, _options: StoreOptions) -> Result<Self, ImageError> {
        Ok(Self {
            root: cache_dir.to_path_buf(),
        })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes `image` whole in the store under `policy` and returns it.
    pub async fn ensure(
        &self,
        _image: &str,
        _policy: PullPolicy,
        _auth: &RegistryAuth,
    ) -> Result<PulledImage, ImageError> {
        Err(ImageError::NotBuilt)
    }

    /// The flattened rootfs of a pulled image (every layer applied in one
    /// directory), built once and cached; the source of copy-mode rootfs.
    pub async fn flattened_rootfs(&self, _image: &PulledImage) -> Result<PathBuf, ImageError> {
        Err(ImageError::NotBuilt)
    }
}
