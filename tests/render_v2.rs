//! `xfn render` against what Crossplane v2 renders (`crossplane composition
//! render`, `crossplane operation render`), through a real function server
//! written with Crossplane's published Python SDK (Development runtime):
//! namespaced v2 XRs and XRD defaults, Legacy XRs, required schemas,
//! CompositionRevisions, function annotation overrides, repeatable required
//! resources, and Operations of each kind. The same cases through a
//! function image served rootless (Docker) are in render_docker.rs.
//!
//! Needs: python3 with crossplane-function-sdk-python (or XFN_TEST_PYTHON).

use xfn_testkit::render::*;
use xfn_testkit::*;

#[test]
fn a_namespaced_xr_of_a_v2_xrd_gets_its_defaults_namespace_and_schemas() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    let functions = development_function("python", &function.address);
    v2_pipeline(&fx, "python", &functions, XR_NAMESPACED, XRD_V2);
    let out = fx.render(V2_ARGS);
    // Composed resources in team-a, refs without namespace, the XRD's
    // defaults (count stays 2, region and storage.class filled) seen by the
    // function, the ConfigMap schema's properties from -s.
    assert_golden("v2-namespaced.yaml", &stdout(&out));
}

#[test]
fn a_cluster_xr_of_a_v1_xrd_is_legacy() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    let functions = development_function("python", &function.address);
    v2_pipeline(&fx, "python", &functions, XR, &xrd_v1_legacy());
    let out = fx.render(V2_ARGS);
    // spec.resourceRefs, spec.compositionRef (not spec.crossplane.*).
    assert_golden("v2-legacy.yaml", &stdout(&out));
}

#[test]
fn an_xrd_of_another_kind_or_scope_is_refused_by_name() {
    let fx = Fixture::new();
    let functions = development_function("python", "127.0.0.1:1");
    v2_pipeline(
        &fx,
        "python",
        &functions,
        XR,
        &XRD_V2.replace("kind: XBucket", "kind: XQueue"),
    );
    let err = failure(&fx.render(V2_ARGS));
    assert!(
        err.contains("xrd.yaml") && err.contains("XQueue") && err.contains("XBucket"),
        "{err}"
    );
    // A v2 Namespaced XRD's XR needs a namespace.
    fx.write("xrd.yaml", XRD_V2);
    let err = failure(&fx.render(V2_ARGS));
    assert!(
        err.contains("Namespaced") && err.contains("no metadata.namespace"),
        "{err}"
    );
}

#[test]
fn a_composition_revision_renders_and_is_named_with_annotations_overridden_by_flag() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    // The Functions file names a target nothing listens on; -a points
    // every Function at the running one.
    golden_pipeline(
        &fx,
        "python",
        &development_function("python", "127.0.0.1:1"),
    );
    let composition = std::fs::read_to_string(fx.path("composition.yaml")).unwrap();
    fx.write(
        "revision.yaml",
        &composition
            .replace("kind: Composition", "kind: CompositionRevision")
            .replace(
                "  name: buckets\n",
                "  name: buckets-7f3c2a1\n  labels: {crossplane.io/composition-name: buckets}\n",
            ),
    );
    // -e is repeatable, and --extra-resources is its deprecated name.
    fx.write(
        "other.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: unused}\n",
    );
    let target = format!(
        "render.crossplane.io/runtime-development-target={}",
        function.address
    );
    let out = fx.render(&[
        "xr.yaml",
        "revision.yaml",
        "functions.yaml",
        "-a",
        &target,
        "--extra-resources",
        "required.yaml",
        "-e",
        "other.yaml",
        "-r",
    ]);
    assert_golden("v2-revision.yaml", &stdout(&out));
}

/// Renders `kind` of the Operation through the Python function, with the
/// `settings` ConfigMap required (and `-w` for a WatchOperation).
fn render_operation(fx: &Fixture, address: &str, kind: &str) -> std::process::Output {
    fx.write("functions.yaml", &development_function("python", address));
    fx.write("operation.yaml", &operation(kind, "python"));
    fx.write("required.yaml", REQUIRED);
    fx.write("watched.yaml", WATCHED);
    let mut args = vec![
        "operation.yaml",
        "functions.yaml",
        "-e",
        "required.yaml",
        "-r",
    ];
    if kind == "WatchOperation" {
        args.extend(["-w", "watched.yaml"]);
    }
    fx.render(&args)
}

#[test]
fn operations_of_each_kind_render_like_crossplane_operation_render() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    let operation = stdout(&render_operation(&fx, &function.address, "Operation"));
    assert_golden("op-operation.yaml", &operation);
    // A CronOperation renders the Operation its template makes.
    let cron = stdout(&render_operation(&fx, &function.address, "CronOperation"));
    assert_eq!(cron, operation);
    // A WatchOperation's watched resource reaches the function.
    let watch = stdout(&render_operation(&fx, &function.address, "WatchOperation"));
    assert_golden("op-watch.yaml", &watch);
    // ... and is required: without -w the render says so.
    fx.write(
        "operation.yaml",
        &xfn_testkit::render::operation("WatchOperation", "python"),
    );
    let err = failure(&fx.render(&["operation.yaml", "functions.yaml"]));
    assert!(err.contains("--watched-resource"), "{err}");
}

#[test]
fn the_full_operation_and_a_fatal_operation_exit_as_crossplane() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    render_operation(&fx, &function.address, "Operation");
    let out = fx.render(&[
        "operation.yaml",
        "functions.yaml",
        "--include-full-operation",
    ]);
    let text = stdout(&out);
    assert!(
        text.contains("spec:") && text.contains("action: operate"),
        "{text}"
    );
    fx.write(
        "operation.yaml",
        &operation("Operation", "python").replace(
            "action: operate, name: rotated",
            "action: results, fatal: no rotation today",
        ),
    );
    let out = fx.render(&["operation.yaml", "functions.yaml", "-r"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_golden("op-fatal.yaml", &String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_development_target_may_be_a_grpc_dns_name() {
    let function = PythonFunction::start();
    let fx = Fixture::new();
    let target = format!("dns:///{}", function.address);
    golden_pipeline(&fx, "python", &development_function("python", &target));
    assert_golden("v1-development.yaml", &stdout(&fx.render(GOLDEN_ARGS)));
}

#[test]
fn two_functions_cannot_keep_one_server() {
    let fx = Fixture::new();
    let functions =
        function_object("a", "x.example/a:v1", &[]) + &function_object("b", "x.example/b:v1", &[]);
    fx.write("functions.yaml", &functions);
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &pipeline_composition(
            "  - step: one
    functionRef: {name: a}
  - step: two
    functionRef: {name: b}
",
        ),
    );
    let err = failure(&fx.render(&[
        "xr.yaml",
        "composition.yaml",
        "functions.yaml",
        "-a",
        "render.crossplane.io/runtime-docker-cleanup=Orphan",
        "-a",
        "render.crossplane.io/runtime-docker-name=shared",
    ]));
    assert!(err.contains("keeps a server named \"shared\" too"), "{err}");
}
