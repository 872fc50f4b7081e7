//! Percentiles of measured times, one way for every bench and soak: the
//! nearest-rank value of a sorted sample, so that two programs reporting
//! "p99" report the same thing.
use std::time::Duration;

/// The `p` (0.0–1.0) percentile of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
