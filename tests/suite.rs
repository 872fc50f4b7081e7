//! Test binary `suite`: `xfn test` end to end. The suites of tests/suite/
//! (xprin's format) run through the real binary, over a Development
//! function (tests/fixtures/fn_server.rs, started here) and over Exec
//! functions (busybox images pushed to a registry started here, run by
//! crun); each failing case is checked for the message a user needs.
//!
//! Needs: crun, docker-registry, busybox-static (the Exec test); python3
//! with junitparser (scripts/setup.sh) for the JUnit test; xprin and the
//! `crossplane` CLI (scripts/peers.sh) for the side-by-side test.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use xfn_testkit::render::{exec_function, Fixture};
use xfn_testkit::*;

#[path = "suite_hostile.rs"]
mod suite_hostile;
#[path = "suite_xprin.rs"]
mod suite_xprin;

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
        // Hooks write there: as root, they run as xfn's mapped uid.
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o777)).unwrap();
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
        self.command(&self.path("xprin-config.yaml"))
            .args(args)
            .output()
            .expect("spawn xfn")
    }

    /// `xfn test` in the suites' directory with the configuration `config`.
    fn command(&self, config: &Path) -> std::process::Command {
        let mut command = xfn_command();
        command
            .arg("test")
            .arg("--cache-dir")
            .arg(self.path("cache"))
            .arg("--config")
            .arg(config)
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        command
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
            "[x] replicas-equal-5: field spec.replicas is 3 (number), expected == 5 (number) on resource Deployment/my-app",
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

    // Written, not passed: nothing was compared; a skip in JUnit, no failure.
    let out = suites.test(&[
        "-v",
        "--update",
        "--junit",
        "update.xml",
        "golden_xprin.yaml",
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(&all, &["--- SKIP: ", "[w] full render: written "]);
    assert!(
        !all.contains("--- PASS") && !all.contains("[✓] full render"),
        "{all}"
    );
    let xml = std::fs::read_to_string(suites.path("update.xml")).unwrap();
    assert!(
        xml.contains("disabled=\"1\"")
            && xml.contains("failures=\"0\"")
            && xml.contains("<skipped"),
        "{xml}"
    );
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
            "[x] index: field data.index is \"1\" (string), expected is \"0\" (string) on resource ConfigMap/",
        ],
    );
    assert!(all.contains("--- PASS: 1 buckets ("), "{all}");
}

/// A suite of one test over an Exec Function (tests/render/exec/create.sh)
/// in a directory of root's, mode 0755: what a CI job as root in a
/// container (GitLab's docker executor) gives xfn. Its golden files are
/// `golden/render.yaml` (diff: the directory is not there yet) and
/// `deployment.yaml` (dyff of one object; given by the caller or not).
struct RootOwnedSuite {
    fx: Fixture,
}

impl RootOwnedSuite {
    fn new() -> RootOwnedSuite {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test runs xfn as root, whose namespace maps a range: run it as root"
        );
        let fx = Fixture::new();
        let image = fx.exec_image("create.sh");
        let meta = std::fs::metadata(fx.dir.path()).unwrap();
        assert_eq!(
            (
                std::os::unix::fs::MetadataExt::uid(&meta),
                meta.permissions().mode() & 0o777
            ),
            (0, 0o755),
            "the suite's directory must be root's, 0755"
        );
        fx.write("functions.yaml", &exec_function("create", &image));
        fx.write(
            "composition.yaml",
            &xfn_testkit::render::pipeline_composition(
                "  - step: create\n    functionRef: {name: create}\n",
            ),
        );
        fx.write("xr.yaml", xfn_testkit::render::XR);
        fx.write(
            "root_xprin.yaml",
            "common:\n  inputs: {xr: xr.yaml, composition: composition.yaml, functions: functions.yaml}\n\
             tests:\n- name: two buckets\n  assertions:\n    xprin:\n\
             \x20   - {name: buckets, type: Count, resource: ConfigMap, value: 2}\n    diff:\n\
             \x20   - {name: full render, expected: golden/render.yaml}\n    dyff:\n\
             \x20   - {name: the XR, expected: xr-golden.yaml, resource: XBucket/demo}\n",
        );
        RootOwnedSuite { fx }
    }

    fn test(&self, args: &[&str]) -> Output {
        xfn_command()
            .args(["test", "--cache-dir"])
            .arg(self.fx.path("cache"))
            .args(args)
            .arg("root_xprin.yaml")
            .current_dir(self.fx.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("spawn xfn")
    }
}

#[test]
fn as_root_the_junit_report_is_written_into_a_root_owned_directory() {
    let suite = RootOwnedSuite::new();
    let report = suite.fx.path("report.xml");
    // A longer report there already: the new one replaces it whole.
    std::fs::write(&report, format!("<old>{}</old>", "x".repeat(64 << 10))).unwrap();
    let out = suite.test(&["--run", "two buckets", "--junit", "report.xml"]);
    let all = text(&out);
    // The golden files are missing: the test fails, the report says so.
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(!all.contains("cannot write"), "{all}");
    let xml = std::fs::read_to_string(&report).unwrap();
    assert!(
        xml.starts_with("<?xml")
            && xml.contains("<testcase name=\"two buckets\"")
            && xml.contains("cannot read golden file")
            && !xml.contains("<old>"),
        "{xml}"
    );
}

