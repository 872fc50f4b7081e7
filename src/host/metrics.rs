//! Per-function metrics of `xfn host`, read at each scrape of the daemon's
//! `/metrics` (label `function`): calls by outcome, errors, cold starts,
//! servers stopped for another's, servers running and starting, calls
//! queued for a server.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A counter read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct Count(AtomicU64);

impl Count {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
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

/// One function's numbers.
#[derive(Debug, Default)]
pub(crate) struct FunctionStats {
    pub(crate) calls: Count,
    pub(crate) errors: Count,
    pub(crate) cold_starts: Count,
    pub(crate) evicted: Count,
    pub(crate) running: Level,
    pub(crate) starting: Level,
    pub(crate) queued: Level,
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
                "Function servers started (a call found none with room), per hosted function",
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
        let gauges: [Read<i64>; 3] = [
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
                "host_calls_queued",
                "Calls waiting for a function server with room, per hosted function",
                |s| s.queued.get(),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (function, stats) in &all {
                let label: Label = [("function", function.clone())];
                ConstGauge::new(value(stats)).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}
