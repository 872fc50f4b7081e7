//! The gatekeeper: a small process that stays *outside* xfn's user
//! namespace, accepts the Unix connections, checks each caller's uid and
//! hands the connections of allowed callers to the daemon (`SCM_RIGHTS`).
//!
//! Why a process: the kernel reports a peer's `SO_PEERCRED` uid as seen from
//! the *reader's* user namespace. Inside xfn's namespace every uid it does
//! not map — host root, any other user, and with a mapped range even xfn's
//! own host uid — reads as the overflow uid 65534, so the daemon itself
//! cannot tell who calls. The gatekeeper is forked before the namespace is
//! entered (while xfn is single-threaded) and sees real host uids.
//!
//! Refused callers are logged and their connection closed before any gRPC
//! byte is exchanged: they see a transport error, not a gRPC status.
//!
//! # Under a flood
//!
//! Functions (with `NetworkPolicy Runner` in the socket's network
//! namespace) do not get this far where the kernel has Landlock's
//! abstract-socket scope: it refuses their `connect()` before the listen
//! queue (`crate::sandbox::scope`), at no cost to the gatekeeper. Anyone
//! else, and functions on older kernels, are refused here.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/sidecar/gate.rs`.
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};

use futures::Stream;
use nix::sys::socket::{
    getsockopt, recvmsg, sendmsg, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use tokio::io::unix::AsyncFd;

use super::peer::{CallerPolicy, PeerPlace};
use crate::grpc::refusals::{RefusalCounters, RefusalReason};

/// At most one refusal logged per this long, so a caller retrying in a
/// loop cannot flood the log; the next line says how many were not logged.
const REFUSAL_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Rate limit of the refusal log.
#[derive(Debug, Default)]
struct Refusals {
    last_logged: Option<std::time::Instant>,
    suppressed: u64,
}

impl Refusals {
    /// Logs through `log(suppressed so far)` unless one was logged lately.
    fn note(&mut self, log: impl FnOnce(u64)) {
        let due = self
            .last_logged
            .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL);
        if due {
            log(self.suppressed);
            self.suppressed = 0;
            self.last_logged = Some(std::time::Instant::now());
        } else {
            self.suppressed += 1;
        }
    }
}

/// Errors of the gatekeeper.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GateError {
    /// A system call failed.
    #[error("gatekeeper: {what}")]
    Sys {
        /// What was attempted.
        what: &'static str,
        /// The errno.
        source: nix::Error,
    },
    /// Registering the channel with tokio failed.
    #[error("gatekeeper: cannot register its channel")]
    Io(#[from] std::io::Error),
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> GateError {
    move |source| GateError::Sys { what, source }
}

/// The daemon's end of the channel from the gatekeeper.
#[derive(Debug)]
pub(crate) struct GateReceiver {
    channel: OwnedFd,
    counters: RefusalCounters,
}

/// The connected pair: (gatekeeper's end, daemon's end).
fn channel() -> Result<(OwnedFd, GateReceiver), GateError> {
    // SEQPACKET keeps one connection per message, and reports the
    // gatekeeper's exit as end-of-file.
    let (gate, daemon) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(sys("socketpair"))?;
    Ok((
        gate,
        GateReceiver {
            channel: daemon,
            counters: RefusalCounters::new().map_err(sys("map the refusal counters"))?,
        },
    ))
}

/// Forks the gatekeeper for `listener` under `policy` and returns the
/// daemon's end. Must be called while the process is single-threaded
/// (before the async runtime starts), and before entering the namespace.
pub(crate) fn spawn(
    listener: UnixListener,
    policy: CallerPolicy,
) -> Result<GateReceiver, GateError> {
    let (gate_end, receiver) = channel()?;
    let counters = receiver.counters.clone();
    let parent = nix::unistd::getpid();
    // SAFETY: xfn is single-threaded here (main calls this before building
    // the tokio runtime), so the child may run ordinary Rust code: no lock
    // can be held by a thread that does not exist in the child.
    match unsafe { nix::unistd::fork() }.map_err(sys("fork"))? {
        nix::unistd::ForkResult::Child => {
            drop(receiver);
            // Die with the daemon; if it already died, don't outlive it.
            if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
                || nix::unistd::getppid() != parent
            {
                std::process::exit(1);
            }
            // Only the accept loop runs from here on: the start-up's pages
            // can go.
            crate::resident::release_file_pages();
            accept_callers(&listener, &policy, &gate_end, &counters);
            std::process::exit(0);
        }
        nix::unistd::ForkResult::Parent { child } => {
            tracing::debug!(gatekeeper = child.as_raw(), "gatekeeper started");
            drop(gate_end);
            drop(listener);
            Ok(receiver)
        }
    }
}

/// What woke the gatekeeper.
enum Wake {
    /// A caller is waiting to be accepted.
    Caller,
    /// The daemon's end closed: it exited.
    DaemonGone,
    /// Nothing happened for the time asked.
    Quiet,
}

/// Waits for a caller or the daemon's exit, or `quiet` (for ever without).
/// The parent-death signal is not enough on its own: a daemon that mapped
/// an id range is no longer allowed to signal its (host-uid) gatekeeper,
/// and the kernel drops the signal.
fn wait(listener: &UnixListener, daemon: &OwnedFd, quiet: Option<std::time::Duration>) -> Wake {
    let timeout_ms = quiet.map_or(-1, |d| {
        libc::c_int::try_from(d.as_millis()).unwrap_or(libc::c_int::MAX)
    });
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: daemon.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two initialised pollfd structs
        // that outlives the call; both descriptors are owned by the callers.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Wake::DaemonGone;
        }
        if rc == 0 {
            return Wake::Quiet;
        }
        // The daemon never writes to the gatekeeper: any event is its exit.
        if fds[1].revents != 0 {
            return Wake::DaemonGone;
        }
        if fds[0].revents != 0 {
            return Wake::Caller;
        }
    }
}

