//! `xfn start` as it is deployed, for the tests of the daemon: the real
//! binary as an unprivileged user without capabilities (or as root, with
//! subordinate ids, as a pod's root, as PID 1) on a unique abstract socket,
//! its log, metrics and processes, stopped when dropped. Its clients are in
//! [`crate::dial`].
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Uri};

use crate::dial::{channel_to, connect_unix_as, request, Call, Client, Dial, RawClient};
use crate::proc::{children_of, processes_with};
use crate::{
    dir_owned_by, unprivileged, world_traversable_tempdir, xfn_binary, FUNCTION_IO, NONROOT,
};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The daemons of this binary's tests run side by side, sharing two CPUs. A
/// test whose claim is about fairness under a CPU race it makes itself (a
/// refused neighbour's connect flood) needs the CPUs to itself: otherwise
/// other tests' daemons, not the code under test, decide its outcome. Every
/// daemon holds a share of this lock for its life; [`Daemon::start_alone`]
/// holds it alone.
static CPUS: std::sync::LazyLock<std::sync::Arc<tokio::sync::RwLock<()>>> =
    std::sync::LazyLock::new(Default::default);

/// `inner` run by `unshare ARGS…` (which ends with the program to exec),
/// with `inner`'s environment.
fn unshared(args: &[&str], inner: std::process::Command) -> std::process::Command {
    let mut command = std::process::Command::new("unshare");
    command
        .args(args)
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command
}

/// `program` as `uid` without capabilities, bounding set kept, in a mount
/// namespace where `uid` (named `xfn` in /etc/passwd) has the 65536
/// subordinate uids and gids from `first`: files written under `dir` and
/// bound over the host's (see [`Daemon::start_with_subordinate_ids`]).
fn with_subordinate_ids(dir: &Path, uid: u32, first: u32, program: &Path) -> std::process::Command {
    let subids = dir.join("subids");
    std::fs::write(&subids, format!("{uid}:{first}:65536\n")).expect("write subids");
    let passwd = dir.join("passwd");
    let mut users = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    users.push_str(&format!(
        "xfn:x:{uid}:{uid}::/nonexistent:/usr/sbin/nologin\n"
    ));
    std::fs::write(&passwd, users).expect("write passwd");
    let mut inner = std::process::Command::new("setpriv");
    inner
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "--inh-caps=-all", "--"])
        .arg(program)
        .env_remove("HOME");
    let bind = format!(
        "mount --bind {s} /etc/subuid && mount --bind {s} /etc/subgid && mount --bind {p} /etc/passwd && exec \"$0\" \"$@\"",
        s = subids.display(),
        p = passwd.display()
    );
    unshared(&["--mount", "--", "sh", "-c", &bind], inner)
}

/// What the shipped sidecar's container adds to no capabilities (deploy/),
/// in `setpriv --bounding-set` terms.
pub const POD_CAPABILITIES: &str = "+setuid,+setgid,+setfcap";

/// `program` as the root of a pod with `hostUsers: false`, as the shipped
/// sidecar runs (deploy/), without Kubernetes: in a user namespace of its
/// own whose ids 0..65535 are the host's `base..base+65535`, as its uid 0,
/// with exactly the capabilities `caps` (e.g. [`POD_CAPABILITIES`]) in its
/// bounding, permitted and effective sets and nothing inheritable, as a
/// container runtime gives root, and `no_new_privs`
/// (`allowPrivilegeEscalation: false`). `unshare --map-users` maps the
/// range with `newuidmap`, which wants it in root's /etc/subuid: a file
/// under `dir`, bound over the host's in a mount namespace of its own, as
/// [`with_subordinate_ids`] does.
pub fn as_pod_root(dir: &Path, base: u32, caps: &str, program: &Path) -> std::process::Command {
    let subids = dir.join("pod-ids");
    std::fs::write(&subids, format!("root:{base}:65536\n")).expect("write pod ids");
    let mut inner = std::process::Command::new("setpriv");
    inner
        .args(["--inh-caps=-all", &format!("--bounding-set=-all,{caps}")])
        .args(["--no-new-privs", "--"])
        .arg(program)
        .env_remove("HOME");
    let ids = format!("{base},0,65536");
    let pod = unshared(
        &[
            "--user",
            &format!("--map-users={ids}"),
            &format!("--map-groups={ids}"),
            "--setuid=0",
            "--setgid=0",
            "--",
        ],
        inner,
    );
    let bind = format!(
        "mount --bind {s} /etc/subuid && mount --bind {s} /etc/subgid && exec \"$0\" \"$@\"",
        s = subids.display()
    );
    unshared(&["--mount", "--", "sh", "-c", &bind], pod)
}

