//! Test binary `suite`: `xfn test` end to end. The suites of tests/suite/
//! (xprin's format) run through the real binary, over a Development
//! function (tests/fixtures/fn_server.rs, started here) and over Exec
//! functions (busybox images pushed to a registry started here, run by
//! crun); each failing case is checked for the message a user needs.
//!
//! Needs: crun, docker-registry, busybox-static (the Exec test); python3
//! with junitparser (scripts/setup.sh) for the JUnit test.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use xfn_testkit::render::{exec_function, Fixture};
use xfn_testkit::*;

const SUITES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/suite");

/// tests/suite/ copied to a directory of its own, its `functions.yaml`
/// naming `function` (a Function object), a config whose repositories are
/// `data` (the inputs) and `scratch` (for hooks to write to).
struct Suites {
    dir: tempfile::TempDir,
}

impl Suites {
    fn new(function: &str) -> Suites {
        let dir = world_traversable_tempdir();
        copy_tree(Path::new(SUITES), dir.path());
        std::fs::write(dir.path().join("functions.yaml"), function).unwrap();
        std::fs::create_dir(dir.path().join("scratch")).unwrap();
        let config = format!(
            "repositories:\n  data: {}\n  scratch: {}\n",
            dir.path().join("data").display(),
            dir.path().join("scratch").display()
        );
        std::fs::write(dir.path().join("xprin-config.yaml"), config).unwrap();
        Suites { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn test(&self, args: &[&str]) -> Output {
        xfn_command()
            .arg("test")
            .arg("--cache-dir")
            .arg(self.path("cache"))
            .arg("--config")
            .arg(self.path("xprin-config.yaml"))
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("spawn xfn")
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn development(server: &FunctionServer) -> String {
    xfn_testkit::render::development_function("fn", &server.address)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_has(out: &str, lines: &[&str]) {
    for line in lines {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn every_assertion_type_passes_and_each_failure_says_what_was_found() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let out = suites.test(&["-v", "assertions_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "=== RUN   every assertion type passes",
            "--- PASS: every assertion type passes (",
            "[✓] count-configmaps: found 2 resources (as expected)",
            "[✓] optional-is-null: field spec.optionalField has expected type null on resource Deployment/my-app",
            "[✓] engine-is-postgresql: field spec.engine is postgresql on resource Deployment/my-app",
            "--- FAIL: every assertion type fails (",
            "[x] count-all: expected 4 resources, got 5: ",
            "[x] deployment-exists: resource Deployment/other not found",
            "[x] no-configmaps: resources found (should not exist): ConfigMap/",
            "[x] replicas-is-string: field spec.replicas has type number, expected string on resource Deployment/my-app",
            "[x] has-deprecated: field spec.deprecated does not exist on resource Deployment/my-app",
            "[x] no-selector: field spec.selector exists (should not exist) on resource Service/my-app",
            "[x] replicas-equal-5: field spec.replicas is 3, expected == 5 on resource Deployment/my-app",
            "[!] unknown-type: unsupported assertion type \"Matches\"",
            "[!] no-such-resource: no rendered resource matched Pod/x",
            "FAIL\tassertions_xprin.yaml\t",
        ],
    );
    // Without -v: only the failing test, only what did not pass.
    let quiet = text(&suites.test(&["assertions_xprin.yaml"]));
    assert!(
        !quiet.contains("=== RUN")
            && !quiet.contains("[✓]")
            && !quiet.contains("every assertion type passes"),
        "{quiet}"
    );
    assert_has(
        &quiet,
        &["--- FAIL: every assertion type fails (", "[x] count-all"],
    );
    // --run picks the passing test alone: exit 0, Go's `ok` line.
    let only = suites.test(&["--run", "passes$", "assertions_xprin.yaml"]);
    assert_eq!(only.status.code(), Some(0), "{}", text(&only));
    assert!(
        text(&only).starts_with("ok  \tassertions_xprin.yaml\t"),
        "{}",
        text(&only)
    );
}

#[test]
fn update_writes_golden_files_that_then_pass_and_a_change_fails_with_a_diff() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let out = suites.test(&["golden_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_has(
        &text(&out),
        &[
            "[!] full render: cannot read golden file",
            "(--update writes it)",
        ],
    );

    let out = suites.test(&["--update", "golden_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let golden = std::fs::read_to_string(suites.path("golden/render.yaml")).unwrap();
    assert!(
        golden.contains("kind: Deployment") && golden.contains("name: my-app"),
        "{golden}"
    );
    let out = suites.test(&["golden_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Keys reordered: dyff still passes, diff does not.
    let reordered = golden.replacen(
        "  enabled: true\n  engine: postgresql\n",
        "  engine: postgresql\n  enabled: true\n",
        1,
    );
    assert_ne!(reordered, golden, "the golden file changed shape: {golden}");
    std::fs::write(suites.path("golden/render.yaml"), &reordered).unwrap();
    let all = text(&suites.test(&["-v", "golden_xprin.yaml"]));
    assert_has(
        &all,
        &[
            "[x] full render: differs from ",
            "+  enabled: true",
            "-  enabled: true",
            "[✓] full render structurally: matches ",
            "[✓] the deployment: matches ",
        ],
    );
    // A value changed: dyff names the document and the path.
    std::fs::write(
        suites.path("golden/render.yaml"),
        golden.replace("replicas: 3", "replicas: 4"),
    )
    .unwrap();
    let all = text(&suites.test(&["golden_xprin.yaml"]));
    assert_has(
        &all,
        &[
            "[x] full render structurally: 1 differences from",
            "Deployment/my-app: spec.replicas: expected 4, got 3",
        ],
    );
}

#[test]
fn chained_tests_hooks_patches_templates_and_a_claim_run_as_xprin_runs_them() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let out = suites.test(&["-v", "chain_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(
        &all,
        &[
            "[✓] pre-test hook inputs are copies: passed",
            "[✓] secret ref: field spec.writeConnectionSecretToRef.name is conn on resource XBucket/demo",
            "[✓] three buckets: found 3 resources (as expected)",
            "[✓] defaulted count: field spec.count == 1 on resource XBucket/claimed-",
            "ok  \tchain_xprin.yaml\t",
        ],
    );
    let count = std::fs::read_to_string(suites.path("scratch/first-count")).unwrap();
    assert_eq!(count.trim(), "5");
    let deployment = std::fs::read_to_string(suites.path("scratch/first-deployment.yaml")).unwrap();
    assert!(deployment.contains("kind: Deployment"), "{deployment}");
    // The suite's own inputs are untouched by the hooks.
    let xr = std::fs::read_to_string(suites.path("data/xr.yaml")).unwrap();
    assert!(xr.contains("count: 2"), "{xr}");
}

#[test]
fn each_test_that_cannot_pass_says_why_and_an_unreadable_suite_exits_2() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let out = suites.test(&["failures_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "--- FAIL: a failing pre-test hook stops the test (",
            "[x] pre-test hook broken setup: exit status: 7",
            "setting up",
            "--- FAIL: a missing input is named (",
            "data/nope.yaml: no such file or directory",
            "[!] setup: inputs.xr: {{ .Tests.nobody.Outputs.XR }}: no earlier test has id \"nobody\"",
            "--- FAIL: a rendered XR its XRD refuses fails validation naming the field (",
            "validate: XBucket/demo",
            "spec.count",
            "[x] post-test hook check: exit status: 1",
            "rendered 5",
        ],
    );
    assert!(!all.contains("never evaluated"), "{all}");

    let out = suites.test(&["unreadable/broken_xprin.yaml", "assertions_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert_has(
        &all,
        &[
            "FAIL\tunreadable/broken_xprin.yaml [setup failed]",
            "not a test suite",
        ],
    );
    let out = suites.test(&["no-such-dir"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn the_junit_report_is_read_back_by_junitparser() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let report = suites.path("report.xml");
    let out = suites.test(&[
        "--junit",
        report.to_str().unwrap(),
        "assertions_xprin.yaml",
        "chain_xprin.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let script = r#"
import sys
from junitparser import JUnitXml, Failure
xml = JUnitXml.fromfile(sys.argv[1])
for suite in xml:
    for case in suite:
        state = "pass" if case.is_passed else "fail"
        message = case.result[0].message if case.result else ""
        print(f"{suite.name}|{case.name}|{state}|{message}")
"#;
    let parsed = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&report)
        .output()
        .expect("run python3");
    let lines = String::from_utf8_lossy(&parsed.stdout).to_string();
    assert!(
        parsed.status.success(),
        "{lines}{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    assert_has(
        &lines,
        &[
            "assertions_xprin.yaml|every assertion type passes|pass|",
            "assertions_xprin.yaml|every assertion type fails|fail|count-all: expected 4 resources, got 5",
            "chain_xprin.yaml|second loop from the first XR|pass|",
        ],
    );
}

#[test]
fn exec_functions_render_every_test_of_a_run_in_one_process() {
    let fx = Fixture::new();
    let image = fx.exec_image("create.sh");
    let dir = world_traversable_tempdir();
    let d = dir.path();
    std::fs::write(d.join("functions.yaml"), exec_function("create", &image)).unwrap();
    std::fs::write(
        d.join("composition.yaml"),
        xfn_testkit::render::pipeline_composition(
            "  - step: create\n    functionRef: {name: create}\n",
        ),
    )
    .unwrap();
    let mut suite = String::from(
        "common:\n  inputs: {composition: composition.yaml, functions: functions.yaml}\ntests:\n",
    );
    for count in 1..=4 {
        std::fs::write(
            d.join(format!("xr-{count}.yaml")),
            xfn_testkit::render::XR.replace("count: 2", &format!("count: {count}")),
        )
        .unwrap();
        suite += &format!(
            "- name: {count} buckets\n  inputs: {{xr: xr-{count}.yaml}}\n  assertions:\n    xprin:\n    - {{name: buckets, type: Count, resource: ConfigMap, value: {count}}}\n    - {{name: index, type: FieldValue, resource: ConfigMap, field: data.index, operator: is, value: \"0\"}}\n"
        );
    }
    std::fs::write(d.join("exec_xprin.yaml"), suite).unwrap();
    let out = xfn_command()
        .args(["test", "-v", "--cache-dir"])
        .arg(fx.path("cache"))
        .arg(d)
        .current_dir(d)
        .stdin(Stdio::null())
        .output()
        .expect("spawn xfn");
    let all = text(&out);
    // Four tests: the first ConfigMap of each has index 0; the later ones
    // fail FieldValue on "1", "2", … — the message names each.
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "--- FAIL: 2 buckets (",
            "[✓] buckets: found 4 resources (as expected)",
            "[x] index: field data.index is 1, expected is 0 on resource ConfigMap/",
        ],
    );
    assert!(all.contains("--- PASS: 1 buckets ("), "{all}");
}
