//! The host's TLS: a server certificate per routing name, issued at start
//! (and at `host`) from the CA it is given (Crossplane's `crossplane-root-ca`:
//! `tls.crt`, `tls.key`), and client certificates required and verified
//! against that same CA, as Crossplane's Deployment runtime sets a
//! Function up. Each name gets a config of its own, so the certificate a
//! client sees always names what it dialled.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::PrivateKeyDer;

use crate::pem::{self, PemError};

/// Errors of the host's TLS.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A CA file could not be read, or holds no PEM of what it should.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// Issuing a certificate failed.
    #[error("cannot issue a server certificate")]
    Issue(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("cannot build the TLS configuration")]
    Config(#[from] rustls::Error),
    /// The client verifier could not be built.
    #[error("cannot verify client certificates against the CA")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// `tls.key` is not the key of `tls.crt`: every certificate issued
    /// from it would fail every client's verification.
    #[error("{key} is not the private key of {cert}: the certificates issued from it would fail every handshake")]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
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

/// Warns when the CA key can be read by users other than its owner: with
/// it anyone on the node can mint a certificate every Function trusts.
/// Kubernetes mounts a Secret 0644 unless `defaultMode` says otherwise
/// (deploy/host sets 0400).
fn warn_if_shared(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %key.display(),
                mode = format_args!("{mode:04o}"),
                "the CA key is readable by other users: anyone who reads it can mint certificates \
                 every Function trusts (chmod 0400, or a Secret volume's defaultMode: 0400)"
            );
        }
    }
}

impl Ca {
    /// Loads `dir/tls.crt` and `dir/tls.key` (RSA or ECDSA, PKCS#1, SEC1
    /// or PKCS#8 PEM).
    pub(crate) fn load(dir: &Path) -> Result<Self, TlsError> {
        let cert_path = dir.join("tls.crt");
        let key_path = dir.join("tls.key");
        let no_pem = |path: &Path, what| {
            TlsError::Pem(PemError::NoPem {
                path: path.to_path_buf(),
                what,
            })
        };
        // The first certificate is the CA's (a chain may follow it).
        let Some(ca_der) = pem::certificates(&cert_path)?.into_iter().next() else {
            return Err(no_pem(&cert_path, "certificate"));
        };
        let key = rcgen::KeyPair::try_from(&pem::private_key(&key_path)?)
            .map_err(|_| no_pem(&key_path, "RSA or ECDSA private key"))?;
        let public_key = x509_parser::parse_x509_certificate(&ca_der)
            .map(|(_, cert)| cert.public_key().subject_public_key.data.to_vec())
            .map_err(|_| no_pem(&cert_path, "CA certificate"))?;
        if public_key != rcgen::PublicKeyData::der_bytes(&key) {
            return Err(TlsError::KeyMismatch {
                key: key_path,
                cert: cert_path,
            });
        }
        warn_if_shared(&key_path);
        let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der, key)
            .map_err(|_| no_pem(&cert_path, "CA certificate"))?;
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
        let key = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|_| TlsError::Issue(rcgen::Error::CouldNotParseKeyPair))?;
        let chain = vec![cert.der().clone()];
        crate::grpc::sni::mutual_tls(Arc::clone(&self.roots), &self.provider, chain, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_ca(dir: &Path, signer: &rcgen::KeyPair, written: &rcgen::KeyPair) {
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(signer).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("tls.key"), written.serialize_pem())
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_ca_whose_key_is_its_certificates_loads_and_another_key_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let other = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));

        write_ca(dir.path(), &ca_key, &ca_key);
        assert!(Ca::load(dir.path()).is_ok());

        write_ca(dir.path(), &ca_key, &other);
        match Ca::load(dir.path()) {
            Err(TlsError::KeyMismatch { key, cert }) => {
                assert!(key.ends_with("tls.key") && cert.ends_with("tls.crt"));
            }
            other => panic!("a key of another pair must be refused: {other:?}"),
        }
    }
}
