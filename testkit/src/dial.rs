//! Clients of `xfn start`: a channel to its socket dialled as a chosen uid
//! (`SO_PEERCRED` is what the daemon admits callers by), the generated
//! runner client ([`pb`], from `proto/v1alpha1.proto`), requests, and a
//! call through Python's grpcio as Crossplane's own clients would make it.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codegen::http;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::pb;
use crate::pb::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient;

/// The client type of the runner service.
pub type Client = ContainerizedFunctionRunnerServiceClient<Channel>;

/// HTTP/2 straight over one connection, with no timer of its own.
pub type RawTransport = tower::util::BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<hyper::body::Incoming>,
    hyper::Error,
>;

/// A runner client that reads the status the daemon sends when a deadline
/// passes: tonic's `Channel` times the `grpc-timeout` it sends itself and,
/// being first, answers `CANCELLED` locally.
pub type RawClient = ContainerizedFunctionRunnerServiceClient<RawTransport>;

/// A call running on a task of its own
/// ([`crate::daemon::Daemon::call_in_flight`]).
pub type Call =
    tokio::task::JoinHandle<Result<tonic::Response<pb::RunFunctionResponse>, tonic::Status>>;

/// A channel to a runner on the abstract socket `@name` that this test did
/// not start (e.g. `xfn start` in a container sharing this network
/// namespace), dialled as `uid` (`None`: the test's own, root).
pub async fn abstract_channel(
    name: &str,
    uid: Option<u32>,
) -> Result<Channel, tonic::transport::Error> {
    channel_to(Dial::Abstract(name.to_string()), uid).await
}

/// A channel to `endpoint`, dialled as `uid`.
pub(crate) async fn channel_to(
    endpoint: Dial,
    uid: Option<u32>,
) -> Result<Channel, tonic::transport::Error> {
    if let Dial::Tcp(addr) = endpoint {
        return Endpoint::try_from(format!("http://{addr}"))
            .expect("tcp uri")
            .connect()
            .await;
    }
    Endpoint::try_from("http://xfn.invalid")
        .expect("static uri")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let endpoint = endpoint.clone();
            async move {
                let stream = connect_unix_as(&endpoint, uid).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

/// A daemon's listen address, as the client dials it.
#[derive(Debug, Clone)]
pub(crate) enum Dial {
    Abstract(String),
    /// An abstract name in the network namespace of this pid.
    AbstractIn(String, u32),
    Path(PathBuf),
    Tcp(SocketAddr),
}

/// Connects to a Unix `endpoint` from a fresh thread whose effective uid
/// (and gid) is `uid`: `SO_PEERCRED` records the connecting thread's
/// credentials, and a raw `setresuid` syscall changes only the calling
/// thread's (glibc's wrapper would change every thread's).
pub(crate) async fn connect_unix_as(
    endpoint: &Dial,
    uid: Option<u32>,
) -> std::io::Result<tokio::net::UnixStream> {
    let endpoint = endpoint.clone();
    let std_stream = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || -> std::io::Result<std::os::unix::net::UnixStream> {
            use std::os::fd::AsRawFd;
            if let Dial::AbstractIn(_, pid) = &endpoint {
                // This thread only: the socket is made in that namespace.
                let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            }
            if let Some(uid) = uid {
                // -1: leave unchanged.
                let keep = libc::uid_t::MAX;
                // SAFETY: raw setresgid/setresuid on this thread only; the
                // thread ends right after connecting, so no other code runs
                // with the changed credentials.
                let rc = unsafe { libc::syscall(libc::SYS_setresgid, keep, uid, keep) };
                if rc != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: as above.
                let rc = unsafe { libc::syscall(libc::SYS_setresuid, keep, uid, keep) };
                if rc != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
            let addr = match &endpoint {
                Dial::Abstract(name) | Dial::AbstractIn(name, _) => {
                    UnixAddr::new_abstract(name.as_bytes())?
                }
                Dial::Path(path) => UnixAddr::new(path.as_path())?,
                Dial::Tcp(_) => unreachable!("tcp is dialled by tonic"),
            };
            // Non-blocking, as gRPC clients connect: a full listen queue is
            // EAGAIN (UNAVAILABLE), not a wait.
            let fd = socket(
                AddressFamily::Unix,
                SockType::Stream,
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            connect(fd.as_raw_fd(), &addr)?;
            Ok(std::os::unix::net::UnixStream::from(fd))
        })
        .join()
        .expect("connect thread panicked")
    })
    .await
    .expect("join")?;
    tokio::net::UnixStream::from_std(std_stream)
}

/// A request for `image` with `input`.
pub fn request(image: &str, input: &str) -> pb::RunFunctionRequest {
    pb::RunFunctionRequest {
        image: image.to_string(),
        input: input.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// `request` with a run timeout.
pub fn request_with_timeout(image: &str, input: &str, timeout: Duration) -> pb::RunFunctionRequest {
    let mut req = request(image, input);
    req.run_function_config = Some(pb::RunFunctionConfig {
        timeout: Some(prost_types::Duration {
            seconds: timeout.as_secs() as i64,
            nanos: timeout.subsec_nanos() as i32,
        }),
        ..Default::default()
    });
    req
}
