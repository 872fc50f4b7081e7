//! Talking to a registry with oci-client: resolving a reference to one
//! platform's image manifest (through an index when there is one) and
//! streaming blobs to files while hashing them.
//!
//! Digests are checked here, on the bytes received: the manifest against
//! the reference's digest or the index entry, every blob against its
//! descriptor. Nothing unverified leaves this module under its final name.
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::Client;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use super::auth::{AuthError, RegistryAuth};
use super::reference::{is_loopback_registry, ImageReference};
use super::store::ImageErrorKind;

/// Manifests and indexes this client accepts.
const ACCEPTED_MANIFESTS: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];
/// An image config is small JSON; refuse to buffer anything absurd.
const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// A manifest is small JSON too.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Errors talking to a registry.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The registry (or the network) said no.
    #[error("registry {registry}: {message}")]
    Registry {
        /// Registry host.
        registry: String,
        /// What went wrong, for a user.
        message: String,
        /// How to classify it.
        kind: ImageErrorKind,
        /// The client error (its chain is already in `message`).
        error: Box<OciDistributionError>,
    },
    /// The credentials cannot be used.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Bytes received do not hash to the digest that names them.
    #[error("{what} {expected}: digest mismatch (got {actual}); the registry served corrupt data")]
    DigestMismatch {
        /// What was fetched (manifest, config, layer).
        what: &'static str,
        /// The digest asked for.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// The index has no image for this host.
    #[error("{reference}: no image for platform {wanted} in the index; it offers: {available}")]
    NoMatchingPlatform {
        /// The reference.
        reference: String,
        /// `linux/amd64`.
        wanted: String,
        /// What the index lists, comma-separated.
        available: String,
    },
    /// The manifest is not something we can run.
    #[error("{reference}: unsupported manifest: {reason}")]
    BadManifest {
        /// The reference.
        reference: String,
        /// Why.
        reason: String,
    },
    /// Writing a blob failed.
    #[error("writing blob {digest}: {source}")]
    Io {
        /// The blob.
        digest: String,
        /// The error.
        source: std::io::Error,
    },
    /// A CA bundle cannot be read.
    #[error("cannot read CA bundle {path}: {source}")]
    CaBundle {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl PullError {
    /// How the store and the server should treat this error.
    pub fn kind(&self) -> ImageErrorKind {
        match self {
            PullError::Registry { kind, .. } => *kind,
            PullError::Auth(_) => ImageErrorKind::Unauthorized,
            PullError::DigestMismatch { .. } => ImageErrorKind::Corrupt,
            PullError::NoMatchingPlatform { .. } => ImageErrorKind::NotFound,
            PullError::BadManifest { .. } => ImageErrorKind::Corrupt,
            PullError::Io { .. } => ImageErrorKind::Io,
            PullError::CaBundle { .. } => ImageErrorKind::InvalidArgument,
        }
    }
}

/// A content descriptor as found in manifests and indexes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
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
pub struct Manifest {
    /// The config blob.
    pub config: BlobRef,
    /// Layer blobs, bottom first.
    pub layers: Vec<BlobRef>,
}

/// A resolved platform manifest.
#[derive(Debug, Clone)]
pub struct ResolvedManifest {
    /// Its raw bytes (what its digest is of).
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    /// Parsed.
    pub manifest: Manifest,
}

#[derive(Debug, Deserialize)]
struct RawManifest {
    #[serde(rename = "schemaVersion", default)]
    schema_version: u32,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    config: Option<BlobRef>,
    layers: Option<Vec<BlobRef>>,
    manifests: Option<Vec<IndexEntry>>,
}

#[derive(Debug, Deserialize)]
struct IndexEntry {
    digest: String,
    #[serde(rename = "mediaType", default)]
    media_type: String,
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    os: String,
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// The host platform in OCI terms: (`linux`, `amd64`).
pub fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    (std::env::consts::OS, arch)
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// One pull's connection to one registry. A client per pull, because
/// oci-client caches the first credentials it sees per registry and calls
/// may carry different ones.
pub struct Puller {
    client: Client,
    auth: oci_client::secrets::RegistryAuth,
    registry: String,
}

/// Connection settings shared by every pull.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Registries reached over plain HTTP besides loopback ones.
    pub insecure_registries: Vec<String>,
    /// Extra trusted CAs (PEM blocks).
    pub extra_roots: Vec<Vec<u8>>,
}

impl ConnectOptions {
    /// Reads the PEM CA bundle at `path` (each certificate separately:
    /// reqwest's PEM parser takes one certificate at a time).
    pub fn load_ca_bundle(&mut self, path: &Path) -> Result<(), PullError> {
        let text = std::fs::read_to_string(path).map_err(|source| PullError::CaBundle {
            path: path.to_path_buf(),
            source,
        })?;
        const END: &str = "-----END CERTIFICATE-----";
        let mut rest = text.as_str();
        while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
            let Some(end) = rest[start..].find(END) else {
                break;
            };
            let block = &rest[start..start + end + END.len()];
            self.extra_roots.push(format!("{block}\n").into_bytes());
            rest = &rest[start + end + END.len()..];
        }
        if self.extra_roots.is_empty() {
            return Err(PullError::CaBundle {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "no PEM certificate in it",
                ),
            });
        }
        Ok(())
    }

    fn is_insecure(&self, registry: &str) -> bool {
        is_loopback_registry(registry)
            || self
                .insecure_registries
                .iter()
                .any(|r| r.eq_ignore_ascii_case(registry))
    }
}

