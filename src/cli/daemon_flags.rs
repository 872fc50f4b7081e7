//! The flags of the gRPC layer, shared by `xfn start`, `xfn adapt` and `xfn host`
//! (one set of defaults for every daemon; see `crate::grpc`), mapped to
//! the library's `DaemonOptions`.
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::grpc::admission::{AdmissionLimits, DEFAULT_MAX_QUEUED_RUNS};
use crate::grpc::connections::{raise_fd_limit, ConnectionLimits, DEFAULT_MAX_CONNECTIONS};
use crate::grpc::daemon::DaemonOptions;

use super::run::parse_duration;
use super::{RunnerArgs, WarmPoolArgs};
use crate::image::ImageStore;
use crate::runner::{Namespace, Runner, RunnerOptions};
use anyhow::Context as _;

/// Admission, drain and metrics flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct DaemonArgs {
    /// Runs at once (default: the number of CPUs); later callers wait in
    /// FIFO order, each until its own deadline (grpc-timeout).
    #[arg(long)]
    pub(crate) max_concurrent_runs: Option<usize>,
    /// Callers that may wait for a run slot; past it, ResourceExhausted.
    #[arg(long, default_value_t = DEFAULT_MAX_QUEUED_RUNS)]
    pub(crate) max_queued_runs: usize,
    /// Input the waiting callers may hold together, a quantity like
    /// 256Mi; past it, ResourceExhausted.
    #[arg(long, default_value = "256Mi", value_parser = super::parse_byte_count)]
    pub(crate) max_queued_bytes: usize,
    /// After SIGTERM/SIGINT, how long calls in flight may take to finish
    /// before they are cancelled. The default ends inside Kubernetes' 30 s
    /// termination grace, leaving time to cancel and exit before SIGKILL.
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub(crate) grace_period: Duration,
    /// Serve Prometheus metrics at http://ADDRESS/metrics.
    #[arg(long)]
    pub(crate) metrics_address: Option<SocketAddr>,
    /// Most client connections open at once (at most the descriptor limit
    /// less 1024): a new one past it closes the connection idle the longest.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// A connection that has not sent its HTTP/2 preface by then is cut.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) handshake_timeout: Duration,
    /// A connection with no call in flight this long is closed (GOAWAY:
    /// gRPC clients reconnect on their next call).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) idle_connection_timeout: Duration,
}

impl DaemonArgs {
    /// The admission limits these flags give.
    pub(crate) fn limits(&self) -> AdmissionLimits {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        AdmissionLimits {
            max_running: self.max_concurrent_runs.unwrap_or(cpus).max(1),
            max_queued: self.max_queued_runs,
            max_queued_bytes: self.max_queued_bytes,
        }
    }

    /// The connection bounds these flags give, fitted under the descriptor
    /// limit (raised to its hard limit first).
    pub(crate) fn connection_limits(&self) -> ConnectionLimits {
        let asked = ConnectionLimits {
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_connection_timeout,
            max_connections: self.max_connections.max(1),
        };
        let fd_limit = raise_fd_limit();
        let (limits, shrunk) = asked.fitted_to(fd_limit);
        if shrunk {
            tracing::warn!(
                asked = asked.max_connections,
                max_connections = limits.max_connections,
                fd_limit,
                "--max-connections lowered to fit the descriptor limit (RLIMIT_NOFILE) less 1024 kept for runs"
            );
        }
        limits
    }

    /// The daemon these flags give, with the cache's budget and the
    /// gatekeeper's counters of the front end.
    pub(crate) fn daemon_options(
        &self,
        cache_max_bytes: Option<u64>,
        gate: Option<crate::grpc::refusals::RefusalCounters>,
    ) -> DaemonOptions {
        DaemonOptions {
            admission: self.limits(),
            connections: self.connection_limits(),
            grace_period: self.grace_period,
            metrics_address: self.metrics_address,
            cache_max_bytes,
            gate,
        }
    }
}

/// A daemon's runner (`xfn start`, `xfn adapt`): warm containers on, the
/// OCI runtime checked and logged. `state_in_memory` where the daemon's
/// containers end with it.
pub(crate) fn daemon_runner(
    namespace: &Namespace,
    store: ImageStore,
    runner: &RunnerArgs,
    warm_pool: &WarmPoolArgs,
    state_in_memory: bool,
) -> anyhow::Result<Runner> {
    let options = RunnerOptions {
        warm_pool: Some(warm_pool.options()),
        state_in_memory,
        ..runner.options()
    };
    let runner = Runner::new(namespace, store, options).context("cannot set up the runner")?;
    let crun = runner.check_runtime()?;
    tracing::info!(%crun, "OCI runtime");
    Ok(runner)
}

/// Says once, at a daemon's start, whether cpu/memory/pids limits are
/// enforced, and what follows where they are not: its calls are refused
/// (`--require-limits`) or its functions run without them.
pub(crate) fn report_limits(runner: &Runner, require_limits: bool) {
    match runner.limits_unavailable() {
        None => tracing::info!("cpu/memory/pids limits are enforced"),
        Some(why) if require_limits => {
            tracing::warn!(%why, "limits are not enforced: calls will be refused (--require-limits)")
        }
        Some(why) => {
            tracing::warn!(%why, "limits are not enforced: functions run without cpu/memory/pids limits")
        }
    }
}
