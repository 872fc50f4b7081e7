//! Manifest flavours (OCI or Docker schema 2) and the media type each gives
//! manifests, configs, indexes and layers. A file of its own so that the
//! layer builder needs nothing else of the kit (the crate's unit tests
//! include `layer.rs` by path, without the registry and image builders).
/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip (the common case).
    Gzip,
    /// zstd.
    Zstd,
}

/// Manifest flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// OCI image manifest / index.
    #[default]
    Oci,
    /// Docker image manifest v2 schema 2 / manifest list.
    Docker,
}

impl Format {
    /// The media type of an image manifest.
    pub fn manifest_type(self) -> &'static str {
        match self {
            Format::Oci => "application/vnd.oci.image.manifest.v1+json",
            Format::Docker => "application/vnd.docker.distribution.manifest.v2+json",
        }
    }

    /// The media type of an image config.
    pub fn config_type(self) -> &'static str {
        match self {
            Format::Oci => "application/vnd.oci.image.config.v1+json",
            Format::Docker => "application/vnd.docker.container.image.v1+json",
        }
    }

    /// The media type of an index (manifest list).
    pub fn index_type(self) -> &'static str {
        match self {
            Format::Oci => "application/vnd.oci.image.index.v1+json",
            Format::Docker => "application/vnd.docker.distribution.manifest.list.v2+json",
        }
    }

    /// The media type of a layer blob compressed with `compression`.
    pub fn layer_type(self, compression: Compression) -> &'static str {
        match (self, compression) {
            (Format::Oci, Compression::None) => "application/vnd.oci.image.layer.v1.tar",
            (Format::Oci, Compression::Gzip) => "application/vnd.oci.image.layer.v1.tar+gzip",
            // Docker schema 2 has no zstd type; everyone uses the OCI one.
            (_, Compression::Zstd) => "application/vnd.oci.image.layer.v1.tar+zstd",
            (Format::Docker, Compression::None) => "application/vnd.docker.image.rootfs.diff.tar",
            (Format::Docker, Compression::Gzip) => {
                "application/vnd.docker.image.rootfs.diff.tar.gzip"
            }
        }
    }
}