impl Puller {
    /// A client for `reference`'s registry with `auth`.
    pub fn new(
        reference: &ImageReference,
        auth: &RegistryAuth,
        options: &ConnectOptions,
    ) -> Result<Self, PullError> {
        let registry = reference.registry_host().to_string();
        let protocol = if options.is_insecure(&reference.registry) {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            extra_root_certificates: options
                .extra_roots
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(15)),
            read_timeout: Some(Duration::from_secs(120)),
            ..Default::default()
        };
        let client = Client::try_from(config).map_err(|e| classify(&registry, e))?;
        Ok(Puller {
            client,
            auth: auth.to_oci()?,
            registry,
        })
    }

    /// Resolves `reference` to the host platform's image manifest.
    pub async fn resolve(&self, reference: &ImageReference) -> Result<ResolvedManifest, PullError> {
        let (bytes, digest) = self.fetch_manifest(&reference.to_oci()).await?;
        if let Some(want) = &reference.digest {
            check_digest("manifest", want, &digest)?;
        }
        let raw = parse_raw(reference, &bytes)?;
        match raw.manifests {
            Some(entries) => {
                let chosen = choose_platform(reference, &entries)?;
                let (bytes, digest) = self.fetch_manifest(&reference.with_digest(&chosen)).await?;
                check_digest("manifest", &chosen, &digest)?;
                let raw = parse_raw(reference, &bytes)?;
                if raw.manifests.is_some() {
                    return Err(bad(reference, "an index nested in an index"));
                }
                Ok(ResolvedManifest {
                    manifest: to_manifest(reference, raw)?,
                    bytes,
                    digest,
                })
            }
            None => Ok(ResolvedManifest {
                manifest: to_manifest(reference, raw)?,
                bytes,
                digest,
            }),
        }
    }

    /// Fetches a manifest and hashes the bytes received.
    async fn fetch_manifest(
        &self,
        reference: &oci_client::Reference,
    ) -> Result<(Vec<u8>, String), PullError> {
        let (bytes, _) = self
            .client
            .pull_manifest_raw(reference, &self.auth, ACCEPTED_MANIFESTS)
            .await
            .map_err(|e| classify(&self.registry, e))?;
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(PullError::BadManifest {
                reference: reference.whole(),
                reason: format!("{} bytes is too large for a manifest", bytes.len()),
            });
        }
        let digest = sha256_digest(&bytes);
        Ok((bytes.to_vec(), digest))
    }

    /// Fetches a small blob (the config) into memory and verifies it.
    pub async fn fetch_config(
        &self,
        reference: &ImageReference,
        blob: &BlobRef,
    ) -> Result<Vec<u8>, PullError> {
        if blob.size > MAX_CONFIG_BYTES {
            return Err(bad(reference, "config blob larger than 16 MiB"));
        }
        let mut data = Vec::with_capacity(blob.size as usize);
        let mut stream = self.blob_stream(reference, blob).await?;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) if is_digest_error(&e) => break,
                Err(e) => return Err(self.stream_error(blob, e)),
            };
            data.extend_from_slice(&chunk);
            if data.len() as u64 > MAX_CONFIG_BYTES {
                return Err(bad(reference, "config blob larger than 16 MiB"));
            }
        }
        check_digest("config", &blob.digest, &sha256_digest(&data))?;
        Ok(data)
    }

    /// Streams a blob into `file` (created, truncated), hashing as it
    /// writes; `on_bytes` is told of every chunk, and `tee` (when given)
    /// gets a copy of every chunk, e.g. for an extractor working while the
    /// download goes on. A tee whose receiver is gone is dropped and the
    /// download continues, so a digest mismatch is still found and reported
    /// as such. Errors on a digest mismatch: the caller then discards the
    /// file and anything made from the tee.
    pub async fn fetch_blob_to_file(
        &self,
        reference: &ImageReference,
        blob: &BlobRef,
        file: &Path,
        on_bytes: &(dyn Fn(u64) + Send + Sync),
        mut tee: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
    ) -> Result<u64, PullError> {
        let io_err = |source| PullError::Io {
            digest: blob.digest.clone(),
            source,
        };
        let out = tokio::fs::File::create(file).await.map_err(io_err)?;
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, out);
        let mut hasher = Sha256::new();
        let mut written = 0u64;
        let mut stream = self.blob_stream(reference, blob).await?;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // oci-client verifies too and fails at the end of the
                // stream; our own comparison below reports it with both digests.
                Err(e) if is_digest_error(&e) => break,
                Err(e) => return Err(self.stream_error(blob, e)),
            };
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(io_err)?;
            written += chunk.len() as u64;
            on_bytes(chunk.len() as u64);
            if let Some(sender) = &tee {
                if sender.send(chunk).await.is_err() {
                    tee = None;
                }
            }
        }
        drop(tee);
        out.flush().await.map_err(io_err)?;
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        check_digest("layer", &blob.digest, &actual)?;
        Ok(written)
    }

    async fn blob_stream(
        &self,
        reference: &ImageReference,
        blob: &BlobRef,
    ) -> Result<oci_client::client::SizedStream, PullError> {
        let oci_ref = reference.to_oci();
        // Blob requests reuse the auth the manifest request stored.
        self.client
            .store_auth_if_needed(oci_ref.resolve_registry(), &self.auth)
            .await;
        let descriptor = oci_client::manifest::OciDescriptor {
            media_type: blob.media_type.clone(),
            digest: blob.digest.clone(),
            size: blob.size as i64,
            ..Default::default()
        };
        self.client
            .pull_blob_stream(&oci_ref, &descriptor)
            .await
            .map_err(|e| classify(&self.registry, e))
    }

    fn stream_error(&self, blob: &BlobRef, e: std::io::Error) -> PullError {
        PullError::Registry {
            registry: self.registry.clone(),
            message: format!("reading blob {}: {e}", blob.digest),
            kind: ImageErrorKind::Unavailable,
            error: Box::new(OciDistributionError::IoError(e)),
        }
    }
}