/// Why a caller was refused.
enum Refusal {
    /// Its credentials could not be read.
    Credentials(nix::Error),
    /// Its uid is not allowed.
    Uid {
        pid: i32,
        refused: super::peer::Refused,
    },
    /// It runs in a container (a function).
    Container {
        uid: u32,
        pid: i32,
        place: PeerPlace,
    },
}

/// Judges a caller: its uid if it may call. The uid goes first: a refusal
/// then costs one `getsockopt`, and only allowed callers are looked up in
/// `/proc`.
fn judge(stream: &UnixStream, policy: &CallerPolicy) -> Result<u32, Refusal> {
    let cred = getsockopt(stream, sockopt::PeerCredentials).map_err(Refusal::Credentials)?;
    policy.check(cred.uid()).map_err(|refused| Refusal::Uid {
        pid: cred.pid(),
        refused,
    })?;
    let place = PeerPlace::of(cred.pid());
    if !place.may_call() {
        return Err(Refusal::Container {
            uid: cred.uid(),
            pid: cred.pid(),
            place,
        });
    }
    Ok(cred.uid())
}

/// Counts `refusal` and logs it unless one was logged lately.
fn refuse(refusal: Refusal, refusals: &std::sync::Mutex<Refusals>, counters: &RefusalCounters) {
    counters.add(match &refusal {
        Refusal::Credentials(_) => RefusalReason::Credentials,
        Refusal::Uid { .. } => RefusalReason::Uid,
        Refusal::Container { .. } => RefusalReason::Container,
    });
    let mut refusals = refusals
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    refusals.note(|suppressed| match refusal {
        Refusal::Credentials(err) => {
            tracing::warn!(error = %crate::chain::Chain(&err), suppressed, "cannot read the caller's credentials; refusing")
        }
        Refusal::Uid { pid, refused } => {
            tracing::warn!(uid = refused.uid, pid, reason = %refused, suppressed, "caller refused")
        }
        Refusal::Container { uid, pid, place } => tracing::warn!(
            uid,
            pid,
            ?place,
            suppressed,
            "caller refused: it runs in a container (a function may never call the runner)"
        ),
    });
}

/// Most threads the gatekeeper accepts on.
const MAX_ACCEPTORS: usize = 4;

/// The gatekeeper: accept, check, hand over, on one thread per CPU (at
/// most [`MAX_ACCEPTORS`]), so that one flooding process cannot out-run it
/// alone; returns when the daemon is gone.
pub(crate) fn accept_callers(
    listener: &UnixListener,
    policy: &CallerPolicy,
    daemon: &OwnedFd,
    counters: &RefusalCounters,
) {
    // Non-blocking: each wake-up takes every waiting caller (see the
    // module's "Under a flood"). Without it, one per wake-up.
    let drains = listener.set_nonblocking(true).is_ok();
    let refusals = std::sync::Mutex::new(Refusals::default());
    let acceptors = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_ACCEPTORS);
    std::thread::scope(|scope| {
        for _ in 1..acceptors {
            scope.spawn(|| accept_loop(listener, policy, daemon, counters, &refusals, drains));
        }
        accept_loop(listener, policy, daemon, counters, &refusals, drains);
    });
}

/// One acceptor's loop; returns when the daemon is gone.
fn accept_loop(
    listener: &UnixListener,
    policy: &CallerPolicy,
    daemon: &OwnedFd,
    counters: &RefusalCounters,
    refusals: &std::sync::Mutex<Refusals>,
    drains: bool,
) {
    // A connection was handled since the last release of the code it ran
    // (crate::resident): released once the gatekeeper has been idle again.
    let mut ran = false;
    loop {
        match wait(listener, daemon, ran.then_some(crate::resident::IDLE_AFTER)) {
            Wake::DaemonGone => return,
            Wake::Quiet => {
                let released_kb = crate::resident::release_file_pages();
                tracing::debug!(released_kb, "idle gatekeeper: file pages released");
                ran = false;
                continue;
            }
            Wake::Caller => ran = true,
        }
        loop {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    // EMFILE and the like: wait a little rather than spin.
                    tracing::warn!(error = %crate::chain::Chain(&err), "accepting a connection failed");
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    break;
                }
            };
            match judge(&stream, policy) {
                Ok(uid) => {
                    if !hand_over(daemon, &stream, uid) {
                        return;
                    }
                }
                Err(refusal) => refuse(refusal, refusals, counters),
            }
            if !drains {
                break;
            }
        }
    }
}

