//! `xfn start`: the sidecar. Serves Crossplane's alpha runner API
//! (`ContainerizedFunctionRunnerService`) from one long-lived process that
//! already sits in its user namespace, so a call costs no re-exec of xfn.
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser};

use crate::grpc::daemon::Daemon;
use crate::grpc::listen::{self, ListenAddress, Listener, Network};
use crate::grpc::serve::Incoming;
use crate::runner::Namespace;
use crate::sidecar::gate::GateReceiver;
use crate::sidecar::peer::CallerPolicy;
use crate::sidecar::{ServiceOptions, SidecarService};

use super::daemon_flags::daemon_runner;
use super::run::parse_duration;
use super::{StoreArgs, UsernsArgs};

/// Flags of `xfn start` (Crossplane's runner flags, plus xfn's own).
#[derive(Debug, Clone, Args)]
pub(crate) struct StartArgs {
    /// Image cache and per-run state.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// User namespace mapping.
    #[command(flatten)]
    pub(crate) userns: UsernsArgs,
    /// Network to listen on.
    #[arg(long, value_enum, default_value = "unix")]
    pub(crate) network: Network,
    /// Address to listen on: `@name` is a Linux abstract socket.
    #[arg(long, default_value = "@crossplane/fn/default.sock")]
    pub(crate) address: String,
    /// Admission, drain and metrics.
    #[command(flatten)]
    pub(crate) daemon: super::daemon_flags::DaemonArgs,
    /// Run timeout when a request sets none (e.g. `25s`, `500ms`, `2m`).
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub(crate) default_timeout: Duration,
    /// Largest accepted FunctionIO input, a quantity like 4Mi.
    #[arg(long, default_value = "4Mi", value_parser = super::parse_byte_count)]
    pub(crate) max_input_bytes: usize,
    /// Also accept Unix callers with this uid (repeatable); the daemon's own
    /// uid and root always are. Others are logged and their connection is
    /// closed at accept (they see a transport error, not a gRPC status).
    #[arg(long = "allow-uid")]
    pub(crate) allow_uids: Vec<u32>,
    /// Serve even where functions must run under xfn's own host uid (no
    /// CAP_SETUID/CAP_SETGID, no subordinate ids): a function can then take
    /// every epoll watch the kernel allows that uid, and no new call is
    /// served while it holds them. Refused at start without this flag.
    #[arg(long)]
    pub(crate) allow_shared_uid: bool,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: super::RunnerArgs,
    /// Warm containers.
    #[command(flatten)]
    pub(crate) warm_pool: super::WarmPoolArgs,
    /// Disk the image cache may take (a quantity): past it, the least
    /// recently used images not in use are removed, after each pull that
    /// downloaded layers and every few minutes. See DEFAULT_CACHE_MAX_SIZE.
    #[arg(long, default_value = DEFAULT_CACHE_MAX_SIZE, value_parser = super::parse_size)]
    pub(crate) cache_max_size: u64,
}

/// Default of `--cache-max-size`. The cache lives on a shared node (an
/// emptyDir or the node's disk, counted against the pod's ephemeral storage
/// and watched by the kubelet's eviction), so it gets a budget rather than
/// the disk: 10 GiB holds a control plane's functions many times over
/// (function images are tens to a few hundred MB, unpacked plus their kept
/// blobs) and more than twice the largest image `--max-image-size` admits
/// by default (4 GiB), so one big image never evicts itself.
pub(crate) const DEFAULT_CACHE_MAX_SIZE: &str = "10Gi";

/// Parses `StartArgs` alone, for their defaults.
#[derive(Debug, Parser)]
struct StartOnly {
    #[command(flatten)]
    args: StartArgs,
}

impl Default for StartArgs {
    /// The flags' defaults (and environment), as `xfn start` with no flags.
    fn default() -> Self {
        match StartOnly::try_parse_from(["xfn"]) {
            Ok(only) => only.args,
            // Only an invalid environment value can get here; clap prints it.
            Err(err) => err.exit(),
        }
    }
}

