//! What the adaptor serves over the gRPC layer: both service versions,
//! with mTLS (client certificates required, as Crossplane's function SDKs
//! serve) or plaintext.
use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use super::service::AdaptorService;
use super::{Adaptor, AdaptorError};
use crate::grpc::raw;
use crate::grpc::serve::ServiceSet;

/// Transport security.
#[derive(Debug, Clone)]
pub(crate) enum Security {
    /// mTLS: server identity and the CA that signs client certificates.
    MutualTls(ServerTlsConfig),
    /// Plaintext (`--insecure`).
    Insecure,
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, AdaptorError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|source| AdaptorError::TlsFile { path, source })
}

/// mTLS from `dir` (`tls.crt`, `tls.key`, `ca.crt`, the layout Crossplane
/// mounts): clients must present a certificate the CA signed. rustls speaks
/// TLS 1.2 and 1.3 only.
pub(crate) fn mutual_tls(dir: &Path) -> Result<Security, AdaptorError> {
    let identity = Identity::from_pem(read(dir, "tls.crt")?, read(dir, "tls.key")?);
    let config = ServerTlsConfig::new()
        .identity(identity)
        .client_ca_root(Certificate::from_pem(read(dir, "ca.crt")?))
        .client_auth_optional(false);
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
