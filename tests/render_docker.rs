//! `xfn render`'s `Docker` runtime end to end, with no Docker: each
//! Function's image is served rootless by xfn as a gRPC server for the
//! render and reached inside its own network namespace. The function is
//! tests/fixtures/fn_server.rs (the Rust twin of the Python SDK function of
//! tests/render/function.py), linked statically into a busybox image pushed
//! to a real registry on 127.0.0.1; real crun, real user namespaces.
//!
//! Needs: crun, docker-registry, busybox-static; root, or unprivileged user
//! namespaces.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use xfn_testkit::function_server::calls_by_version;
use xfn_testkit::render::*;
use xfn_testkit::*;

/// Asserts that the render left no container, bundle or rootfs in `cache`.
fn assert_nothing_left(cache: &Path) {
    for sub in ["bundles", "crun", "rootfs"] {
        let dir = cache.join("run").join(sub);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{} left: {left:?}", dir.display());
    }
}

/// Renders with the composition core's debug log, where each server start is.
fn render_logged(fx: &Fixture, args: &[&str]) -> std::process::Output {
    xfn_command()
        .arg("render")
        .arg("--cache-dir")
        .arg(fx.path("cache"))
        .args(args)
        .current_dir(fx.dir.path())
        .env(
            "RUST_LOG",
            "xfn::compose=debug,xfn::function_server=debug,xfn::lifecycle::serve=debug,xfn::lifecycle::output=debug",
        )
        .stdin(Stdio::null())
        .output()
        .expect("spawn xfn")
}

#[test]
fn a_function_image_served_by_the_docker_runtime_renders_the_golden_output() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    golden_pipeline(&fx, "rust", &function_object("rust", &image, &[]));
    let out = render_logged(&fx, GOLDEN_ARGS);
    // The Python SDK function's golden file, through a container this time.
    assert_golden("v1-development.yaml", &stdout(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    // One server for all seven steps (and the requirement re-run), called
    // over v1. (It serves at all only when started with `--insecure`, as
    // `crossplane render` starts it: fn_server refuses to start without.)
    assert_eq!(log.matches("function server started").count(), 1, "{log}");
    let (v1, v1beta1) = calls_by_version(&log);
    assert!(v1 >= 8 && v1beta1 == 0, "{log}");
    assert_nothing_left(&fx.path("cache"));
}

#[test]
fn a_v1beta1_server_named_by_the_image_annotation_renders_the_same() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server-beta:v1", &["--serve", "v1beta1"]);
    let annotations = [
        "render.crossplane.io/runtime: Docker".to_string(),
        format!("render.crossplane.io/runtime-docker-image: {image}"),
        "render.crossplane.io/runtime-docker-pull-policy: Always".to_string(),
    ];
    let annotations: Vec<&str> = annotations.iter().map(String::as_str).collect();
    // The package is never pulled: the annotation names the image to run.
    let function = function_object("rust", "xpkg.example.org/not-pulled:v0.1.0", &annotations);
    golden_pipeline(&fx, "rust", &function);
    let out = render_logged(&fx, GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    let (v1, v1beta1) = calls_by_version(&log);
    assert!(
        v1 == 0 && v1beta1 >= 8,
        "every call falls back to v1beta1: {log}"
    );
    assert_nothing_left(&fx.path("cache"));
}

#[test]
fn an_unprivileged_user_without_capabilities_renders_the_same() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    golden_pipeline(&fx, "rust", &function_object("rust", &image, &[]));
    let out = fx.render_unprivileged(GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&out));
    assert_nothing_left(&fx.path("cache"));
}

#[test]
fn servers_of_several_functions_start_at_once_and_stop_after_a_fatal_result() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    let functions = ["create", "judge", "after", "unused"]
        .iter()
        .map(|name| function_object(name, &image, &[]))
        .collect::<String>();
    fx.write("functions.yaml", &functions);
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &pipeline_composition(
            "  - step: create
    functionRef: {name: create}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: create}
  - step: give-up
    functionRef: {name: judge}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: results, fatal: cannot continue}
  - step: never-reached
    functionRef: {name: after}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: ready}
",
        ),
    );
    let out = render_logged(&fx, &["xr.yaml", "composition.yaml", "functions.yaml"]);
    let err = failure(&out);
    assert!(
        err.contains("pipeline step \"give-up\" returned a fatal result: cannot continue"),
        "{err}"
    );
    // Every Function a step uses was served before the first step (the one
    // of the step after the fatal one too), the unused one was not; all are
    // gone after the failed render.
    assert_eq!(err.matches("function server started").count(), 3, "{err}");
    assert!(err.contains("function=after"), "{err}");
    assert!(!err.contains("function=unused"), "{err}");
    assert_nothing_left(&fx.path("cache"));
}

