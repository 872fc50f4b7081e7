//! Admission control: at most N runs at once; callers beyond it wait in a
//! bounded queue; past the queue they are turned away at once, so a burst
//! cannot pile up unbounded work (and memory for inputs) in the daemon.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a call was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmissionError {
    /// Every run slot is busy and the queue is full.
    #[error("{running} runs in flight and {queued} queued (the limits); try again later")]
    QueueFull {
        /// Runs allowed at once.
        running: usize,
        /// Calls allowed to wait.
        queued: usize,
    },
}

/// Run slots and the queue in front of them.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    max_running: usize,
    max_queued: usize,
    waiting: AtomicUsize,
    /// Mirrors `waiting` for the metrics endpoint.
    waiting_gauge: Gauge,
}

/// A held run slot; the slot frees when it drops.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// Decrements the waiting count however the wait ends (admitted, or the
/// caller's future dropped on cancel).
struct Waiting<'a>(&'a AtomicUsize, &'a Gauge);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        self.1.dec();
    }
}

impl Admission {
    /// `max_running` runs at once (at least 1) and `max_queued` waiting;
    /// `waiting_gauge` follows the number of waiting calls.
    pub fn new(max_running: usize, max_queued: usize, waiting_gauge: Gauge) -> Self {
        let max_running = max_running.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max_running)),
            max_running,
            max_queued,
            waiting: AtomicUsize::new(0),
            waiting_gauge,
        }
    }

    /// Calls waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Takes a slot, waiting in the queue when none is free; refuses when the
    /// queue is full. Cancel-safe: dropping the future leaves the queue.
    pub async fn admit(&self) -> Result<Slot, AdmissionError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot { _permit: permit });
        }
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        self.waiting_gauge.inc();
        let waiting = Waiting(&self.waiting, &self.waiting_gauge);
        if before >= self.max_queued {
            drop(waiting);
            return Err(AdmissionError::QueueFull {
                running: self.max_running,
                queued: self.max_queued,
            });
        }
        // The semaphore is never closed, so acquiring only fails if it were.
        let permit = self.slots.clone().acquire_owned().await;
        drop(waiting);
        match permit {
            Ok(permit) => Ok(Slot { _permit: permit }),
            Err(_) => Err(AdmissionError::QueueFull {
                running: self.max_running,
                queued: self.max_queued,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn queues_then_refuses() {
        let gauge = Gauge::default();
        let admission = Arc::new(Admission::new(1, 1, gauge.clone()));
        let first = admission.admit().await.unwrap();
        let queued = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit().await.map(|_| ()) })
        };
        while admission.queued() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(matches!(
            admission.admit().await,
            Err(AdmissionError::QueueFull {
                running: 1,
                queued: 1
            })
        ));
        assert_eq!(admission.queued(), 1);
        assert_eq!(gauge.get(), 1);
        drop(first);
        queued.await.unwrap().unwrap();
        assert_eq!(admission.queued(), 0);
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let admission = Admission::new(1, 1, Gauge::default());
        let _first = admission.admit().await.unwrap();
        let waiter = admission.admit();
        let timed_out = tokio::time::timeout(Duration::from_millis(10), waiter).await;
        assert!(timed_out.is_err());
        assert_eq!(admission.queued(), 0);
        // The queue has room again.
        let again = tokio::time::timeout(Duration::from_millis(10), admission.admit()).await;
        assert!(again.is_err(), "still waiting, not refused");
    }

    #[tokio::test]
    async fn zero_queue_refuses_when_busy() {
        let admission = Admission::new(1, 0, Gauge::default());
        let _first = admission.admit().await.unwrap();
        assert!(admission.admit().await.is_err());
    }
}