/// Whether a blob stream error is oci-client's own digest check.
fn is_digest_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>())
}

fn bad(reference: &ImageReference, reason: &str) -> PullError {
    PullError::BadManifest {
        reference: reference.to_string(),
        reason: reason.to_string(),
    }
}

fn check_digest(what: &'static str, expected: &str, actual: &str) -> Result<(), PullError> {
    if expected == actual {
        Ok(())
    } else {
        Err(PullError::DigestMismatch {
            what,
            expected: expected.to_string(),
            actual: actual.to_string(),
        })
    }
}

fn parse_raw(reference: &ImageReference, bytes: &[u8]) -> Result<RawManifest, PullError> {
    let raw: RawManifest = serde_json::from_slice(bytes)
        .map_err(|e| bad(reference, &format!("not a manifest: {e}")))?;
    if raw.schema_version != 2 {
        return Err(bad(
            reference,
            &format!(
                "schema version {} (only Docker schema 2 and OCI are supported)",
                raw.schema_version
            ),
        ));
    }
    Ok(raw)
}

fn to_manifest(reference: &ImageReference, raw: RawManifest) -> Result<Manifest, PullError> {
    if let Some(mt) = &raw.media_type {
        if mt != OCI_IMAGE_MEDIA_TYPE && mt != IMAGE_MANIFEST_MEDIA_TYPE {
            return Err(bad(reference, &format!("media type {mt}")));
        }
    }
    let config = raw
        .config
        .ok_or_else(|| bad(reference, "no config descriptor"))?;
    let layers = raw.layers.unwrap_or_default();
    for blob in std::iter::once(&config).chain(&layers) {
        if !is_sha256_digest(&blob.digest) {
            return Err(bad(reference, &format!("bad digest {:?}", blob.digest)));
        }
    }
    Ok(Manifest { config, layers })
}

