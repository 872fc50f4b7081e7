//! The host's TLS: a server certificate per routing name, issued at start
//! (and at `host`) from the CA it is given (Crossplane's `crossplane-root-ca`:
//! `tls.crt`, `tls.key`), and client certificates required and verified
//! against that same CA, as Crossplane's Deployment runtime sets a
//! Function up. Each name gets a config of its own, so the certificate a
//! client sees always names what it dialled.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Errors of the host's TLS.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A CA file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The CA certificate or key does not parse.
    #[error("{path} is no PEM {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
    /// Issuing a certificate failed.
    #[error("cannot issue a server certificate")]
    Issue(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("cannot build the TLS configuration")]
    Config(#[from] rustls::Error),
    /// The client verifier could not be built.
    #[error("cannot verify client certificates against the CA")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The CA the host issues server certificates from and verifies clients by.
pub(crate) struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    roots: Arc<RootCertStore>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn read(dir: &Path, name: &str) -> Result<(PathBuf, String), TlsError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok((path, text)),
        Err(source) => Err(TlsError::Read { path, source }),
    }
}

impl Ca {
    /// Loads `dir/tls.crt` and `dir/tls.key` (RSA or ECDSA, PKCS#1, SEC1
    /// or PKCS#8 PEM).
    pub(crate) fn load(dir: &Path) -> Result<Self, TlsError> {
        let (cert_path, cert_pem) = read(dir, "tls.crt")?;
        let (key_path, key_pem) = read(dir, "tls.key")?;
        let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|_| TlsError::Pem {
            path: key_path,
            what: "private key",
        })?;
        let ca_der =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| TlsError::Pem {
                path: cert_path.clone(),
                what: "certificate",
            })?;
        let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der, key).map_err(|_| TlsError::Pem {
            path: cert_path.clone(),
            what: "CA certificate",
        })?;
        let mut roots = RootCertStore::empty();
        roots.add(ca_der).map_err(TlsError::Config)?;
        Ok(Self {
            issuer,
            roots: Arc::new(roots),
            provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        })
    }

    /// A TLS configuration presenting a certificate for `names` (issued
    /// now, ECDSA P-256), requiring a client certificate this CA signed,
    /// speaking HTTP/2 only (ALPN `h2`, which gRPC clients require).
    pub(crate) fn server_config(&self, names: &[String]) -> Result<Arc<ServerConfig>, TlsError> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(names.to_vec())?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, first.clone());
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&self.roots),
            Arc::clone(&self.provider),
        )
        .build()?;
        let key = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|_| TlsError::Issue(rcgen::Error::CouldNotParseKeyPair))?;
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert.der().clone()], key)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}
