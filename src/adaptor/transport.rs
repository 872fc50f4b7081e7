//! What the adaptor serves over the gRPC layer: both service versions,
//! with mTLS (client certificates required, as Crossplane's function SDKs
//! serve; the handshake done by the gRPC layer, [`crate::grpc::sni`]) or
//! plaintext.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::service::AdaptorService;
use super::Adaptor;
use crate::grpc::raw;
use crate::grpc::serve::ServiceSet;

/// Errors of loading the adaptor's TLS.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A TLS file could not be read (`source`), or holds no PEM `what`.
    #[error("cannot read a PEM {what} from {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// Why it could not be read.
        source: Option<std::io::Error>,
    },
    /// rustls refused the configuration (a key not the certificate's).
    #[error("cannot build the TLS configuration")]
    Config(#[from] rustls::Error),
    /// The client verifier could not be built from `ca.crt`.
    #[error("cannot verify client certificates against the CA")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Transport security.
#[derive(Debug, Clone)]
pub(crate) enum Security {
    /// mTLS: the server identity, clients verified against the CA.
    MutualTls(Arc<rustls::ServerConfig>),
    /// Plaintext (`--insecure`).
    Insecure,
}

/// The PEM file `name` in `dir`, which should hold a `what`, and its path.
fn read(dir: &Path, name: &str, what: &'static str) -> Result<(PathBuf, Vec<u8>), TlsError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(pem) => Ok((path, pem)),
        Err(source) => Err(TlsError::File {
            path,
            what,
            source: Some(source),
        }),
    }
}

/// Every certificate of the PEM file `name` in `dir`; none is an error.
fn certificates(dir: &Path, name: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let what = "certificate";
    let (path, pem) = read(dir, name, what)?;
    match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        _ => Err(TlsError::File {
            path,
            what,
            source: None,
        }),
    }
}

/// mTLS from `dir` (`tls.crt`, `tls.key`, `ca.crt`, the layout Crossplane
/// mounts): clients must present a certificate the CA signed. rustls speaks
/// TLS 1.2 and 1.3 only.
pub(crate) fn mutual_tls(dir: &Path) -> Result<Security, TlsError> {
    let chain = certificates(dir, "tls.crt")?;
    let what = "private key";
    let (path, key_pem) = read(dir, "tls.key", what)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::File {
        path,
        what,
        source: None,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in certificates(dir, "ca.crt")? {
        roots.add(ca)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = crate::grpc::sni::mutual_tls::<TlsError>(Arc::new(roots), &provider, chain, key)?;
    Ok(Security::MutualTls(config))
}

/// v1 and v1beta1 over `adaptor`, refusing requests over
/// `max_recv_message_size` bytes, under `security`.
pub(crate) fn services(
    adaptor: Arc<Adaptor>,
    max_recv_message_size: usize,
    security: Security,
) -> ServiceSet {
    let service = Arc::new(AdaptorService(adaptor));
    let services = ServiceSet::new()
        .with_service(raw::Server::<raw::V1, _>::new(
            Arc::clone(&service),
            max_recv_message_size,
        ))
        .with_service(raw::Server::<raw::V1beta1, _>::new(
            service,
            max_recv_message_size,
        ));
    match security {
        Security::MutualTls(tls) => services.with_tls(tls),
        Security::Insecure => services,
    }
}
