//! Prometheus metrics of the daemons (`xfn start`, `xfn adapt`, `xfn host`) and the
//! tiny HTTP server that exposes them at `/metrics`.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::connections::{ConnInfo, ConnectionLimits, Connections, CountCallsLayer, Tracked};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Errors of the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The listen address could not be bound.
    #[error("cannot listen for metrics on {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("metrics server failed: {0}")]
    Serve(std::io::Error),
    /// The serving task panicked.
    #[error("metrics server panicked: {0}")]
    Panicked(String),
}

/// One label (`outcome`, `reason`): an array, so a call allocates none.
type OutcomeLabels = [(&'static str, &'static str); 1];
type DurationFamily = Family<OutcomeLabels, Histogram, fn() -> Histogram>;

/// Buckets from 1 ms to ~33 s: a warm run is milliseconds, a cold pull or a
/// timeout is seconds.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Every metric the service records.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    runs: Family<OutcomeLabels, Counter>,
    run_duration: DurationFamily,
    in_flight: Gauge,
    queued: Gauge,
    limits_enforced: Gauge,
    run_cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    run_memory_peak: Histogram,
    connections_open: Gauge,
    connections_closed: Family<OutcomeLabels, Counter>,
    /// The same of the metrics endpoint's own connections.
    endpoint_connections: ConnectionCounts,
    /// A front end's own metrics (`xfn host`'s per function), set once.
    front_end: Arc<std::sync::OnceLock<Box<dyn prometheus_client::collector::Collector>>>,
    /// What `/readyz` answers: serving and not draining.
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// A front end's readiness and status, set once.
    front_end_status: Arc<std::sync::OnceLock<Arc<dyn FrontEndStatus>>>,
}