/// Sends `stream` and its caller's uid to the daemon; false when the daemon
/// is gone.
fn hand_over(daemon: &OwnedFd, stream: &UnixStream, uid: u32) -> bool {
    let payload = uid.to_ne_bytes();
    let fds = [stream.as_raw_fd()];
    match sendmsg::<()>(
        daemon.as_raw_fd(),
        &[IoSlice::new(&payload)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        Ok(_) => true,
        Err(err) => {
            tracing::debug!(error = %crate::chain::Chain(&err), "the daemon is gone; gatekeeper exits");
            false
        }
    }
}

/// One received connection, or end-of-file.
fn receive(channel: &OwnedFd) -> std::io::Result<Option<(UnixStream, u32)>> {
    let mut payload = [0u8; 4];
    let mut iov = [IoSliceMut::new(&mut payload)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        channel.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    if msg.bytes == 0 {
        return Ok(None);
    }
    let mut stream = None;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: the kernel just installed `fd` in this process for
                // this message; nothing else owns it.
                let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                stream.get_or_insert(UnixStream::from(owned));
            }
        }
    }
    let uid = u32::from_ne_bytes(payload);
    match stream {
        Some(stream) => Ok(Some((stream, uid))),
        None => Err(std::io::Error::other(
            "gatekeeper message without a connection",
        )),
    }
}

impl GateReceiver {
    /// The gatekeeper's refusal counters (for the metrics).
    pub(crate) fn counters(&self) -> RefusalCounters {
        self.counters.clone()
    }

    /// The connections the gatekeeper hands over, for the gRPC layer.
    /// Ends when the gatekeeper exits (after logging an error: no new caller
    /// can connect then). Needs the async runtime.
    pub(crate) fn incoming(self) -> Result<crate::grpc::serve::Incoming, GateError> {
        Ok(crate::grpc::serve::Incoming::Unix(Box::pin(
            self.connections()?,
        )))
    }

    fn connections(
        self,
    ) -> Result<impl Stream<Item = std::io::Result<tokio::net::UnixStream>>, GateError> {
        nix::fcntl::fcntl(
            self.channel.as_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(sys("set the gate channel non-blocking"))?;
        // SAFETY: an `OwnedFd` owns its descriptor for its whole life and
        // always returns the same one from `as_raw_fd`.
        let channel =
            unsafe { AsyncFd::register_with_interest(self.channel, tokio::io::Interest::READABLE) }
                .map_err(std::io::Error::from)?;
        Ok(futures::stream::unfold(channel, |channel| async move {
            loop {
                let mut guard = match channel.readable().await {
                    Ok(guard) => guard,
                    Err(err) => {
                        tracing::error!(error = %crate::chain::Chain(&err), "cannot wait on the gatekeeper channel");
                        return None;
                    }
                };
                let received = match guard.try_io(|fd| receive(fd.get_ref())) {
                    Ok(received) => received,
                    Err(_would_block) => continue,
                };
                match received {
                    Ok(Some((stream, uid))) => {
                        tracing::debug!(host_uid = uid, "caller accepted");
                        let accepted = stream
                            .set_nonblocking(true)
                            .and_then(|()| tokio::net::UnixStream::from_std(stream));
                        match accepted {
                            Ok(stream) => return Some((Ok(stream), channel)),
                            Err(err) => {
                                tracing::warn!(error = %crate::chain::Chain(&err), "cannot adopt a connection")
                            }
                        }
                    }
                    Ok(None) => {
                        tracing::error!("the gatekeeper exited: no new callers can connect");
                        return None;
                    }
                    Err(err) => {
                        tracing::warn!(error = %crate::chain::Chain(&err), "receiving a connection failed")
                    }
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// The gatekeeper loop in a thread (forking a multi-threaded test
    /// process would not be safe), handing connections to the receiver.
    #[tokio::test]
    async fn hands_allowed_connections_over_and_ends_with_the_gatekeeper() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let (gate_end, receiver) = channel().unwrap();
        let counters = receiver.counters();
        let gate = std::thread::spawn(move || {
            accept_callers(&listener, &CallerPolicy::new(me, &[]), &gate_end, &counters);
        });
        let mut incoming = Box::pin(receiver.connections().unwrap());

        let client = UnixStream::connect(&path).unwrap();
        let server = incoming.next().await.unwrap().unwrap();
        // The handed-over socket is the other end of the client's.
        use std::io::Write;
        use tokio::io::AsyncReadExt;
        (&client).write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        let mut server = server;
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");

        // When the daemon's end goes away, the gatekeeper returns.
        drop(incoming);
        drop(server);
        gate.join().unwrap();
    }

    #[tokio::test]
    async fn incoming_ends_when_the_gatekeeper_exits() {
        let (gate_end, receiver) = channel().unwrap();
        let mut incoming = Box::pin(receiver.connections().unwrap());
        drop(gate_end);
        assert!(incoming.next().await.is_none());
    }
}
