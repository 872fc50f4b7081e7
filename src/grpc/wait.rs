//! How long a queued call will wait at least, from how long recent runs
//! held their slot. The rule and why it errs towards serving are in the
//! module header of [`crate::grpc`].
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// Runs remembered: enough for a stable median, few enough to follow a
/// change of workload within a minute of Crossplane's traffic.
pub(crate) const WINDOW: usize = 64;

/// Runs seen before any estimate is made: a fresh daemon (cold pulls,
/// first runs) predicts nothing and refuses nothing.
pub(crate) const MIN_RUNS: usize = 8;

/// The times the last [`WINDOW`] runs held their slot.
#[derive(Debug, Default)]
pub(crate) struct RunTimes {
    recent: Mutex<VecDeque<Duration>>,
}

impl RunTimes {
    /// Remembers one run's slot time.
    pub(crate) fn record(&self, held: Duration) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == WINDOW {
            recent.pop_front();
        }
        recent.push_back(held);
    }

    /// The median of the remembered runs, once [`MIN_RUNS`] were seen: a few
    /// slow runs (a cold pull, a timeout) do not move it, and a run cut
    /// short only lowers it.
    pub(crate) fn typical(&self) -> Option<Duration> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() < MIN_RUNS {
            return None;
        }
        let mut sorted: Vec<Duration> = recent.iter().copied().collect();
        sorted.sort_unstable();
        // The lower median of an even count: the smaller guess.
        Some(sorted[(sorted.len() - 1) / 2])
    }
}

/// The least a call waits for a slot behind `ahead` queued calls with
/// `slots` run slots, each run taking `typical`: some slot must finish
/// `floor(ahead / slots)` whole runs before it (the runs in flight may be
/// about to end, so they count for nothing).
pub(crate) fn least_wait(ahead: usize, slots: usize, typical: Duration) -> Duration {
    let whole_runs = ahead / slots.max(1);
    typical.saturating_mul(u32::try_from(whole_runs).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn times(ms: &[u64]) -> RunTimes {
        let times = RunTimes::default();
        for &m in ms {
            times.record(MS * m as u32);
        }
        times
    }

    #[test]
    fn predicts_nothing_before_enough_runs_were_seen() {
        assert_eq!(times(&[]).typical(), None);
        assert_eq!(times(&[100; MIN_RUNS - 1]).typical(), None);
        assert_eq!(times(&[100; MIN_RUNS]).typical(), Some(MS * 100));
    }

    #[test]
    fn a_few_slow_runs_do_not_move_the_typical_run() {
        // Two cold pulls of 20 s among warm runs of 100 ms.
        let runs = [20_000, 100, 100, 20_000, 100, 100, 100, 100, 100, 100];
        assert_eq!(times(&runs).typical(), Some(MS * 100));
    }

    #[test]
    fn an_even_count_takes_the_smaller_middle() {
        let runs = [10, 20, 30, 40, 50, 60, 70, 80];
        assert_eq!(times(&runs).typical(), Some(MS * 40));
    }

    #[test]
    fn only_the_last_window_of_runs_counts() {
        let times = times(&[5_000; WINDOW]);
        for _ in 0..WINDOW / 2 + 1 {
            times.record(MS * 10);
        }
        assert_eq!(times.typical(), Some(MS * 10));
    }

    #[test]
    fn the_least_wait_counts_whole_runs_per_slot_and_ignores_those_in_flight() {
        let run = MS * 100;
        // Fewer waiting than slots: a slot may free any moment.
        assert_eq!(least_wait(0, 1, run), Duration::ZERO);
        assert_eq!(least_wait(3, 4, run), Duration::ZERO);
        // One slot, three ahead: three whole runs before this call's.
        assert_eq!(least_wait(3, 1, run), MS * 300);
        // Two slots share the queue: 5 ahead is 2 whole runs on some slot.
        assert_eq!(least_wait(5, 2, run), MS * 200);
        assert_eq!(least_wait(1024, 2, run), MS * 51_200);
    }

    #[test]
    fn zero_slots_and_huge_queues_do_not_panic() {
        assert_eq!(least_wait(3, 0, MS), MS * 3);
        assert_eq!(
            least_wait(usize::MAX, 1, Duration::from_secs(u64::MAX / 2)),
            Duration::MAX
        );
    }
}