/// What a front end (`xfn host`) tells on the endpoint beside its metrics:
/// whether what it serves is ready (`/readyz`, `/readyz?function=NAME`)
/// and its status (`/status`, JSON). Each answer is bounded by what it
/// serves (the functions its catalog holds).
pub(crate) trait FrontEndStatus: Send + Sync + std::fmt::Debug {
    /// Whether it is ready as a whole: `Err(why)` while not.
    fn ready(&self) -> Result<(), String>;
    /// Whether the function `name` is: `None` when it serves none so named.
    fn ready_of(&self, name: &str) -> Option<Result<(), String>>;
    /// What `/status` answers.
    fn status(&self) -> serde_json::Value;
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, registered under the `xfn_` prefix.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("xfn");
        let runs = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "runs",
            "RunFunction calls by outcome (ok or the gRPC status code)",
            runs.clone(),
        );
        let run_duration = DurationFamily::new_with_constructor(duration_histogram);
        registry.register(
            "run_duration_seconds",
            "Wall time of RunFunction calls, from admission to answer, by outcome",
            run_duration.clone(),
        );
        let in_flight = Gauge::default();
        registry.register("runs_in_flight", "Runs executing now", in_flight.clone());
        let queued = Gauge::default();
        registry.register(
            "runs_queued",
            "Calls waiting for a run slot (--max-concurrent-runs)",
            queued.clone(),
        );
        let limits_enforced = Gauge::default();
        registry.register(
            "limits_enforced",
            "1 when CPU/memory/pids limits are enforced by a delegated cgroup v2, else 0",
            limits_enforced.clone(),
        );
        let run_cpu_seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "run_cpu_seconds",
            "CPU time used by successful runs, as their cgroups counted (limits enforced only)",
            run_cpu_seconds.clone(),
        );
        // 1 MiB to 16 GiB.
        let run_memory_peak = Histogram::new(exponential_buckets(1048576.0, 2.0, 15));
        registry.register(
            "run_memory_peak_bytes",
            "Peak memory of successful runs (cgroup memory.peak; limits enforced only)",
            run_memory_peak.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Client connections open now (--max-connections caps them)",
            connections_open.clone(),
        );
        let connections_closed = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "connections_closed",
            "Connections the daemon closed or refused, by reason: handshake_timeout, idle_timeout, \
             evicted (the longest idle, at --max-connections), unresponsive (cut after not closing), \
             over_capacity (refused: every connection busy)",
            connections_closed.clone(),
        );
        let endpoint_connections = ConnectionCounts::default();
        registry.register(
            "metrics_connections_open",
            "Connections to this metrics endpoint open now (capped at 64)",
            endpoint_connections.open.clone(),
        );
        registry.register(
            "metrics_connections_closed",
            "Connections to this metrics endpoint it closed, by reason (as xfn_connections_closed)",
            endpoint_connections.closed.clone(),
        );
        let front_end = Arc::new(std::sync::OnceLock::new());
        registry.register_collector(Box::new(FrontEndCollector(Arc::clone(&front_end))));
        Self {
            front_end,
            ready: Arc::default(),
            front_end_status: Arc::default(),
            registry,
            connections_open,
            connections_closed,
            endpoint_connections,
            run_cpu_seconds,
            run_memory_peak,
            runs,
            run_duration,
            in_flight,
            queued,
            limits_enforced,
        }
    }

    /// Records a finished call.
    pub(crate) fn record_run(&self, outcome: &'static str, duration: Duration) {
        let labels = [("outcome", outcome)];
        self.runs.get_or_create(&labels).inc();
        self.run_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// Records what a run's cgroup measured.
    pub(crate) fn record_usage(&self, usage: &crate::runner::RunUsage) {
        self.run_cpu_seconds.inc_by(usage.cpu_usec as f64 / 1e6);
        if let Some(peak) = usage.memory_peak_bytes {
            self.run_memory_peak.observe(peak as f64);
        }
    }

    /// The runs-in-flight gauge.
    pub(crate) fn in_flight(&self) -> &Gauge {
        &self.in_flight
    }

    /// The queued-calls gauge.
    pub(crate) fn queued(&self) -> &Gauge {
        &self.queued
    }

    /// Where the gRPC listener's connections are counted.
    pub(crate) fn connection_counts(&self) -> ConnectionCounts {
        ConnectionCounts {
            open: self.connections_open.clone(),
            closed: self.connections_closed.clone(),
        }
    }

    /// Where the metrics endpoint's own connections are counted.
    pub(crate) fn endpoint_connection_counts(&self) -> ConnectionCounts {
        self.endpoint_connections.clone()
    }

    /// Also exports the gatekeeper's refusal counters (read at each scrape).
    pub(crate) fn with_gate(mut self, counters: super::refusals::RefusalCounters) -> Self {
        self.registry
            .register_collector(Box::new(GateCollector { counters }));
        self
    }

    /// Also exports a front end's own metrics (read at each scrape); the
    /// first collector set stays.
    pub(crate) fn set_front_end(
        &self,
        collector: Box<dyn prometheus_client::collector::Collector>,
    ) {
        let _ = self.front_end.set(collector);
    }

    /// Also answers `/readyz` and `/status` from a front end's status; the
    /// first one set stays.
    pub(crate) fn set_front_end_status(&self, status: Arc<dyn FrontEndStatus>) {
        let _ = self.front_end_status.set(status);
    }

    /// Whether `/readyz` answers 200: set when serving starts, cleared when
    /// the drain starts.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready
            .store(ready, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the limits-enforced gauge.
    pub(crate) fn set_limits_enforced(&self, enforced: bool) {
        self.limits_enforced.set(i64::from(enforced));
    }

    /// Also exports the image store's pull counters (read at each scrape).
    pub(crate) fn with_store(mut self, store: crate::image::ImageStore) -> Self {
        self.registry
            .register_collector(Box::new(StoreCollector { store }));
        self
    }

    /// Also exports the warm pool's gauges and counters (read at each
    /// scrape from `stats`; nothing while it returns `None`, a runner without
    /// a pool).
    pub(crate) fn with_pool(
        mut self,
        stats: impl Fn() -> Option<crate::runner::PoolStats> + Send + Sync + 'static,
    ) -> Self {
        self.registry.register_collector(Box::new(PoolCollector {
            stats: Box::new(stats),
        }));
        self
    }

    /// The OpenMetrics text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The image store's counters: what a cold call costs (remote manifest
/// resolutions, layer downloads, extractions) next to the warm calls that
/// cost none of them.
struct StoreCollector {
    store: crate::image::ImageStore,
}

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCollector")
            .field("root", &self.store.root())
            .finish()
    }
}

impl prometheus_client::collector::Collector for StoreCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = self.store.stats();
        let counters = [
            (
                "image_manifests_resolved",
                "Image references resolved at a registry (cache misses or pull policy Always)",
                stats.manifests_resolved.load(Relaxed),
            ),
            (
                "image_blobs_downloaded",
                "Layer blobs downloaded",
                stats.blobs_downloaded.load(Relaxed),
            ),
            (
                "image_layers_extracted",
                "Layers extracted into the cache",
                stats.layers_extracted.load(Relaxed),
            ),
        ];
        encode_counters(&mut encoder, &counters)
    }
}

