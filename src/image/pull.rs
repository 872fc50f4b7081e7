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
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use super::auth::{AuthError, RegistryAuth};
use super::kind::ImageErrorKind;
use super::reference::{is_loopback_registry, ImageReference};

mod manifest;

pub(crate) use super::descriptor::{sha256_digest, BlobRef, Manifest};
use manifest::{bad, choose_platform, parse_raw, to_manifest};

/// Manifests and indexes this client accepts.
const ACCEPTED_MANIFESTS: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];
/// An image config is small JSON; refuse to buffer anything absurd.
const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// A manifest is small JSON too (the limit Distribution itself applies).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// How long to wait for a registry to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a registry may go silent mid-response.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

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
    /// The registry sent more than a bound allows.
    #[error("{what} from {registry} is larger than {limit} bytes; refused")]
    TooLarge {
        /// What (`manifest`, `config`, `layer sha256:…`).
        what: String,
        /// The registry.
        registry: String,
        /// The bound.
        limit: u64,
    },
    /// A blob's length is not the one its descriptor gives.
    #[error("blob {digest}: the registry sent {got} bytes, its descriptor says {expected}")]
    SizeMismatch {
        /// The blob.
        digest: String,
        /// The descriptor's size.
        expected: u64,
        /// What arrived (at least; a longer blob is cut off when it passes).
        got: String,
    },
    /// The download was stopped because its extraction refused the layer.
    #[error("blob {digest}: download stopped, its layer was refused")]
    Stopped {
        /// The blob.
        digest: String,
    },
    /// Writing a blob failed.
    #[error("writing blob {digest}")]
    Io {
        /// The blob.
        digest: String,
        /// The error.
        source: std::io::Error,
    },
    /// A CA bundle cannot be read, or holds no certificate.
    #[error("cannot load the registry CA bundle")]
    CaBundle(#[source] crate::pem::PemError),
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
            PullError::TooLarge { .. } => ImageErrorKind::TooLarge,
            PullError::SizeMismatch { .. } => ImageErrorKind::Corrupt,
            PullError::Stopped { .. } => ImageErrorKind::TooLarge,
            PullError::CaBundle { .. } => ImageErrorKind::InvalidArgument,
        }
    }
}

/// A resolved platform manifest.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedManifest {
    /// Its raw bytes (what its digest is of).
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    /// Parsed.
    pub manifest: Manifest,
}

/// One pull's connection to one registry. A client per pull, because
/// oci-client caches the first credentials it sees per registry and calls
/// may carry different ones.
pub(crate) struct Puller {
    client: Client,
    /// For manifests, read with a bound (oci-client reads them whole).
    http: reqwest::Client,
    scheme: &'static str,
    auth: oci_client::secrets::RegistryAuth,
    registry: String,
}

/// Connection settings shared by every pull.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectOptions {
    /// Registries reached over plain HTTP besides loopback ones.
    pub insecure_registries: Vec<String>,
    /// Extra trusted CAs (DER).
    pub extra_roots: Vec<Vec<u8>>,
}

impl ConnectOptions {
    /// Trusts every certificate of the PEM CA bundle at `path` too.
    pub(crate) fn load_ca_bundle(&mut self, path: &Path) -> Result<(), PullError> {
        let certificates = crate::pem::certificates(path).map_err(PullError::CaBundle)?;
        self.extra_roots
            .extend(certificates.into_iter().map(|der| der.to_vec()));
        Ok(())
    }

    /// The one registry client every pull and push uses: plain HTTP for
    /// insecure registries, the extra CAs, connect and read timeouts.
    pub(crate) fn oci_client(&self, reference: &ImageReference) -> Result<Client, PullError> {
        let protocol = if self.is_insecure(&reference.registry) {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            extra_root_certificates: self
                .extra_roots
                .iter()
                .map(|der| Certificate {
                    encoding: CertificateEncoding::Der,
                    data: der.clone(),
                })
                .collect(),
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..Default::default()
        };
        Client::try_from(config).map_err(|e| classify(reference.registry_host(), e))
    }

    /// A plain HTTP client with the same trust and timeouts.
    fn http_client(&self, registry: &str) -> Result<reqwest::Client, PullError> {
        let mut roots = Vec::new();
        for der in &self.extra_roots {
            let cert = reqwest::Certificate::from_der(der)
                .map_err(|e| classify(registry, OciDistributionError::RequestError(e)))?;
            roots.push(cert);
        }
        reqwest::Client::builder()
            .tls_certs_merge(roots)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| classify(registry, OciDistributionError::RequestError(e)))
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
    pub(crate) fn new(
        reference: &ImageReference,
        auth: &RegistryAuth,
        options: &ConnectOptions,
    ) -> Result<Self, PullError> {
        let registry = reference.registry_host().to_string();
        Ok(Puller {
            client: options.oci_client(reference)?,
            http: options.http_client(&registry)?,
            scheme: if options.is_insecure(&reference.registry) {
                "http"
            } else {
                "https"
            },
            auth: auth.to_oci()?,
            registry,
        })
    }

