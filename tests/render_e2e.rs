//! `xfn render` end to end: the real binary, real crun, a real registry on
//! 127.0.0.1 with function images built here (busybox shell scripts), and a
//! real gRPC function server written with Crossplane's published Python SDK.
//!
//! Output is compared with golden files in tests/golden/; run with
//! `XFN_UPDATE_GOLDEN=1` to rewrite them (then review the diff).
//!
//! Needs: crun, docker-registry, busybox-static; python3 with
//! `pip install crossplane-function-sdk-python` (or XFN_TEST_PYTHON naming
//! a python that has it); root, or unprivileged user namespaces.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xfn_testkit::function_server::calls_by_version;
use xfn_testkit::render::*;
use xfn_testkit::*;

/// The 5-step Exec pipeline: create, require (settings), label, ready
/// (+context), results.
fn v1_exec_pipeline(fx: &Fixture) {
    let mut functions = String::new();
    for name in ["create", "require", "label", "ready", "results"] {
        functions += &exec_function(name, &fx.exec_image(&format!("{name}.sh")));
    }
    write_pipeline(
        fx,
        &functions,
        "  - step: create-buckets
    functionRef: {name: create}
  - step: read-settings
    functionRef: {name: require}
  - step: label-buckets
    functionRef: {name: label}
  - step: mark-ready
    functionRef: {name: ready}
  - step: report
    functionRef: {name: results}
    input: {apiVersion: test.xfn.dev/v1, kind: Input}
",
    );
    fx.write("required.yaml", REQUIRED);
}

/// The XR, `functions` and a pipeline Composition of `steps`, written.
fn write_pipeline(fx: &Fixture, functions: &str, steps: &str) {
    fx.write("functions.yaml", functions);
    fx.write("xr.yaml", XR);
    fx.write("composition.yaml", &pipeline_composition(steps));
}

const V1_EXEC_ARGS: &[&str] = &[
    "xr.yaml",
    "composition.yaml",
    "functions.yaml",
    "-e",
    "required.yaml",
    "-r",
    "-c",
    "--context-values",
    "start={\"from\":\"cli\"}",
];

#[test]
fn v1_pipeline_of_exec_functions_renders_the_golden_output() {
    let fx = Fixture::new();
    v1_exec_pipeline(&fx);
    let out = fx.render(V1_EXEC_ARGS);
    assert_golden("v1-exec.yaml", &stdout(&out));
}

#[test]
fn every_exec_step_runs_in_a_container_made_before_the_first_step() {
    let fx = Fixture::new();
    v1_exec_pipeline(&fx);
    let mut args = V1_EXEC_ARGS.to_vec();
    args.push("--debug");
    let out = fx.render(&args);
    assert_golden("v1-exec.yaml", &stdout(&out));
    // Each Function's container was made (and started) while the render
    // prepared its Functions, so each step found its own ready: five warm
    // calls at least (a step asked again with what it required may find
    // the refill of its container, or not).
    let log = String::from_utf8_lossy(&out.stderr);
    let warm = log.matches("warm run phases").count();
    assert!(warm >= 5, "{warm} warm calls of 5 steps:\n{log}");
}

#[test]
fn an_unprivileged_user_without_capabilities_renders_the_same() {
    let fx = Fixture::new();
    v1_exec_pipeline(&fx);
    let out = fx.render_unprivileged(V1_EXEC_ARGS);
    let expected = std::fs::read_to_string(Path::new(GOLDEN_DIR).join("v1-exec.yaml")).unwrap();
    assert_eq!(stdout(&out), expected);
}

#[test]
fn a_fatal_result_exits_3_naming_the_step_and_prints_the_partial_output() {
    let fx = Fixture::new();
    let functions = exec_function("create", &fx.exec_image("create.sh"))
        + &exec_function("results", &fx.exec_image("results.sh"));
    write_pipeline(
        &fx,
        &functions,
        "  - step: create-buckets
    functionRef: {name: create}
  - step: stop-here
    functionRef: {name: results}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, fatal: quota exceeded}
",
    );
    let out = fx.render(&["xr.yaml", "composition.yaml", "functions.yaml", "-r"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pipeline step \"stop-here\" returned a fatal result: quota exceeded"),
        "{err}"
    );
    // The XR (Synced False, naming the fatal result) and the results before
    // it, as Crossplane's renderer returns them; no composed resources.
    assert_golden("v1-fatal.yaml", &String::from_utf8_lossy(&out.stdout));
}