/// A front end's collector, once set ([`Metrics::set_front_end`]).
struct FrontEndCollector(
    Arc<std::sync::OnceLock<Box<dyn prometheus_client::collector::Collector>>>,
);

impl std::fmt::Debug for FrontEndCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FrontEndCollector")
            .field(&self.0.get().is_some())
            .finish()
    }
}

impl prometheus_client::collector::Collector for FrontEndCollector {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        match self.0.get() {
            Some(collector) => collector.encode(encoder),
            None => Ok(()),
        }
    }
}

/// Unlabelled counters read at scrape time: (name, help, value) each.
fn encode_counters(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    counters: &[(&str, &str, u64)],
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::counter::ConstCounter;
    for &(name, help, value) in counters {
        let counter = ConstCounter::new(value);
        let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
        counter.encode(metric)?;
    }
    Ok(())
}

/// The gatekeeper's refusals, counted in its own process (see
/// [`RefusalCounters`](super::refusals::RefusalCounters)).
#[derive(Debug)]
struct GateCollector {
    counters: super::refusals::RefusalCounters,
}

impl prometheus_client::collector::Collector for GateCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "callers_refused",
            "Unix connections the gatekeeper refused, by reason: uid (not allowed), container (a process in a \
             container, such as a function), credentials (unreadable)",
            None,
            counter.metric_type(),
        )?;
        for (reason, value) in self.counters.refused() {
            ConstCounter::new(value).encode(family.encode_family(&[("reason", reason)])?)?;
        }
        Ok(())
    }
}

/// The warm pool's figures (`lifecycle/pool.rs`): whether calls find a
/// container ready, how many wait, how many were made and thrown away.
struct PoolCollector {
    stats: Box<dyn Fn() -> Option<crate::runner::PoolStats> + Send + Sync>,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCollector").finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for PoolCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(stats) = (self.stats)() else {
            return Ok(());
        };
        let gauges = [
            (
                "warm_pool_size",
                "Most warm containers at once, ready or being created (--warm-pool)",
                stats.size,
            ),
            (
                "warm_containers_ready",
                "Warm containers ready for a call",
                stats.ready,
            ),
            (
                "warm_containers",
                "Warm containers that exist: ready or being created",
                stats.total,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let calls = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "warm_pool_calls",
            "Calls by whether a warm container was ready for their image and settings (warm) or not (cold: crun run)",
            None,
            calls.metric_type(),
        )?;
        for (path, value) in [("warm", stats.warm_calls), ("cold", stats.cold_calls)] {
            let labels = [("path", path)];
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        let counters = [
            (
                "warm_containers_created",
                "Warm containers created (the pool's refills)",
                stats.created,
            ),
            (
                "warm_container_create_failures",
                "Warm container creations that failed (calls of that image take the cold path for a while)",
                stats.create_failures,
            ),
            (
                "warm_containers_discarded",
                "Warm containers removed unused: idle past --warm-pool-idle, above their image's recent demand, or at shutdown",
                stats.discarded,
            ),
        ];
        encode_counters(&mut encoder, &counters)
    }
}

/// One listener's connections: open now, and closed by reason.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionCounts {
    open: Gauge,
    closed: Family<OutcomeLabels, Counter>,
}

impl ConnectionCounts {
    /// Connections open now.
    pub(crate) fn set_open(&self, open: usize) {
        self.open.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// Counts a connection closed or refused, by reason.
    pub(crate) fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&[("reason", reason)]).inc();
    }
}

/// Most connections the metrics endpoint holds at once: a kubelet's
/// probes and a scraper or two need a few. Out of the descriptors
/// [`super::connections::FD_RESERVE`] keeps beside the gRPC listener's cap.
pub(crate) const ENDPOINT_MAX_CONNECTIONS: usize = 64;

/// A running metrics endpoint; [`MetricsServer::stop`] ends it.
#[derive(Debug)]
pub(crate) struct MetricsServer {
    #[cfg(test)]
    address: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), MetricsError>>,
}