    /// Resolves `reference` to the host platform's image manifest.
    pub(crate) async fn resolve(
        &self,
        reference: &ImageReference,
    ) -> Result<ResolvedManifest, PullError> {
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

    /// Fetches a manifest, reading at most [`MAX_MANIFEST_BYTES`] (a
    /// registry sending more is cut off as it passes the bound, not read
    /// whole first), and hashes the bytes received. oci-client does the
    /// authentication handshake; the GET is ours because oci-client reads
    /// a manifest response whole.
    async fn fetch_manifest(
        &self,
        reference: &oci_client::Reference,
    ) -> Result<(Vec<u8>, String), PullError> {
        let classify = |e| classify(&self.registry, e);
        let token = self
            .client
            .auth(reference, &self.auth, oci_client::RegistryOperation::Pull)
            .await
            .map_err(classify)?;
        let url = format!(
            "{}://{}/v2/{}/manifests/{}",
            self.scheme,
            reference.resolve_registry(),
            reference.repository(),
            reference.digest().or(reference.tag()).unwrap_or("latest"),
        );
        let mut request = self
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, ACCEPTED_MANIFESTS.join(", "));
        match (token, &self.auth) {
            (Some(token), _) => request = request.bearer_auth(token),
            (None, oci_client::secrets::RegistryAuth::Basic(user, password)) => {
                request = request.basic_auth(user, Some(password))
            }
            _ => {}
        }
        let request_err = |e| classify(OciDistributionError::RequestError(e));
        let mut response = request.send().await.map_err(request_err)?;
        let status = response.status();
        let too_large = || PullError::TooLarge {
            what: format!("manifest {}", reference.whole()),
            registry: self.registry.clone(),
            limit: MAX_MANIFEST_BYTES,
        };
        if response
            .content_length()
            .is_some_and(|n| n > MAX_MANIFEST_BYTES)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_err)? {
            if (body.len() + chunk.len()) as u64 > MAX_MANIFEST_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(classify(registry_error(status.as_u16(), &url, &body)));
        }
        let digest = sha256_digest(&body);
        Ok((body, digest))
    }

    /// Fetches a small blob (the config) into memory and verifies it.
    pub(crate) async fn fetch_config(
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
            if data.len() as u64 > blob.size {
                return Err(PullError::SizeMismatch {
                    digest: blob.digest.clone(),
                    expected: blob.size,
                    got: format!("more than {}", blob.size),
                });
            }
        }
        // A short blob is refused by its length, as a layer is, before its
        // digest: the cause a user can act on (a truncating proxy or
        // registry), not "corrupt data".
        if data.len() as u64 != blob.size {
            return Err(PullError::SizeMismatch {
                digest: blob.digest.clone(),
                expected: blob.size,
                got: data.len().to_string(),
            });
        }
        check_digest("config", &blob.digest, &sha256_digest(&data))?;
        Ok(data)
    }

    /// Streams a blob into `file` (created, truncated), hashing as it
    /// writes, refusing more or fewer bytes than the descriptor's size;
    /// `on_bytes` is told of every chunk (`stop` asked after each: true
    /// ends the download with [`PullError::Stopped`]), and `tee` (when given)
    /// gets a copy of every chunk, e.g. for an extractor working while the
    /// download goes on. A tee whose receiver is gone is dropped and the
    /// download continues, so a digest mismatch is still found and reported
    /// as such. Errors on a digest mismatch: the caller then discards the
    /// file and anything made from the tee.
    pub(crate) async fn fetch_blob_to_file(
        &self,
        reference: &ImageReference,
        blob: &BlobRef,
        file: &Path,
        on_bytes: &(dyn Fn(u64) + Send + Sync),
        stop: &(dyn Fn() -> bool + Send + Sync),
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
            if written + chunk.len() as u64 > blob.size {
                return Err(PullError::SizeMismatch {
                    digest: blob.digest.clone(),
                    expected: blob.size,
                    got: format!("more than {}", blob.size),
                });
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(io_err)?;
            written += chunk.len() as u64;
            on_bytes(chunk.len() as u64);
            if stop() {
                return Err(PullError::Stopped {
                    digest: blob.digest.clone(),
                });
            }
            if let Some(sender) = &tee {
                if sender.send(chunk).await.is_err() {
                    tee = None;
                }
            }
        }
        drop(tee);
        if written != blob.size {
            return Err(PullError::SizeMismatch {
                digest: blob.digest.clone(),
                expected: blob.size,
                got: written.to_string(),
            });
        }
        out.flush().await.map_err(io_err)?;
        // On disk before the rename that publishes it (power loss).
        out.get_ref().sync_all().await.map_err(io_err)?;
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

/// The error a registry answered with: its JSON error envelope when it
/// sent one, else the status and the start of the body.
fn registry_error(code: u16, url: &str, body: &[u8]) -> OciDistributionError {
    match serde_json::from_slice::<oci_client::errors::OciEnvelope>(body) {
        Ok(envelope) if !envelope.errors.is_empty() => OciDistributionError::RegistryError {
            envelope,
            url: url.to_string(),
        },
        _ => OciDistributionError::ServerError {
            code,
            url: url.to_string(),
            message: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        },
    }
}

/// Whether a blob stream error is oci-client's own digest check.
fn is_digest_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>())
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

    #[test]
    fn every_certificate_of_a_ca_bundle_is_trusted_and_one_with_none_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        let certs: Vec<rcgen::Certificate> = (0..2)
            .map(|_| {
                let key = rcgen::KeyPair::generate().unwrap();
                let params =
                    rcgen::CertificateParams::new(vec!["registry.example".into()]).unwrap();
                params.self_signed(&key).unwrap()
            })
            .collect();
        let bundle: Vec<String> = certs.iter().map(rcgen::Certificate::pem).collect();
        std::fs::write(&path, bundle.join("a comment between\n")).unwrap();
        let mut options = ConnectOptions::default();
        options.load_ca_bundle(&path).unwrap();
        let ders: Vec<Vec<u8>> = certs.iter().map(|c| c.der().to_vec()).collect();
        assert_eq!(options.extra_roots, ders);
        std::fs::write(&path, "nothing").unwrap();
        let mut options = ConnectOptions::default();
        let err = options.load_ca_bundle(&path).unwrap_err();
        let text = crate::chain::Chain(&err).to_string();
        assert!(text.ends_with("ca.pem holds no PEM certificate"), "{text}");
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
