//! The image cache's budget for a daemon (`--cache-max-size`): a task that
//! collects the cache at start, after each pull that downloaded layers, and
//! every few minutes, evicting the least recently used images.
//!
//! # Why with the runner, not in the store
//! The store alone cannot meet the budget while warm containers pin their
//! images: an idle warm container would hold an evicted image on disk for
//! `--warm-pool-idle`. Only the runner can drop those containers
//! ([`Runner::release_idle_images`]), so the loop lives here; the store
//! keeps the mechanics (`ImageStore::collect`, `ImageStore::pulled`).
use std::sync::Arc;
use std::time::Duration;

use super::Runner;

/// How often the daemon's collector looks when no pull woke it: a cached
/// image's last use only moves once a minute, and nothing grows without a
/// pull; this catches what other processes sharing the cache pulled.
const COLLECT_EVERY: Duration = Duration::from_secs(300);

/// How soon it looks again when images in use kept the cache over its
/// budget: a run holds its image for seconds, so the budget is met soon
/// after, not minutes later.
const COLLECT_AGAIN_OVER_BUDGET: Duration = Duration::from_secs(30);

/// Keeps the cache under `max_size`: at start, after each pull that
/// downloaded layers, and every [`COLLECT_EVERY`] (sooner while over it).
/// Where images in use keep it over, the idle warm containers of those
/// images go and it collects again at once: only runs and pulls in flight
/// hold it over its budget.
pub(crate) fn keep_cache_within(runner: Arc<Runner>, max_size: u64) {
    let store = runner.store().clone();
    tokio::spawn(async move {
        let mut was_over = false;
        loop {
            let mut report = store.collect(Some(max_size)).await;
            if let Ok(over) = &report {
                if !over.over_budget_in_use.is_empty()
                    && runner.release_idle_images(&over.over_budget_in_use).await > 0
                {
                    let first = over.clone();
                    report = store.collect(Some(max_size)).await.map(|mut again| {
                        again.evicted.splice(0..0, first.evicted);
                        again.bytes_before = first.bytes_before;
                        again
                    });
                }
            }
            let over = match report {
                Ok(report) => {
                    if report.freed() > 0 || !report.evicted.is_empty() {
                        tracing::info!(
                            evicted = ?report.evicted,
                            freed_bytes = report.freed(),
                            cache_bytes = report.bytes_after,
                            max_bytes = max_size,
                            "image cache collected"
                        );
                    }
                    let over = report.bytes_after > max_size;
                    if over && !was_over {
                        tracing::warn!(
                            cache_bytes = report.bytes_after,
                            max_bytes = max_size,
                            in_use = report.kept_in_use,
                            "the image cache is over --cache-max-size with the images in use; \
                             it is collected again when they are done"
                        );
                    }
                    over
                }
                Err(err) => {
                    tracing::warn!(error = %crate::chain::Chain(&err), "collecting the image cache failed");
                    false
                }
            };
            was_over = over;
            let wait = if over {
                COLLECT_AGAIN_OVER_BUDGET
            } else {
                COLLECT_EVERY
            };
            tokio::select! {
                () = store.pulled() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    });
}
