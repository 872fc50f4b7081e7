//! Serving the adaptor on TCP: mTLS (client certificates required, as
//! Crossplane's function SDKs serve) or plaintext, plus health and reflection.
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::service::{V1Service, V1beta1Service};
use super::{Adaptor, AdaptorError};
use crate::proto::v1::function_runner_service_server::FunctionRunnerServiceServer as V1Server;
use crate::proto::v1beta1::function_runner_service_server::FunctionRunnerServiceServer as V1beta1Server;
use crate::server::listen::tcp_incoming;
use crate::server::serve::ServeError;

/// Transport security.
#[derive(Debug, Clone)]
pub enum Security {
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
pub fn mutual_tls(dir: &Path) -> Result<Security, AdaptorError> {
    let identity = Identity::from_pem(read(dir, "tls.crt")?, read(dir, "tls.key")?);
    let config = ServerTlsConfig::new()
        .identity(identity)
        .client_ca_root(Certificate::from_pem(read(dir, "ca.crt")?))
        .client_auth_optional(false);
    Ok(Security::MutualTls(config))
}

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Transport security.
    pub security: Security,
    /// Largest request accepted, in bytes.
    pub max_recv_message_size: usize,
}

/// Serves both service versions, health and reflection on `listener` until
/// `shutdown` resolves (calls in flight then finish; the caller's process
/// exit bounds how long).
pub async fn serve(
    listener: tokio::net::TcpListener,
    adaptor: Arc<Adaptor>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AdaptorError> {
    let v1 = V1Server::new(V1Service(adaptor.clone()))
        .max_decoding_message_size(options.max_recv_message_size)
        .max_encoding_message_size(usize::MAX);
    let v1beta1 = V1beta1Server::new(V1beta1Service(adaptor))
        .max_decoding_message_size(options.max_recv_message_size)
        .max_encoding_message_size(usize::MAX);
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<V1Server<V1Service>>().await;
    health.set_serving::<V1beta1Server<V1beta1Service>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(ServeError::from)?;
    let mut builder = Server::builder();
    if let Security::MutualTls(tls) = options.security {
        builder = builder.tls_config(tls).map_err(ServeError::from)?;
    }
    builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(v1)
        .add_service(v1beta1)
        .serve_with_incoming_shutdown(tcp_incoming(listener), shutdown)
        .await
        .map_err(ServeError::from)?;
    Ok(())
}