fn alpha_composition(fx: &Fixture, steps: &[(&str, &str, &str)]) -> String {
    alpha_composition_at(fx, steps, None)
}

/// An alpha Composition whose steps name `endpoint` as their runner.
fn alpha_composition_at(
    fx: &Fixture,
    steps: &[(&str, &str, &str)],
    endpoint: Option<&str>,
) -> String {
    let mut text = String::from(
        "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: buckets-alpha
spec:
  compositeTypeRef:
    apiVersion: example.org/v1
    kind: XBucket
  functions:
",
    );
    for (name, script, config) in steps {
        let image = fx.alpha_image(script);
        text += &format!(
            "  - name: {name}
    type: Container
    config: {config}
    container:
      image: {image}
      timeout: 30s
"
        );
        if let Some(endpoint) = endpoint {
            text += &format!("      runner: {{endpoint: \"{endpoint}\"}}\n");
        }
    }
    text
}

const ALPHA_STEPS: &[(&str, &str, &str)] = &[
    ("create-buckets", "create.sh", "{}"),
    ("label-buckets", "label.sh", "{}"),
    (
        "report",
        "results.sh",
        "{apiVersion: test.xfn.dev/v1, kind: Config}",
    ),
];

/// bucket-0 exists and is Ready; bucket-1 does not exist yet.
const ALPHA_OBSERVED: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: demo-observed0
  annotations:
    crossplane.io/composition-resource-name: bucket-0
status:
  conditions:
  - type: Ready
    status: \"True\"
";

/// The XR, the alpha Composition of `ALPHA_STEPS` (run by `endpoint`, if
/// any) and the observed resources, written.
fn write_alpha_pipeline(fx: &Fixture, endpoint: Option<&str>) {
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &alpha_composition_at(fx, ALPHA_STEPS, endpoint),
    );
    fx.write("observed.yaml", ALPHA_OBSERVED);
}

const ALPHA_ARGS: &[&str] = &[
    "xr.yaml",
    "composition.yaml",
    "-o",
    "observed.yaml",
    "-r",
    "-x",
];

/// `xfn start` on an abstract socket, stopped on drop (`xfn_testkit::child::stop`).
struct RunnerDaemon {
    child: Child,
    socket: String,
}

impl RunnerDaemon {
    /// Starts it with its cache in `dir`, logging to `dir`/daemon.log at
    /// debug level (where the daemon logs each successful run, which the
    /// tests count).
    fn start(dir: &Path) -> RunnerDaemon {
        use std::os::linux::net::SocketAddrExt;
        let socket = format!("xfn-test/render-{}.sock", std::process::id());
        let child = xfn_command()
            .args(["-d", "start", "--network", "unix", "--address"])
            .arg(format!("@{socket}"))
            .arg("--cache-dir")
            .arg(dir.join("daemon-cache"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
            .spawn()
            .expect("start xfn start");
        let mut daemon = RunnerDaemon { child, socket };
        let address =
            std::os::unix::net::SocketAddr::from_abstract_name(daemon.socket.as_bytes()).unwrap();
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect_addr(&address).is_err() {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("xfn start exited: {status}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "xfn start never listened on @{}",
                daemon.socket
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }
}

impl Drop for RunnerDaemon {
    fn drop(&mut self) {
        xfn_testkit::child::stop(&mut self.child);
    }
}

#[test]
fn alpha_steps_run_on_the_runner_daemon_when_one_answers() {
    let fx = Fixture::new();
    let daemon = RunnerDaemon::start(fx.dir.path());
    let endpoint = format!("unix-abstract:{}", daemon.socket);
    write_alpha_pipeline(&fx, Some(&endpoint));
    // An OCI runtime that always fails: only the daemon can run the steps.
    let out = fx.render(&[ALPHA_ARGS, &["--runtime", "/bin/false"]].concat());
    assert_golden("alpha.yaml", &stdout(&out));
    let log = std::fs::read_to_string(fx.path("daemon.log")).unwrap();
    // One "call answered" per successful call (a failed one logs "call failed").
    assert_eq!(log.matches("call answered").count(), 3, "{log}");
    drop(daemon);
    let err = failure(&fx.render(&["xr.yaml", "composition.yaml", "--runtime", "/bin/false"]));
    assert!(
        err.contains("pipeline step \"create-buckets\" failed"),
        "{err}"
    );
}

#[test]
fn alpha_pipeline_renders_the_golden_output() {
    let fx = Fixture::new();
    write_alpha_pipeline(&fx, None);
    let out = fx.render(ALPHA_ARGS);
    assert_golden("alpha.yaml", &stdout(&out));
}

#[test]
fn a_fatal_alpha_result_fails_the_render_naming_the_step() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    let composition = alpha_composition(
        &fx,
        &[
            ("create-buckets", "create.sh", "{}"),
            ("stop-here", "results.sh", "{fatal: no more buckets}"),
        ],
    );
    fx.write("composition.yaml", &composition);
    let err = failure(&fx.render(&["xr.yaml", "composition.yaml"]));
    assert!(
        err.contains("pipeline step \"stop-here\" returned a fatal result: no more buckets"),
        "{err}"
    );
}

#[test]
fn development_runtime_drives_a_python_sdk_function_over_grpc() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    golden_pipeline(
        &fx,
        "python",
        &development_function("python", &function.address),
    );
    let out = fx.render(GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&out));

    // A fatal result from the SDK's response.fatal stops the render.
    fx.write(
        "composition.yaml",
        &pipeline_composition(
            "  - step: create
    functionRef: {name: python}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: create}
  - step: give-up
    functionRef: {name: python}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: results, fatal: cannot continue}
",
        ),
    );
    let err = failure(&fx.render(&["xr.yaml", "composition.yaml", "functions.yaml"]));
    assert!(
        err.contains("pipeline step \"give-up\" returned a fatal result: cannot continue"),
        "{err}"
    );
}

