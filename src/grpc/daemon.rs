//! A daemon: one runner behind the gRPC layer, as `xfn start` and `xfn
//! adapt` both are. A front end brings its listener and its gRPC service;
//! the daemon brings everything they share, in one place:
//!
//! ```text
//! Daemon::new(runner, options)      metrics (calls, cache, warm pool, gate),
//!                                   admission (Calls), the cache's budget
//! daemon.runner(), daemon.calls()   what the front end's service is built on
//! daemon.serve(incoming, services)  /metrics, connections' bounds, serve
//!                                   until SIGTERM/SIGINT, drain within the
//!                                   grace period, code pages given back
//!                                   while idle; then the warm containers go
//! ```
//!
//! # Invariants
//! - **No warm container outlives the daemon**: [`Daemon::serve`] shuts the
//!   runner's pool down after serving, whatever serving returned.
//! - **The cache's budget holds from the start**: the collector
//!   ([`crate::runner::budget`]) is started by [`Daemon::new`], before the
//!   first call, when a budget is given.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/grpc/daemon.rs`.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::grpc::admission::AdmissionLimits;
use crate::grpc::connections::{ConnectionLimits, Connections};
use crate::grpc::metrics::{Metrics, MetricsError, MetricsServer};
use crate::grpc::serve::{serve, shutdown_signal, Incoming, ServeError, ServiceSet};
use crate::grpc::Calls;
use crate::runner::Runner;

/// Why a daemon stopped serving with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The metrics endpoint could not be served or stopped.
    #[error("the metrics endpoint failed")]
    Metrics(#[from] MetricsError),
    /// The gRPC server failed.
    #[error("serving failed")]
    Serve(#[from] ServeError),
}

/// How a daemon serves: the gRPC layer's bounds and where its metrics go.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Run slots and queue caps.
    pub admission: AdmissionLimits,
    /// Connections' timeouts and cap (already fitted to the descriptor
    /// limit: `ConnectionLimits::fitted_to`).
    pub connections: ConnectionLimits,
    /// After SIGTERM/SIGINT, how long calls may take before they are
    /// cancelled.
    pub grace_period: Duration,
    /// Serve Prometheus metrics at `http://ADDRESS/metrics`.
    pub metrics_address: Option<SocketAddr>,
    /// Keep the image cache under this many bytes (`xfn start`); `None`
    /// leaves it alone (`xfn adapt`, whose one image is pinned anyway).
    pub cache_max_bytes: Option<u64>,
    /// The gatekeeper's counters, when callers come through one (Unix
    /// sockets).
    pub gate: Option<super::refusals::RefusalCounters>,
}

/// A runner, its admission and its metrics, ready to serve.
pub struct Daemon {
    runner: Arc<Runner>,
    calls: Arc<Calls>,
    metrics: Arc<Metrics>,
    options: DaemonOptions,
}

impl Daemon {
    /// Builds the daemon over `runner`, and starts keeping the cache within
    /// its budget. On the async runtime.
    pub fn new(runner: Runner, options: DaemonOptions) -> Self {
        let runner = Arc::new(runner);
        let pooled = Arc::clone(&runner);
        let mut metrics = Metrics::new()
            .with_store(runner.store().clone())
            .with_pool(move || pooled.pool_stats());
        if let Some(gate) = options.gate.clone() {
            metrics = metrics.with_gate(gate);
        }
        let metrics = Arc::new(metrics);
        // Read from the engine where it is made: no layer of a call needs it.
        metrics.set_limits_enforced(runner.limits_unavailable().is_none());
        let calls = Arc::new(Calls::new(options.admission, Arc::clone(&metrics)));
        if let Some(max) = options.cache_max_bytes {
            crate::runner::budget::keep_cache_within(Arc::clone(&runner), max);
        }
        Self {
            runner,
            calls,
            metrics,
            options,
        }
    }

    /// The runner calls run on.
    pub fn runner(&self) -> &Arc<Runner> {
        &self.runner
    }

    /// The metrics the endpoint serves, for a front end's own.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Admission, for the front end's service.
    pub fn calls(&self) -> &Arc<Calls> {
        &self.calls
    }

    /// Serves `services` on `incoming` (and the metrics endpoint) until
    /// SIGTERM/SIGINT, drains within the grace period, then shuts the warm
    /// pool down.
    pub async fn serve(self, incoming: Incoming, services: ServiceSet) -> Result<(), DaemonError> {
        let served = self.serve_until_drained(incoming, services).await;
        // Runs are drained or cancelled by now: no warm container outlives
        // the daemon, whatever serving returned.
        self.runner.shutdown().await;
        served
    }

    async fn serve_until_drained(
        &self,
        incoming: Incoming,
        services: ServiceSet,
    ) -> Result<(), DaemonError> {
        let options = &self.options;
        let metrics_server = MetricsServer::start(
            options.metrics_address,
            Arc::clone(&self.metrics),
            options.connections,
        )
        .await?;
        let admission = options.admission;
        let connections = options.connections;
        tracing::info!(
            max_concurrent_runs = admission.max_running,
            max_queued_runs = admission.max_queued,
            max_queued_bytes = admission.max_queued_bytes,
            grace_period = ?options.grace_period,
            max_connections = connections.max_connections,
            handshake_timeout = ?connections.handshake_timeout,
            idle_connection_timeout = ?connections.idle_timeout,
            "admission, connections and drain"
        );
        // Start-up (flags, probes, sweeps) is done: its code pages go, what
        // the calls run comes back as they run (crate::resident).
        let released_kb = crate::resident::release_file_pages();
        tracing::debug!(released_kb, "start-up pages released");
        self.metrics.set_ready(true);
        let shutdown = async {
            shutdown_signal().await;
            self.metrics.set_ready(false);
        };
        let served = serve(
            incoming,
            services,
            Connections::new(connections, Arc::clone(&self.metrics)),
            self.calls.drain(options.grace_period),
            shutdown,
        );
        // Between bursts of calls, the code they ran goes.
        let idle = crate::resident::release_when_idle(|| self.calls.activity());
        tokio::select! {
            served = served => served?,
            () = idle => {}
        }
        if let Some(server) = metrics_server {
            server.stop().await?;
        }
        tracing::info!("stopped");
        Ok(())
    }
}
