//! What the adaptor serves over the gRPC layer: both service versions,
//! with mTLS (client certificates required, as Crossplane's function SDKs
//! serve) or plaintext.
use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use super::service::{V1Service, V1beta1Service};
use super::{Adaptor, AdaptorError};
use crate::grpc::serve::ServiceSet;
use crate::proto::raw::v1::function_runner_service_server::FunctionRunnerServiceServer as V1Server;
use crate::proto::raw::v1beta1::function_runner_service_server::FunctionRunnerServiceServer as V1beta1Server;

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
    let v1 = V1Server::new(V1Service(adaptor.clone()))
        .max_decoding_message_size(max_recv_message_size)
        .max_encoding_message_size(usize::MAX);
    let v1beta1 = V1beta1Server::new(V1beta1Service(adaptor))
        .max_decoding_message_size(max_recv_message_size)
        .max_encoding_message_size(usize::MAX);
    let services = ServiceSet::new().with_service(v1).with_service(v1beta1);
    match security {
        Security::MutualTls(tls) => services.with_tls(tls),
        Security::Insecure => services,
    }
}
