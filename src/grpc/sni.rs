//! TLS done by the gRPC layer on the tracked connection, before its HTTP/2
//! server ([`super::http2`]) serves it: `xfn adapt`'s one identity ([`accept_one`]) and `xfn host`'s
//! certificate chosen by the name the client dialled (SNI, [`accept`]), for
//! a front end that serves many names on one port. Both configurations are
//! made by [`mutual_tls`]: client certificates required against the CA,
//! HTTP/2 only (ALPN `h2`).
//!
//! # Invariants
//! - **A name the front end does not serve is refused in the handshake**:
//!   the ClientHello is read first; with no SNI or an unknown one the
//!   connection is closed before any certificate is sent, and logged.
//! - **The name travels with the connection**: every request of it carries
//!   it ([`super::deadline::Arrived`]), so a service routes by the name the
//!   client verified the certificate for, never by anything in the request.
//! - **A client without a certificate the CA signed is refused** in the
//!   handshake, logged (throttled).
//! - **The handshake is bounded**: it must finish within the connections'
//!   handshake timeout, or the connection is dropped.
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;

use super::connections::WarnThrottle;
use crate::echo::Echo;

/// A TLS configuration presenting `chain` (whose key is `key`), requiring
/// a client certificate one of `roots` signed, speaking HTTP/2 only (ALPN
/// `h2`, which gRPC clients require): what every TLS front end serves.
pub(crate) fn mutual_tls<E>(
    roots: Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, E>
where
    E: From<rustls::Error> + From<rustls::server::VerifierBuilderError>,
{
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(provider)).build()?;
    let mut config = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// What a front end serving many names gives the gRPC layer.
pub(crate) trait SniConfigs: Send + Sync + 'static {
    /// The TLS configuration for connections to `server_name` (its
    /// certificate, the client CA, ALPN), or `None` to refuse them.
    fn config_for(&self, server_name: &str) -> Option<Arc<rustls::ServerConfig>>;
}

/// Whether a refused handshake is to be logged: at most one a 10 s, each
/// saying how many were left out (`suppressed`), as the connection cap's
/// warning. A flood of refused handshakes logged 174 bytes each, 3.4 MB
/// per 10 s.
fn refusal_due() -> Option<u64> {
    static REFUSALS: std::sync::Mutex<WarnThrottle> = std::sync::Mutex::new(WarnThrottle::new());
    REFUSALS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .due()
}

/// Reads the ClientHello of `io`, refuses a name `configs` does not serve,
/// and finishes the handshake with the configuration for the name, all
/// within `timeout`: the stream and the name (lower case). `None` when
/// refused or failed (logged).
pub(crate) async fn accept<IO>(
    io: IO,
    configs: &dyn SniConfigs,
    timeout: Duration,
) -> Option<(TlsStream<IO>, Arc<str>)>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = async {
        let start =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await;
        let start = match start {
            Ok(start) => start,
            Err(err) => {
                tracing::debug!(error = %err, "TLS: no ClientHello");
                return None;
            }
        };
        let Some(name) = start
            .client_hello()
            .server_name()
            .map(|n| n.to_ascii_lowercase())
        else {
            if let Some(suppressed) = refusal_due() {
                tracing::warn!(
                    suppressed,
                    "TLS connection refused: it named no server (SNI); dial a function by its name"
                );
            }
            return None;
        };
        let Some(config) = configs.config_for(&name) else {
            if let Some(suppressed) = refusal_due() {
                tracing::warn!(server_name = %Echo(&name), suppressed, "TLS connection refused: no function is hosted under this name");
            }
            return None;
        };
        let io = finished(start.into_stream(config).await, Some(&name))?;
        Some((io, name.into()))
    };
    within(timeout, handshake).await?
}

/// The TLS handshake of `io` under `config`, within `timeout`. `None`
/// when it failed (logged).
pub(crate) async fn accept_one<IO>(
    io: IO,
    config: Arc<ServerConfig>,
    timeout: Duration,
) -> Option<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = tokio_rustls::TlsAcceptor::from(config).accept(io);
    finished(within(timeout, handshake).await?, None)
}

/// The stream of a finished handshake; a failed one logged (throttled).
fn finished<IO>(done: std::io::Result<TlsStream<IO>>, name: Option<&str>) -> Option<TlsStream<IO>> {
    match done {
        Ok(io) => Some(io),
        Err(err) => {
            if let Some(suppressed) = refusal_due() {
                let name = name.map(Echo);
                tracing::warn!(server_name = name.as_ref().map(tracing::field::display), error = %err, suppressed, "TLS handshake failed (a client certificate the CA did not sign, or none?)");
            }
            None
        }
    }
}

/// `handshake`'s output, or `None` (logged) past `timeout`.
async fn within<T>(
    timeout: Duration,
    handshake: impl std::future::Future<Output = T>,
) -> Option<T> {
    match tokio::time::timeout(timeout, handshake).await {
        Ok(done) => Some(done),
        Err(_) => {
            tracing::debug!(
                ?timeout,
                "TLS handshake not done within the handshake timeout"
            );
            None
        }
    }
}