/// `sha256:` and 64 lower-case hex digits: the digest is also a file name.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Picks the host's image from an index: same os and architecture; on arm
/// the variant too when the index names one (`v8` for arm64 is implied).
fn choose_platform(
    reference: &ImageReference,
    entries: &[IndexEntry],
) -> Result<String, PullError> {
    let (os, arch) = host_platform();
    let matches = |p: &Platform| p.os == os && p.architecture == arch;
    let candidates: Vec<&IndexEntry> = entries
        .iter()
        .filter(|e| e.platform.as_ref().is_some_and(matches))
        .filter(|e| e.media_type != "application/vnd.in-toto+json")
        .collect();
    // Prefer an entry without a variant or the default one for the arch.
    let best = candidates
        .iter()
        .find(|e| {
            e.platform.as_ref().is_some_and(|p| {
                p.variant.is_none() || (arch == "arm64" && p.variant.as_deref() == Some("v8"))
            })
        })
        .or_else(|| candidates.first());
    match best {
        Some(entry) => Ok(entry.digest.clone()),
        None => {
            let available: Vec<String> = entries
                .iter()
                .map(|e| match &e.platform {
                    Some(p) => p.to_string(),
                    None => format!("(no platform) {}", e.digest),
                })
                .collect();
            Err(PullError::NoMatchingPlatform {
                reference: reference.to_string(),
                wanted: format!("{os}/{arch}"),
                available: if available.is_empty() {
                    "nothing".to_string()
                } else {
                    available.join(", ")
                },
            })
        }
    }
}

