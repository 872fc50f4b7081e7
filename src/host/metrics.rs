//! Per-function metrics of `xfn host`, read at each scrape of the daemon's
//! `/metrics` (label `function`): calls by outcome, errors, call latency,
//! cold starts, servers stopped for another's, servers running,
//! starting and prepared (created ahead), calls queued for a server, the
//! bytes its answers hold of the response budget, and where its package is
//! ([`PackageState`], also what `/readyz` and `/status` answer from).
//! Bounded: one entry per function name the catalog ever held, each of
//! fixed size (a package error is kept cut to [`crate::echo::ECHO_BYTES`]).
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;

use super::catalog::FunctionKind;
use crate::function_server::ResponseShare;

/// A counter read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct Count(AtomicU64);

impl Count {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct Level(AtomicI64);

impl Level {
    pub(crate) fn set(&self, value: i64) {
        self.0.store(value, Ordering::Relaxed);
    }
    /// Moves it by `by` (a guard's two ends apart: `call::admit::Waiting`).
    pub(crate) fn add(&self, by: i64) {
        self.0.fetch_add(by, Ordering::Relaxed);
    }
    /// Raised until the guard drops.
    pub(crate) fn raise(&self) -> Raised<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Raised(self)
    }
    pub(crate) fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// See [`Level::raise`].
#[derive(Debug)]
pub(crate) struct Raised<'a>(&'a Level);

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Call latencies: buckets from 1 ms to ~65 s (a warm call of a server is
/// milliseconds; a cold start, a pull or a slow function seconds).
#[derive(Debug)]
pub(crate) struct Latency(Histogram);

impl Default for Latency {
    fn default() -> Self {
        Self(Histogram::new(exponential_buckets(0.001, 2.0, 17)))
    }
}

/// Where a hosted function's package is: pulled and its kind decided
/// (`Ready`), not yet (`Pulling`), or its last try failed (`Failing`,
/// tried again with a backoff).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PackageState {
    Pulling,
    Ready { digest: String, kind: FunctionKind },
    Failing { error: String },
}

impl PackageState {
    /// Its name in `/status` and the `state` label.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Pulling => "pulling",
            Self::Ready { .. } => "ready",
            Self::Failing { .. } => "failing",
        }
    }

    /// A failure, its message cut as an echo is.
    pub(crate) fn failing(error: &str) -> Self {
        Self::Failing {
            error: crate::echo::Echo(error).to_string(),
        }
    }
}

/// Every state's name, for the state gauge.
const PACKAGE_STATES: [&str; 3] = ["pulling", "ready", "failing"];

/// One function's numbers.
#[derive(Debug, Default)]
pub(crate) struct FunctionStats {
    pub(crate) calls: Count,
    pub(crate) errors: Count,
    pub(crate) cold_starts: Count,
    pub(crate) evicted: Count,
    pub(crate) running: Level,
    pub(crate) starting: Level,
    /// Its next server's container, created ahead (0 or 1).
    pub(crate) prepared: Level,
    pub(crate) queued: Level,
    /// Its servers' share of the response budget, while hosted.
    responses: Mutex<std::sync::Weak<ResponseShare>>,
    latency: Latency,
    /// `None` while it is not hosted.
    package: Mutex<Option<PackageState>>,
    /// How long its last server took to start, and when it started.
    last_cold_start: Mutex<Option<(Duration, SystemTime)>>,
}

impl FunctionStats {
    /// Records one call's wall time, from its arrival to its answer.
    pub(crate) fn observe_call(&self, took: Duration) {
        self.latency.0.observe(took.as_secs_f64());
    }

    /// Records a server started in `took`.
    pub(crate) fn cold_started(&self, took: Duration) {
        self.cold_starts.inc();
        *lock(&self.last_cold_start) = Some((took, SystemTime::now()));
    }

    /// The last server start: how long it took, and when.
    pub(crate) fn last_cold_start(&self) -> Option<(Duration, SystemTime)> {
        *lock(&self.last_cold_start)
    }

