//! Content descriptors and the manifest shape the store keeps: the
//! vocabulary the registry client produces and the store reads back, kept
//! apart from both so neither depends on the other.
use serde::{Deserialize, Serialize};

/// A content descriptor as found in manifests and indexes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BlobRef {
    /// Media type (may be empty in old Docker manifests).
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// The parts of an image manifest (OCI or Docker schema 2) the store uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// The config blob.
    pub config: BlobRef,
    /// Layer blobs, bottom first.
    pub layers: Vec<BlobRef>,
}

impl Manifest {
    /// A stored manifest's bytes, parsed for what the store uses.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        #[derive(Deserialize)]
        struct Stored {
            config: BlobRef,
            layers: Vec<BlobRef>,
        }
        serde_json::from_slice::<Stored>(bytes).map(|stored| Manifest {
            config: stored.config,
            layers: stored.layers,
        })
    }
}

/// `sha256:` and 64 lower-case hex digits: the digest is also a file name.
pub(crate) fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// `sha256:<hex>` of `data`.
pub(crate) fn sha256_digest(data: &[u8]) -> String {
    use sha2::{Digest as _, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}
