//! The one line `xfn test` redraws on a terminal while it runs: suites and
//! tests done of how many, failures so far (indicatif, on stderr). Only
//! when stderr is a terminal and `-v` is off: a CI log (not a terminal) or
//! a verbose run gets exactly the bytes it got without it. The line is
//! cleared before each suite's report is printed and at the end, so the
//! report reads as if it never was there.
use std::sync::atomic::{AtomicUsize, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The progress line, or nothing.
pub(crate) struct Line {
    bar: Option<ProgressBar>,
    suites: usize,
    tests: usize,
    suites_done: AtomicUsize,
    tests_done: AtomicUsize,
    failed: AtomicUsize,
}

impl Line {
    /// A line for `suites` suites of `tests` tests in all, drawn on stderr
    /// when `shown` (see [`Line::wanted`]).
    pub(crate) fn new(shown: bool, suites: usize, tests: usize) -> Self {
        let bar = shown.then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(tests as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("xfn test: {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        let line = Self {
            bar,
            suites,
            tests,
            suites_done: AtomicUsize::new(0),
            tests_done: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
        };
        line.draw();
        line
    }

    /// Whether a line is drawn: stderr is a terminal and not `-v`.
    pub(crate) fn wanted(verbose: bool) -> bool {
        !verbose && std::io::IsTerminal::is_terminal(&std::io::stderr())
    }

    /// A test ended.
    pub(crate) fn test_done(&self, passed: bool) {
        self.tests_done.fetch_add(1, Ordering::Relaxed);
        if !passed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.draw();
    }

    /// A suite ended; `print` writes its report with the line out of the way.
    pub(crate) fn suite_done<R>(&self, print: impl FnOnce() -> R) -> R {
        self.suites_done.fetch_add(1, Ordering::Relaxed);
        let printed = match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        };
        self.draw();
        printed
    }

    /// Clears the line for good.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// What the line says now.
    fn text(&self) -> String {
        let failed = self.failed.load(Ordering::Relaxed);
        let mut text = format!(
            "suites {}/{}, tests {}/{}",
            self.suites_done.load(Ordering::Relaxed),
            self.suites,
            self.tests_done.load(Ordering::Relaxed),
            self.tests
        );
        if failed > 0 {
            text += &format!(", {failed} failed");
        }
        text
    }

    fn draw(&self) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.tests_done.load(Ordering::Relaxed) as u64);
            bar.set_message(self.text());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_suites_and_tests_and_names_failures_once_there_are_some() {
        let line = Line::new(false, 2, 3);
        assert_eq!(line.text(), "suites 0/2, tests 0/3");
        line.test_done(true);
        line.test_done(false);
        assert_eq!(line.text(), "suites 0/2, tests 2/3, 1 failed");
        assert_eq!(line.suite_done(|| 7), 7);
        assert_eq!(line.text(), "suites 1/2, tests 2/3, 1 failed");
        line.finish();
    }
}