#[test]
fn input_errors_name_the_file_or_the_step() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write(
        "functions.yaml",
        &development_function("python", "127.0.0.1:1"),
    );
    let composition = pipeline_composition(
        "  - step: create
    functionRef: {name: python}
",
    );
    fx.write("composition.yaml", &composition);

    fx.write("bad.yaml", "apiVersion: [unclosed\n");
    fx.write(
        "other.yaml",
        &composition.replace("kind: XBucket", "kind: XDatabase"),
    );
    fx.write(
        "unknown.yaml",
        &composition.replace("{name: python}", "{name: nope}"),
    );
    // Each set of files, and what the refusal says.
    let cases: [([&str; 3], &[&str]); 6] = [
        (
            ["bad.yaml", "composition.yaml", "functions.yaml"],
            &["bad.yaml", "invalid YAML"],
        ),
        (
            ["xr.yaml", "xr.yaml", "functions.yaml"],
            &["xr.yaml: holds an XBucket, given as the COMPOSITION: an XR render takes XR COMPOSITION [FUNCTIONS], in that order"],
        ),
        (
            ["xr.yaml", "other.yaml", "functions.yaml"],
            &["other.yaml: the Composition composes example.org/v1 XDatabase, but the XR is an example.org/v1 XBucket"],
        ),
        (
            ["xr.yaml", "unknown.yaml", "functions.yaml"],
            &["pipeline step \"create\" references unknown Function \"nope\""],
        ),
        (
            ["xr.yaml", "composition.yaml", "composition.yaml"],
            &["expected a pkg.crossplane.io Function"],
        ),
        // Nothing listens on port 1: the step fails and is named.
        (
            ["xr.yaml", "composition.yaml", "functions.yaml"],
            &["pipeline step \"create\" failed", "127.0.0.1:1"],
        ),
    ];
    for (files, says) in cases {
        let err = failure(&fx.render(&files));
        for part in says {
            assert!(err.contains(part), "{files:?}: {err}");
        }
    }
}