#[test]
fn a_server_that_fails_or_never_listens_is_named_with_its_output() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &pipeline_composition(
            "  - step: create
    functionRef: {name: broken}
",
        ),
    );
    let render = |package: &str, timeout: &str| {
        fx.write("functions.yaml", &function_object("broken", package, &[]));
        let out = fx.render(&[
            "xr.yaml",
            "composition.yaml",
            "functions.yaml",
            "--timeout",
            timeout,
        ]);
        assert_nothing_left(&fx.path("cache"));
        failure(&out)
    };

    let exits = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint([
            "/bin/sh",
            "-c",
            "echo \"cannot load TLS certificates ($*)\" >&2; exit 4",
            "sh",
        ])
        .push(&fx.registry, "exits:v1")
        .reference;
    let err = render(&exits, "1m");
    assert!(
        err.contains(&format!(
            "Function \"broken\": cannot start its image {exits} as a function server"
        )) && err.contains("exit code 4")
            && err.contains("cannot load TLS certificates (--insecure --address=127.0.0.1:"),
        "{err}"
    );

    // Waits at most half the render's timeout, then names the function.
    let silent = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", "echo warming up; exec sleep 600", "sh"])
        .push(&fx.registry, "silent:v1")
        .reference;
    let started = Instant::now();
    let err = render(&silent, "6s");
    assert!(
        err.contains("Function \"broken\"")
            && err.contains("did not listen on 127.0.0.1:")
            && err.contains("within 3s")
            && err.contains("warming up"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{err}");

    let missing = fx.registry.reference("missing:v1");
    let err = render(&missing, "1m");
    assert!(
        err.contains("Function \"broken\"") && err.contains("not found"),
        "{err}"
    );
}

/// docs/render.md's worked example with the `Docker` runtime (what
/// `scripts/example.sh render` runs): example/render/functions-docker.yaml
/// with the image filled in renders example/render/expected.yaml.
#[test]
fn the_worked_example_renders_as_shown_with_the_docker_runtime() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "example/function-server:v1", &[]);
    let functions = worked_example_file("functions-docker.yaml").replace("IMAGE", &image);
    let (actual, expected) = render_worked_example(&fx, &functions);
    assert_eq!(actual, expected);
    assert_nothing_left(&fx.path("cache"));
}

/// `xfn render-servers ARGS --cache-dir CACHE`.
fn render_servers(fx: &Fixture, args: &[&str]) -> std::process::Output {
    xfn_command()
        .arg("render-servers")
        .args(args)
        .arg("--cache-dir")
        .arg(fx.path("cache"))
        .stdin(Stdio::null())
        .output()
        .expect("spawn xfn")
}

/// Stops every kept server of a fixture, even when a test fails midway.
struct StopKept<'a>(&'a Fixture);

impl Drop for StopKept<'_> {
    fn drop(&mut self) {
        let _ = render_servers(self.0, &["stop", "--all"]);
    }
}

/// The keeper pid `info.json` of kept server `name` names.
fn keeper_pid(fx: &Fixture, name: &str) -> u64 {
    let info = fx
        .path("cache")
        .join("run/kept")
        .join(name)
        .join("info.json");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&info).unwrap_or_else(|e| panic!("{info:?}: {e}")))
            .unwrap();
    info["pid"].as_u64().unwrap()
}

/// The golden pipeline of the Function "rust", its server kept between
/// renders (`runtime-docker-cleanup: Orphan`, and `annotation` when not
/// empty); the image it serves, pushed.
fn kept_golden_pipeline(fx: &Fixture, annotation: &str) -> String {
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    let mut annotations = vec!["render.crossplane.io/runtime-docker-cleanup: Orphan"];
    annotations.extend([annotation].into_iter().filter(|a| !a.is_empty()));
    golden_pipeline(fx, "rust", &function_object("rust", &image, &annotations));
    image
}

#[test]
fn a_kept_server_is_reused_by_the_next_render_and_stopping_it_leaves_nothing() {
    let fx = Fixture::new();
    let _stop = StopKept(&fx);
    let image = kept_golden_pipeline(&fx, "render.crossplane.io/runtime-docker-name: golden-fn");

    let first = render_logged(&fx, GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&first));
    let log = String::from_utf8_lossy(&first.stderr);
    assert!(log.contains("starting a kept function server"), "{log}");
    let keeper = keeper_pid(&fx, "golden-fn");

    // The next render reuses the running server: no new keeper, no start.
    let second = render_logged(&fx, GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&second));
    let log = String::from_utf8_lossy(&second.stderr);
    assert!(log.contains("reusing the kept function server"), "{log}");
    assert!(!log.contains("starting a kept function server"), "{log}");
    assert!(!log.contains("function server started"), "{log}");
    assert_eq!(keeper_pid(&fx, "golden-fn"), keeper);

    let listed = stdout(&render_servers(&fx, &["ls"]));
    assert!(
        listed.contains("golden-fn")
            && listed.contains(&image)
            && listed.contains(&keeper.to_string()),
        "{listed}"
    );

    let stopped = stdout(&render_servers(&fx, &["stop", "golden-fn"]));
    assert!(stopped.contains("stopped golden-fn"), "{stopped}");
    assert!(
        !Path::new(&format!("/proc/{keeper}/cmdline")).exists()
            || std::fs::read(format!("/proc/{keeper}/cmdline"))
                .unwrap()
                .is_empty(),
        "the keeper is gone"
    );
    assert!(!fx.path("cache").join("run/kept/golden-fn").exists());
    assert_nothing_left(&fx.path("cache"));
    let listed = stdout(&render_servers(&fx, &["ls"]));
    assert!(!listed.contains("golden-fn"), "{listed}");
    // Stopping what is not there says so.
    let err = failure(&render_servers(&fx, &["stop", "golden-fn"]));
    assert!(err.contains("no kept server named golden-fn"), "{err}");
}