impl MetricsServer {
    /// Serves `metrics` at `address` when one is given (`--metrics-address`),
    /// in a task of its own, its connections held to `limits`' timeouts
    /// and to [`ENDPOINT_MAX_CONNECTIONS`].
    pub(crate) async fn start(
        address: Option<SocketAddr>,
        metrics: Arc<Metrics>,
        limits: ConnectionLimits,
    ) -> Result<Option<Self>, MetricsError> {
        let Some(address) = address else {
            return Ok(None);
        };
        let listener = bind(address).await?;
        let local = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { address, source })?;
        tracing::info!(address = %local, "serving metrics at /metrics");
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let connections = Connections::with_counts(
            ConnectionLimits {
                max_connections: limits.max_connections.min(ENDPOINT_MAX_CONNECTIONS),
                ..limits
            },
            metrics.endpoint_connection_counts(),
            "the metrics endpoint's connection cap",
        );
        let listener = Capped {
            listener,
            connections,
        };
        let task = tokio::spawn(serve(listener, metrics, async move {
            stopped.cancelled().await;
        }));
        Ok(Some(Self {
            #[cfg(test)]
            address: local,
            stop,
            task,
        }))
    }

    /// Where it listens.
    #[cfg(test)]
    fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving and waits for the server to end.
    pub(crate) async fn stop(self) -> Result<(), MetricsError> {
        self.stop.cancel();
        self.task
            .await
            .map_err(|panic| MetricsError::Panicked(panic.to_string()))?
    }
}

/// Binds `address` for the metrics endpoint.
pub(crate) async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener, MetricsError> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| MetricsError::Bind { address, source })
}

/// The endpoint's listener: a connection is taken only with room under
/// its cap (the longest idle closed for it), and watched for the
/// handshake and idle timeouts, as the gRPC listener's are
/// ([`Connections`]). Before, 2,100 idle connections took every one of
/// 2,048 descriptors: calls, cold starts and `/healthz` all failed.
struct Capped {
    listener: tokio::net::TcpListener,
    connections: Arc<Connections>,
}

impl axum::serve::Listener for Capped {
    type Io = Tracked<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            self.connections.room().await;
            let (stream, address) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %crate::chain::Chain(&err), "accepting a connection to the metrics endpoint failed");
                    tokio::time::sleep(super::listen::ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some(tracked) = self.connections.admit(stream) else {
                continue;
            };
            let (connections, conn) = (Arc::clone(&self.connections), Arc::clone(tracked.conn()));
            tokio::spawn(async move { connections.watch(&conn).await });
            return (tracked, address);
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Capped>> for ConnInfo {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Capped>) -> Self {
        ConnInfo(Arc::clone(stream.io().conn()))
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
async fn serve(
    listener: Capped,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), MetricsError> {
    use axum::http::header::CONTENT_TYPE;
    use axum::routing::get;

    let ready = Arc::clone(&metrics.ready);
    let front_end = Arc::clone(&metrics.front_end_status);
    let status = Arc::clone(&metrics.front_end_status);
    let app = axum::Router::new()
        // Alive while this endpoint answers; ready while serving and not
        // draining (a Kubernetes readiness probe takes the pod out of its
        // Service as the drain starts) and what the front end serves is.
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(
                move |axum::extract::RawQuery(query): axum::extract::RawQuery| {
                    let serving = ready.load(std::sync::atomic::Ordering::Relaxed);
                    let answer =
                        readiness(serving, front_end.get().map(|f| &**f), query.as_deref());
                    async move { answer }
                },
            ),
        )
        .route(
            "/status",
            get(move || {
                let answer = match status.get() {
                    Some(status) => (axum::http::StatusCode::OK, status.status().to_string()),
                    None => (axum::http::StatusCode::NOT_FOUND, "{}".to_owned()),
                };
                async move { ([(CONTENT_TYPE, "application/json")], answer) }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.render(),
                    )
                }
            }),
        );
    // Each request counts as a call of its connection: idle is "no
    // request in flight", as for gRPC.
    let app = app
        .layer(CountCallsLayer)
        .into_make_service_with_connect_info::<ConnInfo>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(MetricsError::Serve)
}