/// What `prepare` bound, for `execute` (which needs the async runtime to
/// take connections from it).
#[derive(Debug)]
pub(crate) enum Bound {
    /// The gatekeeper's channel (Unix sockets).
    Gate(GateReceiver),
    /// TCP.
    Tcp(std::net::TcpListener),
}

/// Binds the listen address and, for Unix sockets, forks the gatekeeper
/// that checks callers' uids. Runs while xfn is still single-threaded and
/// outside its user namespace: inside it, callers' uids are unreadable (see
/// `crate::sidecar::gate`).
pub(crate) fn prepare(args: &StartArgs) -> anyhow::Result<Bound> {
    let address = ListenAddress::parse(args.network, &args.address)?;
    let bound = match listen::bind(&address)? {
        Listener::Unix(listener) => {
            let policy = CallerPolicy::for_self(&args.allow_uids);
            tracing::info!(%address, allowed_uids = ?policy.allowed(), "listening");
            Bound::Gate(crate::sidecar::gate::spawn(listener, policy)?)
        }
        Listener::Tcp(listener) => {
            tracing::warn!(%address, "listening on TCP: callers cannot be checked (no peer credentials)");
            Bound::Tcp(listener)
        }
    };
    Ok(bound)
}

/// Runs `xfn start`.
pub(crate) async fn execute(
    args: StartArgs,
    bound: Bound,
    namespace: &Namespace,
    state_in_memory: bool,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    refuse_shared_uid(namespace, args.allow_shared_uid)?;
    let store = args.store.open_store(&global.registry)?;
    // Runner::new sweeps what killed xfn processes left under <cache>/run
    // (bundles, crun state, rootfs dirs of dead pids; their mounts died with
    // their mount namespace), so a restarted daemon starts clean. This
    // daemon's own state is in memory where its containers end with it
    // (`state_in_memory`), and goes with it.
    let runner = daemon_runner(
        namespace,
        store,
        &args.runner,
        &args.warm_pool,
        state_in_memory,
    )?;
    super::daemon_flags::report_limits(&runner, args.runner.require_limits);
    // What the kernel counts per host uid only (src/sandbox/ucounts.rs).
    log_function_uids(namespace);
    log_socket_scoping();
    let (incoming, gate) = match bound {
        Bound::Gate(gate) => {
            let counters = gate.counters();
            (gate.incoming()?, Some(counters))
        }
        Bound::Tcp(listener) => (Incoming::Tcp(listener), None),
    };
    let daemon = Daemon::new(
        runner,
        args.daemon.daemon_options(Some(args.cache_max_size), gate),
    );
    let service = SidecarService::new(
        Arc::clone(daemon.runner()),
        ServiceOptions {
            default_timeout: args.default_timeout,
            max_input_bytes: args.max_input_bytes,
        },
        Arc::clone(daemon.calls()),
    );
    tracing::info!(
        address = %args.address,
        cache_dir = %args.store.cache_dir.display(),
        cache_max_bytes = args.cache_max_size,
        "serving the function runner API"
    );
    daemon.serve(incoming, service.into_service_set()).await?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses to serve where functions share xfn's host uid, unless the
/// operator accepts it (`--allow-shared-uid`). Epoll watches are counted
/// per host uid (`fs.epoll.max_user_watches`), and the daemon needs one for
/// every connection it adopts and every run's pipes (tokio registers each):
/// a function holding them all left 0 of 10 other calls served (issue 31).
/// Nothing xfn can register ahead covers that, so the shape is refused
/// rather than served half-working (docs/start.md: Whose host uid functions
/// run under).
fn refuse_shared_uid(namespace: &Namespace, allowed: bool) -> anyhow::Result<()> {
    match namespace.why_shared_uid() {
        Some(why) if !allowed => anyhow::bail!(
            "functions would run under xfn's own host uid ({why}): one function could take \
             every epoll watch the kernel allows that uid (fs.epoll.max_user_watches) and no \
             new call would be served. Run xfn with CAP_SETUID/CAP_SETGID (as the root of a \
             pod with hostUsers: false, and CAP_SETFCAP: deploy/), or give its user 65536 ids \
             in /etc/subuid and /etc/subgid and newuidmap/newgidmap, so that functions run \
             under other uids; or pass --allow-shared-uid to serve anyway \
             (docs/start.md: Whose host uid functions run under)"
        ),
        _ => Ok(()),
    }
}

/// Says at start whose host uid functions run under, and what follows from
/// it for the counts the kernel keeps per host uid only (docs/design.md:
/// Per-uid kernel counts).
fn log_function_uids(namespace: &Namespace) {
    let epoll_watches = std::fs::read_to_string("/proc/sys/fs/epoll/max_user_watches")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or_default();
    let mapping = namespace.mapping();
    // The ids one level up: the node's where xfn starts in a pod's own user
    // namespace (`hostUsers: false`), where functions get the pod's ids.
    let outer = |uid: u32| {
        namespace.outer_uid(uid).map_or_else(
            || format!("{uid} (unmapped above)"),
            |outer| outer.to_string(),
        )
    };
    match namespace.why_shared_uid() {
        None => {
            let (first, last) = mapping.function_host_uids();
            tracing::info!(
                xfn_uid = %outer(mapping.own_host_uid()),
                function_uids = %format!("{}-{}", outer(first), outer(last)),
                max_user_watches = epoll_watches,
                "functions run under host uids that are not xfn's: the epoll watches the kernel \
                 allows per uid (fs.epoll.max_user_watches) and other per-uid counts of theirs \
                 are not the gatekeeper's; concurrent functions share them with each other"
            );
        }
        Some(why) => tracing::warn!(
            max_user_watches = epoll_watches,
            %why,
            "functions share xfn's host uid (--allow-shared-uid), and with it the epoll watches \
             the kernel allows per uid (fs.epoll.max_user_watches), which the daemon needs for \
             every connection and run: a function holding them all stops new calls being \
             served, and only a --memory limit bounds its share. Run xfn with CAP_SETUID/CAP_SETGID (as \
             the root of a pod with hostUsers: false, and CAP_SETFCAP: deploy/), or give its \
             user 65536 ids in /etc/subuid and /etc/subgid and newuidmap/newgidmap (--subids), \
             so that functions run under other uids (docs/start.md: Whose host uid functions run \
             under)"
        ),
    }
}

/// Says at start whether the kernel keeps functions (those with
/// `NetworkPolicy Runner` share the socket's network namespace) from
/// connecting to the daemon's socket (docs/start.md: Who may call).
fn log_socket_scoping() {
    match crate::sandbox::scope::scoping() {
        crate::sandbox::scope::Scoping::Enforced(_) => tracing::info!(
            "functions cannot connect to abstract sockets outside their run (Landlock scope): \
             the kernel refuses their connects to this socket"
        ),
        crate::sandbox::scope::Scoping::Unavailable(why) => tracing::warn!(
            %why,
            "functions with NetworkPolicy Runner can connect to this socket: the gatekeeper \
             refuses them, but a function looping connect() races it for CPU where limits are \
             not enforced (Linux 6.12 with Landlock enabled lets the kernel refuse them)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_crossplane() {
        let args = StartArgs::default();
        assert_eq!(args.network, Network::Unix);
        assert_eq!(args.address, "@crossplane/fn/default.sock");
        assert_eq!(args.default_timeout, Duration::from_secs(25));
        assert_eq!(args.max_input_bytes, 4 << 20);
        assert_eq!(args.daemon.grace_period, Duration::from_secs(25));
        assert_eq!(args.daemon.max_queued_runs, 1024);
        assert_eq!(
            args.daemon.max_queued_bytes,
            crate::grpc::admission::DEFAULT_MAX_QUEUED_BYTES
        );
        assert_eq!(args.daemon.max_concurrent_runs, None);
        // Warm containers on by default, two per CPU, kept 2 minutes idle,
        // started ahead of their calls.
        assert_eq!(
            args.warm_pool.options(),
            crate::runner::PoolOptions::default()
        );
        // The image cache's budget on a shared node.
        assert_eq!(args.cache_max_size, 10 << 30);
        // Functions on xfn's own uid are refused unless accepted.
        assert!(!args.allow_shared_uid);
    }
}
