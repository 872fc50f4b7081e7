//! What `xfn test` prints, as `go test` does: per suite `ok  PATH  0.75s`
//! or `FAIL  PATH  0.75s`; `-v` adds `=== RUN` and `--- PASS` / `--- FAIL`
//! for every test with its checks; without `-v` only failing tests are
//! shown, with the checks that did not pass (a golden file's diff
//! included). `--junit FILE` writes one `<testsuite>` per suite file.
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
    pub(crate) fn passed(&self) -> bool {
        self.tests
            .as_ref()
            .is_ok_and(|t| t.iter().all(TestOutcome::passed))
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

/// The text for one suite.
pub(crate) fn text(suite: &SuiteOutcome, verbose: bool) -> String {
    let mut out = String::new();
    let path = suite.path.display();
    let tests = match &suite.tests {
        Ok(tests) => tests,
        Err(e) => {
            let _ = writeln!(
                out,
                "FAIL\t{path} [setup failed]\n{}",
                indent(e, "    ").trim_end()
            );
            return out;
        }
    };
    for test in tests {
        let passed = test.passed();
        if verbose {
            let _ = writeln!(out, "=== RUN   {}", test.name);
        }
        if verbose || !passed {
            let word = if passed { "PASS" } else { "FAIL" };
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
                    check.status.symbol(),
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
        let _ = writeln!(out, "FAIL\t{path}\t{}", seconds(suite.duration));
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
                    let status = if test.passed() {
                        TestCaseStatus::success()
                    } else {
                        let failing: Vec<_> = test
                            .checks
                            .iter()
                            .filter(|c| c.status != Status::Pass)
                            .collect();
                        let kind = if failing.iter().any(|c| c.status == Status::Fail) {
                            NonSuccessKind::Failure
                        } else {
                            NonSuccessKind::Error
                        };
                        let mut status = TestCaseStatus::non_success(kind);
                        if let Some(first) = failing.first() {
                            status.set_message(format!(
                                "{}: {}",
                                first.name,
                                first.message.lines().next().unwrap_or("")
                            ));
                        }
                        let mut description = String::new();
                        for c in &failing {
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
                    };
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