/// What `/readyz` answers: 503 while not serving (or draining); else, with
/// a front end, its readiness (of one function with `?function=NAME`, 404
/// for a name it serves none under).
fn readiness(
    serving: bool,
    front_end: Option<&dyn FrontEndStatus>,
    query: Option<&str>,
) -> (axum::http::StatusCode, String) {
    use axum::http::StatusCode;
    if !serving {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_owned());
    }
    let function = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("function="));
    let answer = match (front_end, function) {
        (None, None) => Some(Ok(())),
        (Some(front_end), None) => Some(front_end.ready()),
        (Some(front_end), Some(name)) => front_end.ready_of(name),
        (None, Some(_)) => None,
    };
    match answer {
        Some(Ok(())) => (StatusCode::OK, "ready".to_owned()),
        Some(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, why),
        None => (
            StatusCode::NOT_FOUND,
            format!(
                "no function {} is hosted here",
                crate::echo::Echo(function.unwrap_or_default())
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_runs_by_outcome() {
        let metrics = Metrics::new();
        metrics.record_run("ok", Duration::from_millis(5));
        metrics.record_run("ok", Duration::from_millis(7));
        metrics.record_run("not_found", Duration::from_millis(1));
        metrics.in_flight().inc();
        metrics.set_limits_enforced(true);
        metrics.record_usage(&crate::runner::RunUsage {
            cpu_usec: 250_000,
            memory_peak_bytes: Some(3 << 20),
            ..Default::default()
        });
        let text = metrics.render();
        assert!(text.contains("xfn_runs_total{outcome=\"ok\"} 2"), "{text}");
        assert!(
            text.contains("xfn_runs_total{outcome=\"not_found\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("xfn_run_duration_seconds_count{outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("xfn_runs_in_flight 1"), "{text}");
        assert!(text.contains("xfn_limits_enforced 1"), "{text}");
        assert!(text.contains("xfn_run_cpu_seconds_total 0.25"), "{text}");
        assert!(text.contains("xfn_run_memory_peak_bytes_count 1"), "{text}");
    }

    #[test]
    fn exports_the_store_counters() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::image::ImageStore::open(dir.path(), Default::default()).unwrap();
        store
            .stats()
            .blobs_downloaded
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        let text = Metrics::new().with_store(store).render();
        assert!(
            text.contains("xfn_image_blobs_downloaded_total 3"),
            "{text}"
        );
        assert!(
            text.contains("xfn_image_manifests_resolved_total 0"),
            "{text}"
        );
    }

    #[test]
    fn exports_the_warm_pool_figures_when_there_is_a_pool() {
        let stats = crate::runner::PoolStats {
            size: 4,
            ready: 2,
            total: 3,
            warm_calls: 7,
            cold_calls: 1,
            created: 9,
            create_failures: 0,
            discarded: 5,
        };
        let text = Metrics::new().with_pool(move || Some(stats)).render();
        for line in [
            "xfn_warm_pool_size 4",
            "xfn_warm_containers_ready 2",
            "xfn_warm_containers 3",
            "xfn_warm_pool_calls_total{path=\"warm\"} 7",
            "xfn_warm_pool_calls_total{path=\"cold\"} 1",
            "xfn_warm_containers_created_total 9",
            "xfn_warm_container_create_failures_total 0",
            "xfn_warm_containers_discarded_total 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        let without = Metrics::new().with_pool(|| None).render();
        assert!(!without.contains("warm"), "{without}");
    }

    async fn get(address: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).await.unwrap();
        body
    }

    async fn server(max_connections: usize) -> (MetricsServer, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let limits = ConnectionLimits {
            max_connections,
            ..ConnectionLimits::default()
        };
        let address = "127.0.0.1:0".parse().unwrap();
        let server = MetricsServer::start(Some(address), Arc::clone(&metrics), limits)
            .await
            .unwrap()
            .unwrap();
        (server, metrics)
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let (server, metrics) = server(8).await;
        metrics.record_run("ok", Duration::from_millis(5));
        let body = get(server.address(), "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("xfn_runs_total{outcome=\"ok\"} 1"), "{body}");
        server.stop().await.unwrap();
    }

    #[tokio::test]
    async fn idle_connections_past_the_cap_make_room_for_a_probe() {
        let (server, metrics) = server(2).await;
        let address = server.address();
        // Connections that send nothing, more than the cap.
        let mut idle = Vec::new();
        for _ in 0..6 {
            idle.push(tokio::net::TcpStream::connect(address).await.unwrap());
        }
        let health = tokio::time::timeout(Duration::from_secs(30), get(address, "/healthz"))
            .await
            .expect("/healthz never answered past the cap");
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        let text = metrics.render();
        assert!(
            text.contains("xfn_metrics_connections_closed_total{reason=\"evicted\"}"),
            "{text}"
        );
        assert!(!text.contains("xfn_connections_closed_total{"), "{text}");
        drop(idle);
        server.stop().await.unwrap();
    }
}