/// Who a test daemon runs as, besides its uid.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// As its uid alone (or root).
    Plain,
    /// With the 65536 subordinate ids from this host id.
    SubordinateIds(u32),
    /// As the root of a pod's own user namespace whose ids start at this
    /// host id ([`as_pod_root`]).
    PodRoot(u32),
}

/// A daemon's hold on the CPUs (see [`CPUS`]).
enum CpuShare {
    Shared(#[allow(dead_code)] tokio::sync::OwnedRwLockReadGuard<()>),
    Alone(#[allow(dead_code)] tokio::sync::OwnedRwLockWriteGuard<()>),
}

/// Where a test daemon listens.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A unique abstract socket (the default, as Crossplane's).
    Abstract,
    /// A socket file at this path.
    Path(PathBuf),
    /// TCP on a free loopback port.
    Tcp,
    /// Crossplane's default address (no `--address`), in a network
    /// namespace of its own: abstract names are per network namespace, so
    /// no other test's daemon can hold it there.
    DefaultInOwnNetwork,
}

/// The name `xfn start` listens on by default (without the `@`).
pub const DEFAULT_SOCKET: &str = "crossplane/fn/default.sock";

/// A running `xfn start`, stopped when dropped (SIGTERM, then SIGKILL if
/// it does not exit: [`crate::child::STOP_GRACE`]).
pub struct Daemon {
    child: Option<Child>,
    /// The abstract socket name (without `@`).
    pub socket: String,
    /// Where it listens.
    endpoint: Dial,
    /// The metrics endpoint.
    pub metrics: SocketAddr,
    /// The cache dir (owned by the daemon's uid).
    pub cache_dir: PathBuf,
    log: PathBuf,
    /// The uid clients dial as by default: the daemon's own.
    caller: Option<u32>,
    /// Started as PID 1 of a fresh PID namespace (under `unshare`).
    as_pid1: bool,
    _dir: tempfile::TempDir,
    /// Released when the daemon is dropped, after it is stopped.
    _cpus: CpuShare,
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

impl Daemon {
    /// Starts `xfn start` as uid 65532 with no capabilities, plus `extra`
    /// flags, and waits until it accepts gRPC calls.
    pub async fn start(extra: &[&str]) -> Daemon {
        Self::start_with_cache(None, extra).await
    }