/// example/render/ (docs/render.md's worked example) renders as
/// example/render/expected.yaml shows; only the server's port differs.
#[test]
fn the_worked_example_renders_as_shown() {
    let function = PythonFunction::start();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("example/render");
    let fx = Fixture::new();
    let functions =
        worked_example_file("functions.yaml").replace("127.0.0.1:9443", &function.address);
    let (actual, expected) = render_worked_example(&fx, &functions);

    // Development Functions run no container: no user namespace is entered,
    // so a cache dir the namespace could not reach is no obstacle.
    let private = fx.path("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = xfn_command()
        .arg("render")
        .arg("--cache-dir")
        .arg(private.join("cache"))
        .arg(example.join("xr.yaml"))
        .arg(example.join("composition.yaml"))
        .arg(fx.path("functions.yaml"))
        .arg("-r")
        .output()
        .unwrap();
    assert_eq!(stdout(&out), actual);

    if std::env::var_os("XFN_UPDATE_GOLDEN").is_some() {
        std::fs::write(example.join("expected.yaml"), &actual).unwrap();
        return;
    }
    assert_eq!(actual, expected);
}

#[test]
fn a_function_that_fails_or_writes_garbage_fails_the_render_naming_the_step() {
    let fx = Fixture::new();
    let crash = script_image(
        &fx.registry,
        "crash:v1",
        "echo 'cannot reach the cloud' >&2; exit 3",
    );
    let garbage = script_image(&fx.registry, "garbage:v1", "cat >/dev/null; echo not-json");
    fx.write(
        "functions.yaml",
        &(exec_function("crash", &crash) + &exec_function("garbage", &garbage)),
    );
    fx.write("xr.yaml", XR);
    for (function, expected) in [
        ("crash", "exit code 3: cannot reach the cloud"),
        ("garbage", "the output is not a RunFunctionResponse"),
    ] {
        fx.write(
            "composition.yaml",
            &pipeline_composition(&format!(
                "  - step: call-{function}\n    functionRef: {{name: {function}}}\n"
            )),
        );
        let err = failure(&fx.render(&["xr.yaml", "composition.yaml", "functions.yaml"]));
        assert!(
            err.contains(&format!("pipeline step \"call-{function}\" failed:"))
                && err.contains(expected),
            "{err}"
        );
    }
}

/// Renders the golden pipeline through `function` as a Development
/// Function: the Python SDK function's golden output, for the twins answer
/// alike. Returns the calls it logged over v1 and over v1beta1.
fn renders_the_golden_output_through(function: &FunctionServer) -> (usize, usize) {
    let fx = Fixture::new();
    golden_pipeline(
        &fx,
        "rust",
        &development_function("rust", &function.address),
    );
    let out = fx.render(GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&out));
    calls_by_version(&function.log())
}

#[test]
fn development_runtime_drives_the_static_rust_function_server_like_the_python_one() {
    let mut function = FunctionServer::start(&[]);
    let (v1, v1beta1) = renders_the_golden_output_through(&function);
    assert!(v1 >= 7 && v1beta1 == 0, "{}", function.log());

    // As PID 1 of a container it must stop on SIGTERM, not wait for SIGKILL.
    let status = function.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status}: {}", function.log());
}

#[test]
fn development_runtime_falls_back_to_v1beta1_on_a_static_server_in_an_empty_root() {
    // Only the binary in its root: no libc, no /etc, no NSS modules.
    let fx = Fixture::new();
    let root = fx.path("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::copy(function_server_binary(), root.join("fn_server")).unwrap();
    let mut command = Command::new("unshare");
    command
        .args(["-r", "chroot"])
        .arg(&root)
        .args(["/fn_server", "--serve", "v1beta1"]);
    let function = FunctionServer::start_command(command);
    // Every call came over v1beta1: v1 was Unimplemented, and xfn fell back.
    let (v1, v1beta1) = renders_the_golden_output_through(&function);
    assert!(v1 == 0 && v1beta1 >= 7, "{}", function.log());
}

#[test]
fn the_static_function_server_image_pulls() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server:v1", &["--serve", "v1beta1"]);
    let out = xfn_command()
        .arg("pull")
        .arg("--cache-dir")
        .arg(fx.path("cache"))
        .arg(&image)
        .output()
        .expect("spawn xfn");
    let line = stdout(&out);
    assert!(line.starts_with(&format!("pulled {image} ")), "{line}");
    assert!(line.contains("2 layers"), "{line}");
    // The check that vouched for the binary in the image does tell: xfn
    // itself is linked dynamically.
    let xfn = xfn_testkit::function_server::check_static(Path::new(env!("CARGO_BIN_EXE_xfn")));
    assert!(xfn.is_err_and(|why| why.contains("PT_INTERP")));
}
