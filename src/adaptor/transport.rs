//! What the adaptor serves over the gRPC layer: both service versions,
//! with mTLS (client certificates required, as Crossplane's function SDKs
//! serve; the handshake done by the gRPC layer, [`crate::grpc::sni`]) or
//! plaintext.
use std::path::Path;
use std::sync::Arc;

use super::service::AdaptorService;
use super::Adaptor;
use crate::grpc::raw;
use crate::grpc::serve::ServiceSet;
use crate::pem::{self, PemError};

/// Errors of loading the adaptor's TLS.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A TLS file could not be read, or holds no PEM of what it should.
    #[error(transparent)]
    Pem(#[from] PemError),
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

/// mTLS from `dir` (`tls.crt`, `tls.key`, `ca.crt`, the layout Crossplane
/// mounts): clients must present a certificate the CA signed. rustls speaks
/// TLS 1.2 and 1.3 only.
pub(crate) fn mutual_tls(dir: &Path) -> Result<Security, TlsError> {
    let chain = pem::certificates(&dir.join("tls.crt"))?;
    let key = pem::private_key(&dir.join("tls.key"))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in pem::certificates(&dir.join("ca.crt"))? {
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