#[test]
fn v2_xrs_and_operations_render_the_same_through_a_served_image() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    // The Python SDK function's golden files, through a container.
    v2_pipeline(
        &fx,
        "rust",
        &function_object("rust", &image, &[]),
        XR_NAMESPACED,
        XRD_V2,
    );
    assert_golden("v2-namespaced.yaml", &stdout(&fx.render(V2_ARGS)));

    fx.write("functions.yaml", &function_object("rust", &image, &[]));
    fx.write("required.yaml", REQUIRED);
    fx.write("watched.yaml", WATCHED);
    fx.write("operation.yaml", &operation("Operation", "rust"));
    let operation_args = [
        "operation.yaml",
        "functions.yaml",
        "-e",
        "required.yaml",
        "-r",
    ];
    let out = fx.render(&operation_args);
    assert_golden("op-operation.yaml", &stdout(&out));
    fx.write("operation.yaml", &operation("WatchOperation", "rust"));
    let out = fx.render(&[&operation_args[..], &["-w", "watched.yaml"]].concat());
    assert_golden("op-watch.yaml", &stdout(&out));
    assert_nothing_left(&fx.path("cache"));
}

#[test]
fn a_server_gets_its_environment_and_egress_unless_its_network_is_none() {
    let fx = Fixture::new();
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &pipeline_composition(
            "  - step: env
    functionRef: {name: rust}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: env, name: GREETING}
",
        ),
    );
    // Egress by default and on any Docker network named (a CI job's), as
    // upstream; none only with Docker's `none`.
    for (network, egress) in [
        (None, true),
        (
            Some("render.crossplane.io/runtime-docker-network: host"),
            true,
        ),
        (
            Some("render.crossplane.io/runtime-docker-network: ci-job-network"),
            true,
        ),
        (
            Some("render.crossplane.io/runtime-docker-network: none"),
            false,
        ),
    ] {
        let mut annotations =
            vec!["render.crossplane.io/runtime-docker-env: GREETING=hello,OTHER=x"];
        annotations.extend(network);
        fx.write(
            "functions.yaml",
            &function_object("rust", &image, &annotations),
        );
        let out = render_logged(
            &fx,
            &["xr.yaml", "composition.yaml", "functions.yaml", "-c"],
        );
        let text = stdout(&out);
        assert!(text.contains("env: hello"), "{network:?}: {text}");
        let log = String::from_utf8_lossy(&out.stderr);
        // On the host's network the server listens on a loopback port
        // xfn picked, never on 9443 of the host; in its own namespace on
        // 9443 of that namespace.
        assert_eq!(
            log.contains("--address=127.0.0.1:"),
            egress,
            "{network:?}: {log}"
        );
        assert_nothing_left(&fx.path("cache"));
    }
}

#[test]
fn an_unprivileged_user_keeps_and_reuses_a_server_and_stops_it() {
    let fx = Fixture::new();
    let _stop = StopKept(&fx);
    kept_golden_pipeline(&fx, "");
    let first = fx.render_unprivileged(GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&first));
    // Named after the Function when runtime-docker-name is not given.
    let keeper = keeper_pid(&fx, "rust");
    let second = fx.render_unprivileged(GOLDEN_ARGS);
    assert_golden("v1-development.yaml", &stdout(&second));
    let log = String::from_utf8_lossy(&second.stderr);
    assert!(log.contains("reusing the kept function server"), "{log}");
    assert_eq!(keeper_pid(&fx, "rust"), keeper);
    let stop = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["render-servers", "stop", "--all", "--cache-dir"])
        .arg(fx.path("cache"))
        .stdin(Stdio::null())
        .output()
        .expect("spawn xfn");
    assert!(stdout(&stop).contains("stopped rust"));
    assert!(!fx.path("cache").join("run/kept/rust").exists());
    assert_nothing_left(&fx.path("cache"));
}
