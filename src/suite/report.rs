//! What `xfn test` prints, as `go test` does: per suite `ok  PATH  0.75s`
//! or `FAIL  PATH  0.75s`; `-v` adds `=== RUN` and `--- PASS` / `--- FAIL`
//! for every test with its checks; without `-v` only failing tests are
//! shown, with the checks that did not pass (a golden file's diff
//! included). `--junit FILE` writes one `<testsuite>` per suite file.
//!
//! A test whose golden files `--update` wrote, and that failed nothing
//! else, is written, not passed (nothing was compared): `--- SKIP` with
//! its `[w]` checks, a skipped `<testcase>` in JUnit; it fails no suite.
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::assert::Status;
use super::run::TestOutcome;

/// One suite's outcome.
#[derive(Debug)]
pub(crate) struct SuiteOutcome {
    pub(crate) path: PathBuf,
    pub(crate) duration: Duration,
    /// Its tests, or why it could not be read or run.
    pub(crate) tests: Result<Vec<TestOutcome>, String>,
}

impl SuiteOutcome {
    /// It ran and no test failed (a written one did not).
    pub(crate) fn passed(&self) -> bool {
        self.tests
            .as_ref()
            .is_ok_and(|t| !t.iter().any(TestOutcome::failed))
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

/// `text` in ANSI colour `code` when `color`.
fn paint(text: &str, code: u8, color: bool) -> String {
    if color {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// A check's mark, coloured when `color` (green, red, yellow, blue).
fn mark(status: Status, color: bool) -> String {
    let code = match status {
        Status::Pass => 32,
        Status::Fail => 31,
        Status::Error => 33,
        Status::Written => 34,
    };
    paint(status.symbol(), code, color)
}

/// The text for one suite, coloured when `color` (`--color`).
pub(crate) fn text(suite: &SuiteOutcome, verbose: bool, color: bool) -> String {
    let mut out = String::new();
    let path = suite.path.display();
    let tests = match &suite.tests {
        Ok(tests) => tests,
        Err(e) => {
            let _ = writeln!(
                out,
                "{}\t{path} [setup failed]\n{}",
                paint("FAIL", 31, color),
                indent(e, "    ").trim_end()
            );
            return out;
        }
    };
    for test in tests {
        let failed = test.failed();
        if verbose {
            let _ = writeln!(out, "=== RUN   {}", test.name);
        }
        if verbose || failed {
            let word = match (failed, test.passed()) {
                (true, _) => paint("FAIL", 31, color),
                (false, true) => paint("PASS", 32, color),
                (false, false) => paint("SKIP", 34, color),
            };
            let _ = writeln!(
                out,
                "--- {word}: {} ({})",
                test.name,
                seconds(test.duration)
            );
            for check in &test.checks {
                if !verbose && check.status == Status::Pass {
                    continue;
                }
                let line = format!(
                    "{} {}: {}",
                    mark(check.status, color),
                    check.name,
                    check.message
                );
                out.push_str(&indent(&line, "    "));
                if let Some(detail) = &check.detail {
                    out.push_str(&indent(detail, "        "));
                }
            }
            if let Some(dir) = &test.dir {
                let _ = writeln!(out, "    (kept: {})", dir.display());
            }
        }
    }
    if tests.is_empty() {
        let _ = writeln!(
            out,
            "ok  \t{path}\t{} [no tests to run]",
            seconds(suite.duration)
        );
    } else if suite.passed() {
        let _ = writeln!(out, "ok  \t{path}\t{}", seconds(suite.duration));
    } else {
        let fail = paint("FAIL", 31, color);
        let _ = writeln!(out, "{fail}\t{path}\t{}", seconds(suite.duration));
    }
    out
}

/// A JUnit report of `suites`.
pub(crate) fn junit(suites: &[SuiteOutcome]) -> Result<String, quick_junit::SerializeError> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("xfn test");
    for suite in suites {
        let path = suite.path.display().to_string();
        let mut junit_suite = TestSuite::new(path.clone());
        junit_suite.set_time(suite.duration);
        match &suite.tests {
            Err(e) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
                status.set_message(e.clone());
                let mut case = TestCase::new("(suite)", status);
                case.set_classname(path.clone());
                junit_suite.add_test_case(case);
            }
            Ok(tests) => {
                for test in tests {
                    let status = junit_status(test);
                    let mut case = TestCase::new(test.name.clone(), status);
                    case.set_classname(path.clone());
                    case.set_time(test.duration);
                    case.set_assertions(test.checks.len());
                    junit_suite.add_test_case(case);
                }
            }
        }
        report.add_test_suite(junit_suite);
    }
    report.to_string()
}

/// A test's JUnit status: success when every check passed; skipped when
/// `--update` wrote its golden files and nothing failed; else a failure
/// (a check failed) or an error (one could not run), with the checks that
/// did not pass.
fn junit_status(test: &TestOutcome) -> quick_junit::TestCaseStatus {
    use quick_junit::{NonSuccessKind, TestCaseStatus};
    if test.passed() {
        return TestCaseStatus::success();
    }
    let failed = test.failed();
    let listed: Vec<_> = test
        .checks
        .iter()
        .filter(|c| c.status != Status::Pass)
        .filter(|c| !failed || c.status != Status::Written)
        .collect();
    let mut status = if !failed {
        TestCaseStatus::skipped()
    } else if listed.iter().any(|c| c.status == Status::Fail) {
        TestCaseStatus::non_success(NonSuccessKind::Failure)
    } else {
        TestCaseStatus::non_success(NonSuccessKind::Error)
    };
    if let Some(first) = listed.first() {
        status.set_message(format!(
            "{}: {}",
            first.name,
            first.message.lines().next().unwrap_or("")
        ));
    }
    let mut description = String::new();
    for c in &listed {
        let _ = writeln!(
            description,
            "{} {}: {}",
            c.status.symbol(),
            c.name,
            c.message
        );
        if let Some(detail) = &c.detail {
            description.push_str(&indent(detail, "    "));
        }
    }
    status.set_description(description);
    status
}