    /// [`Daemon::start`] once no other daemon of this binary runs, and none
    /// starts until this one is dropped: for a test about a race for CPU.
    pub async fn start_alone(extra: &[&str]) -> Daemon {
        // Polled, never queued: a queued writer would hold back a test that
        // starts a second daemon while holding its first, which holds the
        // writer back in turn. Between two tests' daemons the lock is free.
        let alone = loop {
            match CPUS.clone().try_write_owned() {
                Ok(alone) => break CpuShare::Alone(alone),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        Self::launch_sharing(
            None,
            Some(NONROOT),
            Listen::Abstract,
            extra,
            (false, Shape::Plain),
            true,
            alone,
        )
        .await
    }

    /// [`Daemon::start`] on the cache dir `cache` (owned by 65532) when given.
    pub async fn start_with_cache(cache: Option<&Path>, extra: &[&str]) -> Daemon {
        Self::launch(cache, Some(NONROOT), Listen::Abstract, extra, false).await
    }

    /// [`Daemon::start`] without `--debug`, for long runs: a debug log
    /// grows with every call, and the default log level is what a sidecar
    /// runs with.
    pub async fn start_without_debug_log(extra: &[&str]) -> Daemon {
        Self::launch_with(None, Some(NONROOT), Listen::Abstract, extra, false, false).await
    }

    /// `xfn start` as root (it then maps a whole id range); the client
    /// helpers still dial as 65532 unless told otherwise, so readiness is
    /// probed as root.
    pub async fn start_as_root(extra: &[&str]) -> Daemon {
        Self::launch(None, None, Listen::Abstract, extra, false).await
    }

    /// [`Daemon::start`] as uid 65532 without capabilities but with its
    /// bounding set (a login user's), whose user has the 65536 subordinate
    /// uids and gids from `first` and the setuid `newuidmap`/`newgidmap`:
    /// in a mount namespace of its own where /etc/subuid, /etc/subgid and
    /// /etc/passwd (a `xfn` entry for 65532) are the test's files, bound over
    /// the host's, which stay untouched.
    pub async fn start_with_subordinate_ids(first: u32, extra: &[&str]) -> Daemon {
        let shared = CpuShare::Shared(CPUS.clone().read_owned().await);
        Self::launch_sharing(
            None,
            Some(NONROOT),
            Listen::Abstract,
            extra,
            (false, Shape::SubordinateIds(first)),
            true,
            shared,
        )
        .await
    }

    /// `xfn start` with its default id flags as the root of a pod with
    /// `hostUsers: false` whose 65536 ids start at host id `base`
    /// (`as_pod_root`), on a cache dir owned by the pod's root; clients
    /// dial as that root (host uid `base`) unless told otherwise.
    pub async fn start_as_pod_root(base: u32, extra: &[&str]) -> Daemon {
        let shared = CpuShare::Shared(CPUS.clone().read_owned().await);
        Self::launch_sharing(
            None,
            Some(base),
            Listen::Abstract,
            extra,
            (false, Shape::PodRoot(base)),
            true,
            shared,
        )
        .await
    }

    /// [`Daemon::start`] listening on `listen`.
    pub async fn start_listening(listen: Listen, extra: &[&str]) -> Daemon {
        Self::launch(None, Some(NONROOT), listen, extra, false).await
    }

    /// [`Daemon::start_with_cache`] on Crossplane's default address, in a
    /// network namespace of its own (no registry is reachable there: give
    /// it a cache that holds its images).
    pub async fn start_on_the_default_socket(cache: &Path, extra: &[&str]) -> Daemon {
        Self::launch(
            Some(cache),
            Some(NONROOT),
            Listen::DefaultInOwnNetwork,
            extra,
            false,
        )
        .await
    }

    /// [`Daemon::start_with_cache`] as PID 1 of a fresh PID namespace (with
    /// its own /proc), as a sidecar container runs it: every incarnation is
    /// PID 1. Killing the daemon kills PID 1, and with it the namespace.
    pub async fn start_as_pid1(cache: &Path, extra: &[&str]) -> Daemon {
        Self::launch(Some(cache), Some(NONROOT), Listen::Abstract, extra, true).await
    }

    async fn launch(
        cache: Option<&Path>,
        user: Option<u32>,
        listen: Listen,
        extra: &[&str],
        as_pid1: bool,
    ) -> Daemon {
        Self::launch_with(cache, user, listen, extra, as_pid1, true).await
    }

    async fn launch_with(
        cache: Option<&Path>,
        user: Option<u32>,
        listen: Listen,
        extra: &[&str],
        as_pid1: bool,
        debug: bool,
    ) -> Daemon {
        let shared = CpuShare::Shared(CPUS.clone().read_owned().await);
        let shape = (as_pid1, Shape::Plain);
        Self::launch_sharing(cache, user, listen, extra, shape, debug, shared).await
    }

    #[allow(clippy::too_many_arguments)] // the launchers above name them
    async fn launch_sharing(
        cache: Option<&Path>,
        user: Option<u32>,
        listen: Listen,
        extra: &[&str],
        (as_pid1, shape): (bool, Shape),
        debug: bool,
        cpus: CpuShare,
    ) -> Daemon {
        let dir = world_traversable_tempdir();
        let cache_dir = match cache {
            Some(cache) => cache.to_path_buf(),
            None => {
                let cache_dir = dir.path().join("cache");
                let owner = match shape {
                    Shape::PodRoot(base) => base,
                    Shape::Plain | Shape::SubordinateIds(_) => NONROOT,
                };
                dir_owned_by(&cache_dir, owner);
                cache_dir
            }
        };
        let socket = format!(
            "xfn-test/{}/{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let metrics = free_port();
        let log = dir.path().join("daemon.log");
        let log_file = std::fs::File::create(&log).expect("create the daemon log");
        let xfn = &xfn_binary();
        let mut command = match (user, shape) {
            (_, Shape::PodRoot(base)) => as_pod_root(dir.path(), base, POD_CAPABILITIES, xfn),
            (Some(uid), Shape::SubordinateIds(first)) => {
                with_subordinate_ids(dir.path(), uid, first, xfn)
            }
            (Some(uid), Shape::Plain) => unprivileged(uid, xfn),
            (None, _) => std::process::Command::new(xfn),
        };
        if as_pid1 {
            // unshare forks PID 1, which execs the command above; SIGKILL to
            // unshare reaches PID 1 (--kill-child), as a container's end does.
            command = unshared(
                &["--pid", "--fork", "--mount-proc", "--kill-child", "--"],
                command,
            );
        }
        let own_network = matches!(listen, Listen::DefaultInOwnNetwork);
        if own_network {
            // A fresh network namespace has its loopback down: the metrics
            // endpoint binds there.
            command = unshared(
                &[
                    "--net",
                    "--",
                    "sh",
                    "-c",
                    r#"ip link set lo up && exec "$0" "$@""#,
                ],
                command,
            );
        }
        let mut endpoint = match listen {
            Listen::Abstract => Dial::Abstract(socket.clone()),
            Listen::Path(path) => Dial::Path(path),
            Listen::Tcp => Dial::Tcp(free_port()),
            // Its network namespace is known once it runs.
            Listen::DefaultInOwnNetwork => Dial::Abstract(DEFAULT_SOCKET.to_string()),
        };
        command.arg("start");
        match &endpoint {
            Dial::Abstract(_) if own_network => &mut command,
            Dial::Abstract(name) => command.arg("--address").arg(format!("@{name}")),
            Dial::AbstractIn(..) => unreachable!("made below"),
            Dial::Path(path) => command.arg("--address").arg(path),
            Dial::Tcp(addr) => command
                .args(["--network", "tcp", "--address"])
                .arg(addr.to_string()),
        };
        if debug {
            command.arg("--debug");
        }
        if matches!(shape, Shape::Plain) && user.is_some_and(|uid| uid != 0) {
            // No capabilities and no subordinate ids: its functions run on
            // its own uid, which xfn refuses unless accepted.
            command.arg("--allow-shared-uid");
        }
        let child = command
            .arg("--cache-dir")
            .arg(&cache_dir)
            .arg("--metrics-address")
            .arg(metrics.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn xfn start");
        if own_network {
            // unshare, sh and setpriv exec: the pid is xfn's.
            endpoint = Dial::AbstractIn(DEFAULT_SOCKET.to_string(), child.id());
        }
        let socket = match own_network {
            true => DEFAULT_SOCKET.to_string(),
            false => socket,
        };
        let mut daemon = Daemon {
            child: Some(child),
            socket,
            endpoint,
            metrics,
            cache_dir,
            log,
            caller: user,
            as_pid1,
            _dir: dir,
            _cpus: cpus,
        };
        daemon.wait_until_serving().await;
        daemon
    }

    async fn wait_until_serving(&mut self) {
        for _ in 0..200 {
            if let Some(status) = self.try_wait() {
                panic!("xfn start exited with {status}:\n{}", self.log());
            }
            if let Ok(channel) = self.channel_as(self.caller).await {
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                let req = tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                };
                if health.check(req).await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("xfn start did not serve within 10 s:\n{}", self.log());
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the daemon logged `needle` `count` times (bounded: a
    /// hang becomes a failure naming what was awaited, not a timing
    /// threshold).
    pub async fn wait_for_log(&self, needle: &str, count: usize) {
        for _ in 0..500 {
            if self.log().matches(needle).count() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no {count} x {needle:?} in:\n{}", self.log());
    }

    /// Calls `image`, a function that echoes its input, and checks that it
    /// did (the daemon's log in the panic otherwise).
    pub async fn call_ok(&self, image: &str) {
        let out = self
            .client()
            .await
            .run_function(request(image, FUNCTION_IO))
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}", self.log()));
        assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
    }

    /// Starts a call of `image` on a client of its own and waits until the
    /// daemon counts `runs` runs in flight (this call's among them): a call
    /// to cancel, outlive, or queue behind. The call's answer is the
    /// handle's.
    pub async fn call_in_flight(&self, image: &str, runs: u32) -> Call {
        let mut client = self.client().await;
        let req = request(image, FUNCTION_IO);
        let call = tokio::spawn(async move { client.run_function(req).await });
        self.wait_for_metric("xfn_runs_in_flight", f64::from(runs))
            .await;
        call
    }

    /// The pid of the process the test started: outside PID-1 mode the
    /// supervisor `xfn start` leaves outside its PID namespace
    /// (`xfn::pidns`; [`Daemon::xfn_pid`] is xfn), under `unshare` unshare.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The exit status if it exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("try_wait"))
    }

    /// Kills the daemon with SIGKILL (as a crash would) and reaps it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        kill_children(child.id());
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
    }

    /// A command-line fragment only this daemon's processes (the process
    /// that was started, its gatekeeper and, outside PID-1 mode, the init
    /// and xfn in its PID namespace) carry.
    pub fn cmdline_marker(&self) -> String {
        format!("@{} ", self.socket)
    }

    /// The host pid of PID 1 of the daemon's PID namespace, for a daemon
    /// started by [`Daemon::start_as_pid1`]: `unshare`'s only child.
    pub fn pid1(&self) -> u32 {
        assert!(self.as_pid1, "not started as PID 1");
        let pid = self.pid();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .expect("unshare's children");
        let [child]: [u32; 1] = children
            .split_whitespace()
            .map(|c| c.parse().expect("a pid"))
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or_else(|c| panic!("unshare has children {c:?}"));
        child
    }

    /// The host pid of PID 1 of the PID namespace `xfn start` makes for
    /// itself outside PID-1 mode (`xfn::pidns`): the child of the daemon
    /// that lives in another PID namespace (the other is the gatekeeper).
    pub fn own_namespace_init(&self) -> u32 {
        assert!(!self.as_pid1, "started as PID 1: no namespace of its own");
        let pid = self.pid();
        let namespace = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
        let children = children_of(pid);
        children
            .iter()
            .copied()
            .find(|&child| namespace(child) != namespace(pid))
            .unwrap_or_else(|| {
                panic!("no child of {pid} in a PID namespace of its own: {children:?}")
            })
    }

    /// The host pid of the gatekeeper: a child of the process that forked
    /// it before entering any namespace, xfn under `unshare`, else the
    /// supervisor, the daemon's process (beside the init of its namespace).
    pub fn gatekeeper_pid(&self) -> u32 {
        let forker = if self.as_pid1 {
            self.xfn_pid()
        } else {
            self.pid()
        };
        let marker = self.cmdline_marker();
        let init = (!self.as_pid1).then(|| self.own_namespace_init());
        let gates: Vec<u32> = children_of(forker)
            .into_iter()
            .filter(|&p| Some(p) != init && processes_with(&marker).contains(&p))
            .collect();
        let [gate]: [u32; 1] = gates
            .clone()
            .try_into()
            .unwrap_or_else(|_| panic!("not one gatekeeper among {gates:?}"));
        gate
    }

    /// The host pid of the xfn process that serves: the only child of the
    /// init of its PID namespace (see `xfn::pid1`, `xfn::pidns`), which is
    /// PID 1 under `unshare` or the one the daemon made for itself.
    pub fn xfn_pid(&self) -> u32 {
        let init = if self.as_pid1 {
            self.pid1()
        } else {
            self.own_namespace_init()
        };
        let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
            .expect("the init's children");
        let [xfn]: [u32; 1] = children
            .split_whitespace()
            .map(|c| c.parse().expect("a pid"))
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or_else(|c| panic!("PID 1 has children {c:?}, not xfn alone"));
        xfn
    }

    /// Sends SIGTERM to the daemon; under [`Daemon::start_as_pid1`] to
    /// PID 1 of its namespace, as a container runtime stops a container.
    pub fn sigterm(&self) {
        let pid = if self.as_pid1 {
            self.pid1()
        } else {
            self.pid()
        };
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    }

    /// Waits for the daemon to exit (blocking the caller's thread off the runtime).
    pub async fn wait(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        tokio::task::spawn_blocking(move || child.wait().expect("wait"))
            .await
            .expect("join")
    }

    /// A channel to the daemon, dialled by a thread whose effective uid is
    /// `uid` (`None`: the test's own, root).
    pub async fn channel_as(&self, uid: Option<u32>) -> Result<Channel, tonic::transport::Error> {
        channel_to(self.endpoint.clone(), uid).await
    }

    /// A runner client dialled as the daemon's own uid.
    pub async fn client(&self) -> Client {
        let channel = self
            .channel_as(self.caller)
            .await
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", self.log()));
        // Let big outputs through.
        Client::new(channel).max_decoding_message_size(usize::MAX)
    }

    /// A [`RawClient`] dialled as the daemon's own uid (Unix sockets only).
    pub async fn raw_client(&self) -> RawClient {
        let stream = connect_unix_as(&self.endpoint, self.caller)
            .await
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", self.log()));
        let (send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await
        .expect("HTTP/2 handshake");
        tokio::spawn(connection);
        let transport = tower::service_fn(move |request| {
            let mut send = send.clone();
            async move { send.send_request(request).await }
        });
        RawClient::with_origin(
            tower::util::BoxCloneService::new(transport),
            Uri::from_static("http://xfn.invalid"),
        )
    }

    /// A bare connection to the daemon (Unix sockets only), made by a
    /// thread whose effective uid is `uid`, as a gRPC client makes it.
    pub async fn connect_raw(&self, uid: Option<u32>) -> std::io::Result<tokio::net::UnixStream> {
        connect_unix_as(&self.endpoint, uid).await
    }

    /// The daemon's address as a gRPC C-core client (grpcio) names it.
    pub fn grpcio_target(&self) -> String {
        match &self.endpoint {
            Dial::Abstract(name) | Dial::AbstractIn(name, _) => format!("unix-abstract:{name}"),
            Dial::Path(path) => format!("unix:{}", path.display()),
            Dial::Tcp(addr) => addr.to_string(),
        }
    }

    /// The network namespace the daemon listens in, when it has its own.
    pub fn network_namespace(&self) -> Option<PathBuf> {
        match &self.endpoint {
            Dial::AbstractIn(_, pid) => Some(PathBuf::from(format!("/proc/{pid}/ns/net"))),
            _ => None,
        }
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(self.metrics)
            .await
            .expect("connect to metrics");
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut text = String::new();
        conn.read_to_string(&mut text).await.expect("read");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        text
    }

    /// The value of `xfn_runs_total{outcome="OUTCOME"}`, 0 when absent.
    pub async fn runs(&self, outcome: &str) -> f64 {
        self.metric(&format!("xfn_runs_total{{outcome=\"{outcome}\"}}"))
            .await
    }

    /// The value of one metric line (`name{labels}`), 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_in(&self.metrics_text().await, series)
    }

    /// Polls until `series` reads `value` (the daemon's own view, so tests
    /// wait for states, not for durations).
    pub async fn wait_for_metric(&self, series: &str, value: f64) {
        self.wait_for_metrics(&format!("{series} never became {value}"), |text| {
            metric_in(text, series) == value
        })
        .await;
    }

    /// Polls until `holds` is true of one `/metrics` text (read its series
    /// with [`metric_in`]); panics with `never` otherwise.
    pub async fn wait_for_metrics(&self, never: &str, holds: impl Fn(&str) -> bool) {
        for _ in 0..600 {
            if holds(&self.metrics_text().await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{never}:\n{}\n{}", self.metrics_text().await, self.log());
    }

    /// SIGTERM while a call of `slow_image` (a function slower than the
    /// signal) is in flight: the call still gets its full output, and the
    /// daemon exits 0 after saying every run finished.
    pub async fn sigterm_drains_a_call_in_flight(&mut self, slow_image: &str) {
        let mut client = self.client().await;
        let image = slow_image.to_string();
        let call =
            tokio::spawn(async move { client.run_function(request(&image, FUNCTION_IO)).await });
        self.wait_for_metric("xfn_runs_in_flight", 1.0).await;
        self.sigterm();
        let out = call
            .await
            .unwrap()
            .unwrap_or_else(|s| panic!("{s:?}\n{}", self.log()));
        assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
        let status = self.wait().await;
        assert!(status.success(), "{status}\n{}", self.log());
        assert!(self.log().contains("every run finished"), "{}", self.log());
    }
}

/// SIGKILLs the children of `pid`: under `unshare`, the daemon itself (PID 1
/// of its namespace: the parent-death signal `--kill-child` sets is cleared
/// when setpriv changes credentials); otherwise its gatekeeper.
fn kill_children(pid: u32) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // As a supervisor stops it, so that it removes its warm
            // containers and run state; killed only if it does not exit.
            // Under `unshare` the signal goes to PID 1, as `sigterm` sends it.
            let started = child.id();
            let term = match self.as_pid1 {
                true => children_of(started).first().copied(),
                false => None,
            }
            .unwrap_or(started);
            if !crate::child::sigterm_and_wait(&mut child, term) {
                kill_children(child.id());
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// The value of one metric line (`name{labels}`) of a `/metrics` text, 0
/// when absent.
pub fn metric_in(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(|value| value.trim().parse().expect("metric value"))
        })
        .unwrap_or(0.0)
}

/// The first host uid (and gid) of a 65536-id subordinate range for
/// [`Daemon::start_with_subordinate_ids`], the `n`th of this test process:
/// ids no user of this machine has, and distinct between test processes.
pub fn subordinate_range(n: u32) -> u32 {
    let slot = (std::process::id() * 4 + n) % 4096;
    2_000_000 + slot * 65536
}

/// Calls RunFunction on `target` (a gRPC target such as
/// `unix-abstract:crossplane/fn/default.sock`) with Python's grpcio, as
/// root (an allowed caller), in the daemon's network namespace when it has
/// its own: the response, or the status grpcio reported.
pub fn grpcio_run_function(
    daemon: &Daemon,
    target: &str,
    req: &crate::pb::RunFunctionRequest,
) -> Result<crate::pb::RunFunctionResponse, String> {
    use prost::Message;
    let script = crate::repo_root().join("tests/python/grpcio_call.py");
    let method = "/apiextensions.fn.proto.v1alpha1.ContainerizedFunctionRunnerService/RunFunction";
    let mut command = match daemon.network_namespace() {
        Some(ns) => {
            let mut command = std::process::Command::new("nsenter");
            command
                .arg(format!("--net={}", ns.display()))
                .args(["--", "python3"]);
            command
        }
        None => std::process::Command::new("python3"),
    };
    // On stdin: a request may be larger than an argument can be.
    let child = crate::child::ChildGuard::spawn_with_input(
        command
            .arg(script)
            .args([target, method, "-"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
        hex::encode(req.encode_to_vec()).as_bytes(),
    );
    let out = child.output_within("grpcio_call.py", std::time::Duration::from_secs(120));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let bytes = hex::decode(String::from_utf8_lossy(&out.stdout).trim()).expect("hex response");
    Ok(crate::pb::RunFunctionResponse::decode(bytes.as_slice()).expect("a RunFunctionResponse"))
}