/// Turns an oci-client error into ours, with a message a user can act on.
fn classify(registry: &str, e: OciDistributionError) -> PullError {
    use ImageErrorKind as K;
    let (kind, message) = match &e {
        OciDistributionError::AuthenticationFailure(reason) => (
            K::Unauthorized,
            format!("authentication failed: {reason}; check the pull credentials"),
        ),
        OciDistributionError::UnauthorizedError { url } => (
            K::Unauthorized,
            format!("unauthorized (HTTP 401) for {url}; check the pull credentials"),
        ),
        OciDistributionError::ImageManifestNotFoundError(m) => {
            (K::NotFound, format!("not found: {m}"))
        }
        OciDistributionError::RegistryError { envelope, url } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            let kind = if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                K::NotFound
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                K::Unauthorized
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::NameInvalid | OciErrorCode::TagInvalid))
            {
                K::InvalidArgument
            } else {
                K::Unavailable
            };
            let detail: Vec<String> = envelope
                .errors
                .iter()
                .map(|e| format!("{:?}: {}", e.code, e.message))
                .collect();
            let hint = match kind {
                K::NotFound => " (image or tag not found)",
                K::Unauthorized => "; check the pull credentials",
                _ => "",
            };
            (kind, format!("{} for {url}{hint}", detail.join("; ")))
        }
        OciDistributionError::ServerError { code, url, message } => {
            let kind = match code {
                401 | 403 => K::Unauthorized,
                404 => K::NotFound,
                400..=499 => K::InvalidArgument,
                _ => K::Unavailable,
            };
            (kind, format!("HTTP {code} for {url}: {}", message.trim()))
        }
        OciDistributionError::DigestError(d) => (K::Corrupt, format!("digest: {d}")),
        OciDistributionError::RequestError(r) => {
            let mut msg = format!("cannot reach the registry: {r}");
            let mut source = std::error::Error::source(r);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            (K::Unavailable, msg)
        }
        other => (K::Unavailable, other.to_string()),
    };
    PullError::Registry {
        registry: registry.to_string(),
        message,
        kind,
        error: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> ImageReference {
        ImageReference::parse("127.0.0.1:5000/fn:v1", "").unwrap()
    }

    fn entry(os: &str, arch: &str, variant: Option<&str>, digest: &str) -> IndexEntry {
        IndexEntry {
            digest: digest.to_string(),
            media_type: OCI_IMAGE_MEDIA_TYPE.to_string(),
            platform: Some(Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
            }),
        }
    }

    #[test]
    fn chooses_the_host_platform() {
        let (os, arch) = host_platform();
        let entries = vec![
            entry("linux", "s390x", None, "sha256:a"),
            entry(os, arch, None, "sha256:b"),
        ];
        assert_eq!(choose_platform(&reference(), &entries).unwrap(), "sha256:b");
    }

    #[test]
    fn no_matching_platform_lists_what_is_offered() {
        let entries = vec![
            entry("linux", "s390x", None, "sha256:a"),
            entry("windows", "riscv", Some("x"), "sha256:b"),
        ];
        let err = choose_platform(&reference(), &entries).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("linux/s390x"), "{msg}");
        assert!(msg.contains("windows/riscv/x"), "{msg}");
        assert_eq!(err.kind(), ImageErrorKind::NotFound);
    }

    #[test]
    fn docker_and_oci_manifests_parse() {
        let docker = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
          "config":{"mediaType":"application/vnd.docker.container.image.v1+json","size":1,"digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"},
          "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","size":2,"digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111"}]}"#;
        let raw = parse_raw(&reference(), docker).unwrap();
        let m = to_manifest(&reference(), raw).unwrap();
        assert_eq!(m.layers.len(), 1);
        assert_eq!(m.layers[0].size, 2);
        let v1 = br#"{"schemaVersion":1,"name":"x"}"#;
        assert!(parse_raw(&reference(), v1).is_err());
        let traversal =
            br#"{"schemaVersion":2,"config":{"size":1,"digest":"sha256:../../etc"},"layers":[]}"#;
        let raw = parse_raw(&reference(), traversal).unwrap();
        assert!(to_manifest(&reference(), raw).is_err());
    }

    #[test]
    fn ca_bundle_splits_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(
            &path,
            "x\n-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n\
             -----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let mut options = ConnectOptions::default();
        options.load_ca_bundle(&path).unwrap();
        assert_eq!(options.extra_roots.len(), 2);
        std::fs::write(&path, "nothing").unwrap();
        let mut options = ConnectOptions::default();
        assert!(options.load_ca_bundle(&path).is_err());
    }

    #[test]
    fn loopback_and_named_registries_are_insecure() {
        let options = ConnectOptions {
            insecure_registries: vec!["reg.internal:5000".into()],
            ..Default::default()
        };
        assert!(options.is_insecure("127.0.0.1:5000"));
        assert!(options.is_insecure("localhost"));
        assert!(options.is_insecure("[::1]:80"));
        assert!(options.is_insecure("reg.internal:5000"));
        assert!(!options.is_insecure("ghcr.io"));
    }
}
