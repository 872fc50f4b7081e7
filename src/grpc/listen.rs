//! Where a front end listens: a Linux abstract Unix socket (`@name`, what
//! Crossplane dials), a Unix socket path, or TCP. Binding happens before xfn
//! enters its user namespace; Unix connections are then accepted by the
//! front end (`xfn start`'s gatekeeper, [`crate::sidecar::gate`]), TCP ones
//! by [`tcp_incoming`].
use std::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

use futures::Stream;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Errors of binding the listen address.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListenError {
    /// A TCP address that does not parse.
    #[error("--address {0:?} is not a host:port socket address for --network tcp")]
    BadTcpAddress(String),
    /// An empty Unix address.
    #[error("--address is empty")]
    EmptyAddress,
    /// Another process holds the abstract name: serving behind it would
    /// leave Crossplane (and its registry credentials) talking to that one.
    #[error("{address} is already held by another process in this network namespace; refusing to serve behind it (find it with `ss -xlp | grep {address}`)")]
    Squatted {
        /// The address.
        address: String,
    },
    /// Binding failed.
    #[error("cannot listen on {address}")]
    Bind {
        /// The address.
        address: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The transport, as Crossplane's `--network` flag names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Network {
    /// A Unix socket (`@name` for an abstract one).
    Unix,
    /// TCP: no caller checks; for tests and benchmarks.
    Tcp,
}

/// A parsed listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListenAddress {
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
    pub(crate) fn parse(network: Network, address: &str) -> Result<Self, ListenError> {
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

/// A bound listener (std types: bound before the async runtime starts).
#[derive(Debug)]
pub(crate) enum Listener {
    /// Unix (abstract or path), blocking: the gatekeeper accepts on it.
    Unix(UnixListener),
    /// TCP, non-blocking, for [`tcp_incoming`].
    Tcp(std::net::TcpListener),
}

/// Binds `address`. A stale socket file at a path address (left by a killed
/// daemon) is replaced; anything else at that path is an error.
pub(crate) fn bind(address: &ListenAddress) -> Result<Listener, ListenError> {
    let fail = |source| ListenError::Bind {
        address: address.to_string(),
        source,
    };
    match address {
        ListenAddress::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(fail)?;
            UnixListener::bind_addr(&addr)
                .map(Listener::Unix)
                .map_err(|source| match source.kind() {
                    std::io::ErrorKind::AddrInUse => ListenError::Squatted {
                        address: address.to_string(),
                    },
                    _ => fail(source),
                })
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
            let listener = std::net::TcpListener::bind(addr).map_err(fail)?;
            listener.set_nonblocking(true).map_err(fail)?;
            Ok(Listener::Tcp(listener))
        }
    }
}

/// Accept errors like EMFILE are transient: wait a little rather than spin.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The TCP connections (no caller check: TCP carries no credentials),
/// non-blocking and registered with no runtime yet: each is served on the
/// serving thread it is handed to ([`super::threads`]), whose reactor it
/// joins.
pub(crate) fn tcp_incoming(
    listener: std::net::TcpListener,
) -> std::io::Result<impl Stream<Item = std::io::Result<std::net::TcpStream>>> {
    // SAFETY: a `TcpListener` owns its descriptor for its whole life and
    // always returns the same one from `as_raw_fd`.
    let listener = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    Ok(futures::stream::unfold(listener, |listener| async move {
        loop {
            let accepted = match listener.readable().await {
                Ok(mut ready) => match ready.try_io(|listener| listener.get_ref().accept()) {
                    Ok(accepted) => accepted,
                    Err(_would_block) => continue,
                },
                Err(err) => Err(err),
            };
            let err = match accepted.and_then(|(stream, _)| {
                stream.set_nonblocking(true)?;
                Ok(stream)
            }) {
                Ok(stream) => {
                    // gRPC calls are small request/response pairs.
                    let _ = stream.set_nodelay(true);
                    return Some((Ok(stream), listener));
                }
                Err(err) => err,
            };
            tracing::warn!(error = %crate::chain::Chain(&err), "accepting a connection failed");
            tokio::time::sleep(ACCEPT_BACKOFF).await;
        }
    }))
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

    #[test]
    fn abstract_socket_accepts_connections() {
        let name = format!("xfn-test/listen-{}", std::process::id());
        let Listener::Unix(listener) = bind(&ListenAddress::Abstract(name.clone())).unwrap() else {
            panic!("not unix");
        };
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let _client = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        listener.accept().unwrap();
    }

    #[test]
    fn a_held_abstract_name_is_reported_as_squatted() {
        let name = format!("xfn-test/squat-{}", std::process::id());
        let address = ListenAddress::Abstract(name.clone());
        let _holder = bind(&address).unwrap();
        let err = bind(&address).unwrap_err();
        assert!(matches!(err, ListenError::Squatted { .. }), "{err}");
        assert!(err.to_string().contains(&format!("@{name}")), "{err}");
    }

    #[test]
    fn path_socket_replaces_a_stale_socket() {
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