#[test]
fn as_root_update_writes_golden_files_into_a_root_owned_directory_and_they_then_pass() {
    let suite = RootOwnedSuite::new();
    // An XR golden file there already, longer than the new one: rewritten
    // whole (a stale tail would fail the next run).
    let stale = format!("# stale\n{}", "#\n".repeat(4096));
    suite.fx.write("xr-golden.yaml", &stale);
    let out = suite.test(&["-v", "--update"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(&all, &["[w] full render: written ", "[w] the XR: written "]);
    let render = std::fs::read_to_string(suite.fx.path("golden/render.yaml")).unwrap();
    assert!(render.contains("kind: ConfigMap"), "{render}");
    let xr = std::fs::read_to_string(suite.fx.path("xr-golden.yaml")).unwrap();
    assert!(xr.contains("kind: XBucket") && !xr.contains('#'), "{xr}");
    // Written as root, as without a namespace: the files are root's.
    for file in ["golden", "golden/render.yaml", "xr-golden.yaml"] {
        let meta = std::fs::metadata(suite.fx.path(file)).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0, "{file}");
    }
    let out = suite.test(&["-v"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(&all, &["[✓] full render: matches ", "[✓] the XR: matches "]);
}

/// Where scripts/setup.sh leaves a Debian trixie root with python3 and
/// function-pythonic 0.6.3 (as tests/render_pythonic.rs finds it).
#[test]
fn a_suite_runs_through_function_pythonic_as_an_image_pulled_from_a_registry() {
    let Some(root) = xfn_testkit::python::root(false) else {
        eprintln!(
            "\n*** SKIPPED: no function-pythonic 0.6.3 root at \
             /var/cache/xfn-test/function-pythonic-0.6.3 (XFN_TEST_PYTHONIC_ROOT): \
             run scripts/setup.sh as root ***\n"
        );
        return;
    };
    // The trixie root as one uncompressed layer (about 250 MB: gzip of it
    // would cost more than the test), its server run as the Docker runtime
    // runs any SDK's: the entrypoint with `--insecure --address=…`.
    let registry = Registry::start();
    let image = ImageBuilder::new()
        .layer(Layer::new().compression(Compression::None).tree(
            &root,
            "/",
            xfn_testkit::python::LEAVE_OUT,
        ))
        .entrypoint(["python3", "-m", "crossplane.pythonic", "grpc"])
        .env([
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH=/opt/function-pythonic",
        ])
        .push(&registry, "function-pythonic:v0.6.3")
        .reference;
    let suites = Suites::new(&xfn_testkit::render::function_object(
        "function-pythonic",
        &image,
        &["render.crossplane.io/runtime: Docker"],
    ));
    std::fs::copy(
        suites.path("functions.yaml"),
        suites.path("pythonic/functions.yaml"),
    )
    .unwrap();
    // XFN_UPDATE_GOLDEN=1 (as tests/golden/'s) rewrites the suite's golden
    // files from this render, then checks them as any run does.
    // xfn opens them before it enters its user namespace: the copy's
    // directory (root's, 0755) needs no mode of its own.
    if std::env::var_os("XFN_UPDATE_GOLDEN").is_some() {
        let out = suites.test(&["--update", "pythonic/pythonic_xprin.yaml"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        for name in ["render.yaml", "xr-three.yaml"] {
            let golden = Path::new(SUITES).join("pythonic/golden");
            std::fs::create_dir_all(&golden).unwrap();
            std::fs::copy(suites.path("pythonic/golden").join(name), golden.join(name)).unwrap();
        }
    }
    let out = suites.test(&["-v", "pythonic/pythonic_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(
        &all,
        &[
            "--- PASS: two buckets from a pythonic composite (",
            "[✓] buckets: found 2 resources (as expected)",
            "[✓] status: field status.buckets == 2 on resource XBucket/demo",
            "[✓] full render: matches ",
            "--- PASS: three buckets from a pythonic composite (",
            "[✓] the XR: matches ",
            "ok  \tpythonic/pythonic_xprin.yaml\t",
        ],
    );
    // The golden file is compared: a changed value fails, named.
    let golden = suites.path("pythonic/golden/xr-three.yaml");
    let xr = std::fs::read_to_string(&golden).unwrap();
    std::fs::write(&golden, xr.replace("buckets: 3", "buckets: 4")).unwrap();
    let out = suites.test(&["pythonic/pythonic_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "--- FAIL: three buckets from a pythonic composite (",
            "XBucket/three: status.buckets: expected 4, got 3",
        ],
    );
}

#[test]
fn an_alpha_composition_renders_as_xfn_render_renders_it_with_no_functions_input() {
    let fx = Fixture::new();
    let image = fx.alpha_image("create.sh");
    let dir = world_traversable_tempdir();
    let d = dir.path();
    std::fs::write(
        d.join("composition.yaml"),
        format!(
            "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: buckets-alpha
spec:
  compositeTypeRef:
    apiVersion: example.org/v1
    kind: XBucket
  functions:
  - name: create-buckets
    type: Container
    container:
      image: {image}
      timeout: 30s
"
        ),
    )
    .unwrap();
    std::fs::write(d.join("xr.yaml"), xfn_testkit::render::XR).unwrap();
    std::fs::write(
        d.join("alpha_xprin.yaml"),
        "common:\n  inputs: {xr: xr.yaml, composition: composition.yaml}\ntests:\n\
         - name: two buckets from an alpha step\n  assertions:\n    xprin:\n\
         \x20   - {name: buckets, type: Count, resource: ConfigMap, value: 2}\n\
         \x20   - {name: index, type: FieldValue, resource: ConfigMap/*, field: metadata.labels.created-by, operator: ==, value: xfn}\n",
    )
    .unwrap();
    let out = xfn_command()
        .args(["test", "-v", "--cache-dir"])
        .arg(fx.path("cache"))
        .arg("alpha_xprin.yaml")
        .current_dir(d)
        .stdin(Stdio::null())
        .output()
        .expect("spawn xfn");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(
        &all,
        &[
            "--- PASS: two buckets from an alpha step (",
            "[✓] buckets: found 2 resources (as expected)",
            "ok  \talpha_xprin.yaml\t",
        ],
    );
}

/// `xfn test ARGS` in `suites`' directory on a terminal: script(1) gives
/// it a pty for stdin, stdout and stderr; returns what the terminal got.
fn on_a_terminal(suites: &Suites, args: &[&str]) -> String {
    let mut command = format!(
        "{} test --cache-dir {} --config {}",
        xfn_testkit::xfn_binary().display(),
        suites.path("cache").display(),
        suites.path("xprin-config.yaml").display()
    );
    for arg in args {
        command += &format!(" '{arg}'");
    }
    let out = std::process::Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env("TERM", "xterm")
        .current_dir(suites.dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("script(1) (bsdutils)");
    without_colour(&String::from_utf8_lossy(&out.stdout))
}

/// `text` without its colours (`ESC[…m`, `--color auto` on a terminal).
fn without_colour(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("\x1b[") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        match after.find(|c: char| !(c.is_ascii_digit() || c == ';')) {
            Some(end) if after[end..].starts_with('m') => rest = &after[end + 1..],
            _ => {
                out.push_str("\x1b[");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// What a terminal shows of one line's bytes: `\r` returns to its start,
/// `ESC[2K` erases it, other escape sequences draw nothing.
fn visible(line: &str) -> String {
    let (mut shown, mut at) = (Vec::new(), 0);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\r' => at = 0,
            '\x1b' => {
                let sequence: String = chars
                    .by_ref()
                    .take_while(|c| !c.is_ascii_alphabetic())
                    .collect();
                if sequence == "[2" {
                    shown.clear();
                }
            }
            c => {
                if at < shown.len() {
                    shown[at] = c;
                } else {
                    shown.push(c);
                }
                at += 1;
            }
        }
    }
    shown.into_iter().collect::<String>().trim_end().to_string()
}

#[test]
fn a_terminal_gets_a_progress_line_cleared_at_the_end_and_a_log_gets_none() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    // Not a terminal: not one byte of it (no line, no control codes; the
    // claim's INFO log line is all stderr has).
    let out = suites.test(&["assertions_xprin.yaml", "chain_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        !all.contains("xfn test:") && !all.contains('\r') && !all.contains('\x1b'),
        "{all:?}"
    );
    // A terminal: the line, counting, then cleared before the reports.
    let tty = on_a_terminal(&suites, &["assertions_xprin.yaml", "chain_xprin.yaml"]);
    assert_has(
        &tty,
        &[
            "xfn test: suites 0/2, tests 0/5",
            "\x1b[2K",
            "--- FAIL: every assertion type fails (",
            "ok  \tchain_xprin.yaml\t",
        ],
    );
    // What the terminal shows last: the last report line, then a line
    // cleared (whatever was drawn on it is erased by its last `ESC[2K`).
    let mut lines = tty.rsplit('\n');
    let (shown, report) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    assert!(
        visible(report).starts_with("ok  \tchain_xprin.yaml\t") && visible(shown).is_empty(),
        "the line is not cleared at the end: {tty:?}"
    );
    // -v on a terminal: every test is printed, no line.
    let verbose = on_a_terminal(&suites, &["-v", "chain_xprin.yaml"]);
    assert!(!verbose.contains("xfn test:"), "{verbose:?}");
    assert_has(&verbose, &["=== RUN", "ok  \tchain_xprin.yaml\t"]);
}
