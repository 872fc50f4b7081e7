//! Where the service listens: a Linux abstract Unix socket (`@name`, what
//! Crossplane dials), a Unix socket path, or TCP; and the accept loop that
//! checks each Unix caller's credentials before gRPC sees the connection.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::peer::CallerPolicy;

/// Errors of binding the listen address.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// A TCP address that does not parse.
    #[error("--address {0:?} is not a host:port socket address for --network tcp")]
    BadTcpAddress(String),
    /// An empty Unix address.
    #[error("--address is empty")]
    EmptyAddress,
    /// Binding failed.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The transport, as Crossplane's `--network` flag names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Network {
    /// A Unix socket (`@name` for an abstract one).
    Unix,
    /// TCP: no caller checks; for tests and benchmarks.
    Tcp,
}

/// A parsed listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddress {
    /// A Linux abstract socket name (without the leading `@`).
    Abstract(String),
    /// A socket file.
    Path(PathBuf),
    /// TCP.
    Tcp(SocketAddr),
}

impl std::fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Abstract(name) => write!(f, "unix:@{name}"),
            Self::Path(path) => write!(f, "unix:{}", path.display()),
            Self::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

impl ListenAddress {
    /// Parses `--network` and `--address`.
    pub fn parse(network: Network, address: &str) -> Result<Self, ListenError> {
        match network {
            Network::Tcp => address
                .parse()
                .map(Self::Tcp)
                .map_err(|_| ListenError::BadTcpAddress(address.to_string())),
            Network::Unix => match address.strip_prefix('@') {
                Some("") => Err(ListenError::EmptyAddress),
                Some(name) => Ok(Self::Abstract(name.to_string())),
                None if address.is_empty() => Err(ListenError::EmptyAddress),
                None => Ok(Self::Path(PathBuf::from(address))),
            },
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    /// Unix (abstract or path).
    Unix(UnixListener),
    /// TCP.
    Tcp(TcpListener),
}

/// Binds `address`. A stale socket file at a path address (left by a killed
/// daemon) is replaced; anything else at that path is an error.
pub fn bind(address: &ListenAddress) -> Result<Listener, ListenError> {
    let fail = |source| ListenError::Bind {
        address: address.to_string(),
        source,
    };
    match address {
        ListenAddress::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(fail)?;
            let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr).map_err(fail)?;
            std_listener.set_nonblocking(true).map_err(fail)?;
            UnixListener::from_std(std_listener)
                .map(Listener::Unix)
                .map_err(fail)
        }
        ListenAddress::Path(path) => {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if meta.file_type().is_socket() {
                    std::fs::remove_file(path).map_err(fail)?;
                }
            }
            UnixListener::bind(path).map(Listener::Unix).map_err(fail)
        }
        ListenAddress::Tcp(addr) => {
            let std_listener = std::net::TcpListener::bind(addr).map_err(fail)?;
            std_listener.set_nonblocking(true).map_err(fail)?;
            TcpListener::from_std(std_listener)
                .map(Listener::Tcp)
                .map_err(fail)
        }
    }
}

/// Accept errors like EMFILE are transient: wait a little rather than spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The Unix connections of allowed callers. Refused callers are logged and
/// their connection dropped before any gRPC byte is exchanged, so they see a
/// transport error (Unavailable), not a gRPC status.
pub fn unix_incoming(
    listener: UnixListener,
    policy: Arc<CallerPolicy>,
) -> impl Stream<Item = std::io::Result<UnixStream>> {
    futures::stream::unfold((listener, policy), |(listener, policy)| async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let cred = match stream.peer_cred() {
                Ok(cred) => cred,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read the caller's credentials; refusing");
                    continue;
                }
            };
            match policy.check(cred.uid()) {
                Ok(host_uid) => {
                    tracing::debug!(uid = cred.uid(), host_uid, pid = ?cred.pid(), "caller accepted");
                    return Some((Ok(stream), (listener, policy)));
                }
                Err(refused) => {
                    tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), reason = %refused, "caller refused");
                }
            }
        }
    })
}

/// The TCP connections (no caller check: TCP carries no credentials).
pub fn tcp_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    // gRPC calls are small request/response pairs.
                    let _ = stream.set_nodelay(true);
                    return Some((Ok(stream), listener));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_crossplane_addresses() {
        assert_eq!(
            ListenAddress::parse(Network::Unix, "@crossplane/fn/default.sock").unwrap(),
            ListenAddress::Abstract("crossplane/fn/default.sock".into())
        );
        assert_eq!(
            ListenAddress::parse(Network::Unix, "/run/xfn.sock").unwrap(),
            ListenAddress::Path("/run/xfn.sock".into())
        );
        assert_eq!(
            ListenAddress::parse(Network::Tcp, "127.0.0.1:9443").unwrap(),
            ListenAddress::Tcp("127.0.0.1:9443".parse().unwrap())
        );
        assert!(ListenAddress::parse(Network::Unix, "@").is_err());
        assert!(ListenAddress::parse(Network::Unix, "").is_err());
        assert!(ListenAddress::parse(Network::Tcp, "nonsense").is_err());
    }

    #[tokio::test]
    async fn abstract_socket_accepts_this_process() {
        use futures::StreamExt;
        let name = format!("xfn-test/listen-{}", std::process::id());
        let Listener::Unix(listener) = bind(&ListenAddress::Abstract(name.clone())).unwrap() else {
            panic!("not unix");
        };
        let policy = Arc::new(CallerPolicy::for_self(&[]).unwrap());
        let mut incoming = Box::pin(unix_incoming(listener, policy));
        let client = tokio::spawn(async move {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            std::os::unix::net::UnixStream::connect_addr(&addr).unwrap()
        });
        let accepted = incoming.next().await.unwrap().unwrap();
        let _client = client.await.unwrap();
        assert!(accepted.peer_cred().is_ok());
    }

    #[tokio::test]
    async fn path_socket_replaces_a_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xfn.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let Listener::Unix(_listener) = bind(&ListenAddress::Path(path.clone())).unwrap() else {
            panic!("not unix");
        };
        // A regular file is not clobbered.
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(bind(&ListenAddress::Path(file)).is_err());
    }
}
