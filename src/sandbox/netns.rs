//! TCP connections made inside a container's network namespace.
//!
//! A function served by xfn listens on its own, empty network namespace: no
//! port is published on the host, so nothing else on the machine can reach
//! it. xfn reaches it by creating the socket *inside* that namespace: a
//! socket belongs to the namespace it was created in for its whole life,
//! whichever thread then uses it. The namespace switch (`setns`) changes only
//! the calling thread, so it happens on a short-lived thread of its own and
//! never on a tokio worker, which would stay in the container's network.
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use nix::sched::CloneFlags;

/// How long one connection attempt may take. Inside a namespace the peer is
/// local: a listening socket answers at once, a missing one refuses at once.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A container's network namespace, kept open (so it outlives the
/// container's processes as long as xfn needs it); or xfn's own, for a
/// container that shares it.
#[derive(Debug, Clone)]
pub struct NetworkNamespace(Option<Arc<OwnedFd>>);

impl NetworkNamespace {
    /// The network namespace of process `pid` (as xfn sees it).
    pub fn of_pid(pid: u32) -> std::io::Result<Self> {
        let file = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        Ok(Self(Some(Arc::new(file.into()))))
    }

    /// xfn's own network (a container on the host's network): connections
    /// are made directly. (xfn could not `setns` into it anyway: it belongs
    /// to the host's user namespace, where xfn has no capabilities.)
    pub fn own() -> Self {
        Self(None)
    }

    /// Connects to `address` from inside the namespace.
    pub async fn connect(&self, address: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let Some(namespace) = &self.0 else {
            let stream =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            stream.set_nodelay(true)?;
            return Ok(stream);
        };
        let namespace = Arc::clone(namespace);
        let (sender, receiver) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("xfn-netns-connect".into())
            .spawn(move || {
                let connected = (|| -> std::io::Result<std::net::TcpStream> {
                    // Needs CAP_SYS_ADMIN in the namespace's owning user
                    // namespace: the run's, a child of xfn's made by xfn's
                    // own uid, where xfn has every capability.
                    nix::sched::setns(&*namespace, CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                    let stream = std::net::TcpStream::connect_timeout(&address, CONNECT_TIMEOUT)?;
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    Ok(stream)
                })();
                // The receiver is gone only when the caller gave up.
                let _ = sender.send(connected);
            })?;
        let stream = receiver
            .await
            .map_err(|_| std::io::Error::other("the namespace connect thread died"))??;
        tokio::net::TcpStream::from_std(stream)
    }
}