    /// Its answers' share of the response budget is `share` (re-hosted:
    /// its new servers').
    pub(crate) fn set_responses(&self, share: &Arc<ResponseShare>) {
        *lock(&self.responses) = Arc::downgrade(share);
    }

    /// The bytes its servers' answers hold in the response budget now.
    pub(crate) fn response_bytes_held(&self) -> usize {
        lock(&self.responses)
            .upgrade()
            .map_or(0, |share| share.held())
    }

    /// Its package's state now (`None`: not hosted).
    pub(crate) fn package(&self) -> Option<PackageState> {
        lock(&self.package).clone()
    }

    /// Sets its package's state; whether it changed.
    pub(crate) fn set_package(&self, state: Option<PackageState>) -> bool {
        let mut package = lock(&self.package);
        let changed = *package != state;
        *package = state;
        changed
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every hosted function's numbers, by name.
#[derive(Debug, Default, Clone)]
pub(crate) struct HostStats(pub(crate) Arc<RwLock<BTreeMap<String, Arc<FunctionStats>>>>);

impl HostStats {
    /// The numbers of `function` (kept across re-hosting).
    pub(crate) fn of(&self, function: &str) -> Arc<FunctionStats> {
        let mut all = self.0.write().unwrap_or_else(|p| p.into_inner());
        Arc::clone(all.entry(function.to_string()).or_default())
    }
}

type Label = [(&'static str, String); 1];

/// A metric read from a function's numbers: name, help, reader.
type Read<T> = (&'static str, &'static str, fn(&FunctionStats) -> T);

impl prometheus_client::collector::Collector for HostStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let all: Vec<(String, Arc<FunctionStats>)> = self
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let counters: [Read<u64>; 4] = [
            ("host_calls", "RunFunction calls per hosted function", |s| {
                s.calls.get()
            }),
            (
                "host_call_errors",
                "RunFunction calls answered with an error, per hosted function",
                |s| s.errors.get(),
            ),
            (
                "host_cold_starts",
                "Function servers started (a call found none with room, or one kept warm was missing), per hosted function",
                |s| s.cold_starts.get(),
            ),
            (
                "host_servers_evicted",
                "Idle function servers stopped to make room for another function's (--max-servers), per hosted function",
                |s| s.evicted.get(),
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (function, stats) in &all {
                let label: Label = [("function", function.clone())];
                ConstCounter::new(value(stats)).encode(family.encode_family(&label)?)?;
            }
        }
        let gauges: [Read<i64>; 5] = [
            (
                "host_servers_running",
                "Function servers running, per hosted function",
                |s| s.running.get(),
            ),
            (
                "host_servers_starting",
                "Function servers starting, per hosted function",
                |s| s.starting.get(),
            ),
            (
                "host_servers_prepared",
                "Function servers' containers created ahead of their start (0 or 1), per hosted function",
                |s| s.prepared.get(),
            ),
            (
                "host_calls_queued",
                "Calls waiting for a function server with room, per hosted function",
                |s| s.queued.get(),
            ),
            (
                "host_response_bytes_held",
                "Bytes of function servers' answers xfn holds now in --response-budget (their declared length, from when they are read until they are passed on), per hosted function",
                |s| i64::try_from(s.response_bytes_held()).unwrap_or(i64::MAX),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (function, stats) in &all {
                let label: Label = [("function", function.clone())];
                ConstGauge::new(value(stats)).encode(family.encode_family(&label)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "host_call_duration_seconds",
            "Wall time of RunFunction calls, from arrival to answer (a cold start and the wait for a server included), per hosted function",
            None,
            MetricType::Histogram,
        )?;
        for (function, stats) in &all {
            let label: Label = [("function", function.clone())];
            stats.latency.0.encode(family.encode_family(&label)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "host_package_state",
            "1 for the state a hosted function's package is in (pulling, ready, failing), else 0",
            None,
            MetricType::Gauge,
        )?;
        for (function, stats) in &all {
            let Some(package) = stats.package() else {
                continue;
            };
            for state in PACKAGE_STATES {
                let labels = [("function", function.clone()), ("state", state.to_owned())];
                let value = i64::from(package.name() == state);
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
