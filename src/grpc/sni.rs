//! TLS whose server certificate is chosen by the name the client dialled
//! (SNI), for a front end that serves many names on one port (`xfn host`):
//! tonic's own TLS holds one identity, so the handshake is done here, on
//! the tracked connection, before the connection is handed to tonic as
//! plaintext.
//!
//! # Invariants
//! - **A name the front end does not serve is refused in the handshake**:
//!   the ClientHello is read first; with no SNI or an unknown one the
//!   connection is closed before any certificate is sent, and logged.
//! - **The name travels with the connection**: every request of it carries
//!   [`SniInfo`] (tonic's connect info), so a service routes by the name the
//!   client verified the certificate for, never by anything in the request.
//! - **The handshake is bounded**: it must finish within the connections'
//!   handshake timeout, or the connection is dropped.
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;

use super::connections::{ConnInfo, SniInfo, Tracked, WarnThrottle};
use crate::echo::Echo;

/// What a front end serving many names gives the gRPC layer.
pub(crate) trait SniConfigs: Send + Sync + 'static {
    /// The TLS configuration for connections to `server_name` (its
    /// certificate, the client CA, ALPN), or `None` to refuse them.
    fn config_for(&self, server_name: &str) -> Option<Arc<rustls::ServerConfig>>;
}

/// A connection after its SNI-routed handshake.
#[derive(Debug)]
pub(crate) struct SniStream<IO> {
    io: TlsStream<IO>,
    server_name: Arc<str>,
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
/// within `timeout`. `None` when refused or failed (logged).
pub(crate) async fn accept<IO>(
    io: Tracked<IO>,
    configs: &dyn SniConfigs,
    timeout: Duration,
) -> Option<SniStream<Tracked<IO>>>
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
        match start.into_stream(config).await {
            Ok(io) => Some(SniStream {
                io,
                server_name: name.into(),
            }),
            Err(err) => {
                if let Some(suppressed) = refusal_due() {
                    tracing::warn!(server_name = %Echo(&name), error = %err, suppressed, "TLS handshake failed (a client certificate the CA did not sign, or none?)");
                }
                None
            }
        }
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(stream) => stream,
        Err(_) => {
            tracing::debug!(
                ?timeout,
                "TLS handshake not done within the handshake timeout"
            );
            None
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for SniStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for SniStream<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> tonic::transport::server::Connected for SniStream<Tracked<IO>> {
    type ConnectInfo = SniInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        SniInfo {
            conn: ConnInfo(Arc::clone(self.io.get_ref().0.conn())),
            server_name: Arc::clone(&self.server_name),
        }
    }
}
