//! `xfn render` fixtures shared by the render tests: a registry and work
//! dir ([`Fixture`]), function images of shell scripts (tests/render/exec and
//! tests/render/alpha), Function and Composition objects, and golden files in
//! tests/golden/ ([`assert_golden`]; `XFN_UPDATE_GOLDEN=1` rewrites them).
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::*;

pub const EXEC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/render/exec");
pub const ALPHA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/render/alpha");
pub const GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden");

pub const XR: &str = "apiVersion: example.org/v1
kind: XBucket
metadata:
  name: demo
  uid: 0b7d5c1e-0000-4000-8000-000000000001
spec:
  count: 2
";

/// A registry and a work dir (traversable by xfn's mapped root) for a render.
pub struct Fixture {
    /// Where function images are pushed.
    pub registry: Registry,
    /// Inputs, the cache and outputs.
    pub dir: tempfile::TempDir,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture {
            registry: Registry::start(),
            dir: world_traversable_tempdir(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// busybox + a helper on PATH + `/fn.sh` from `dir/script` as entrypoint.
    /// busybox + `helper` from `dir` on PATH + `/fn.sh` from `dir/script` as
    /// entrypoint, pushed as `<prefix><script name>:v1`.
    pub fn script_image(&self, dir: &str, helper: &str, script: &str, prefix: &str) -> String {
        let read = |name: &str| std::fs::read(Path::new(dir).join(name)).unwrap();
        ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(
                Layer::new()
                    .file(&format!("/bin/{helper}"), 0o755, read(helper))
                    .file("/fn.sh", 0o755, read(script)),
            )
            .entrypoint(["/bin/sh", "/fn.sh"])
            .push(
                &self.registry,
                &format!("{prefix}{}:v1", script.trim_end_matches(".sh")),
            )
            .reference
    }

    /// A v1 Exec function image of tests/render/exec/`script`.
    pub fn exec_image(&self, script: &str) -> String {
        self.script_image(EXEC_DIR, "jget", script, "")
    }

    /// An alpha (FunctionIO) function image of tests/render/alpha/`script`,
    /// in another repository namespace than the v1 ones.
    pub fn alpha_image(&self, script: &str) -> String {
        self.script_image(ALPHA_DIR, "yamlsec", script, "alpha-")
    }

    /// Renders as [`NONROOT`] without capabilities, with a cache it owns.
    pub fn render_unprivileged(&self, args: &[&str]) -> Output {
        self.render_unprivileged_command(args)
            .stdin(Stdio::null())
            .output()
            .expect("spawn xfn")
    }

    /// The command [`Fixture::render_unprivileged`] runs, for
    /// [`crate::child::measure`].
    pub fn render_unprivileged_command(&self, args: &[&str]) -> Command {
        let cache = self.path("cache");
        dir_owned_by(&cache, NONROOT);
        let mut cmd = unprivileged(NONROOT, &xfn_binary());
        cmd.arg("render")
            .arg("--cache-dir")
            .arg(&cache)
            .args(args)
            .current_dir(self.dir.path());
        cmd
    }

    pub fn render(&self, args: &[&str]) -> Output {
        xfn_command()
            .arg("render")
            .arg("--cache-dir")
            .arg(self.path("cache"))
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("spawn xfn")
    }
}

/// Compares `actual` with tests/golden/`name` (or rewrites it).
pub fn assert_golden(name: &str, actual: &str) {
    let path = Path::new(GOLDEN_DIR).join(name);
    if std::env::var_os("XFN_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(GOLDEN_DIR).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with XFN_UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(actual, expected, "output differs from {}", path.display());
}

/// A `pkg.crossplane.io` Function object (a YAML document) with
/// `annotations` (YAML lines, indented by four), if any.
pub fn function_object(name: &str, package: &str, annotations: &[&str]) -> String {
    let mut text = format!(
        "---
apiVersion: pkg.crossplane.io/v1beta1
kind: Function
metadata:
  name: {name}
"
    );
    if !annotations.is_empty() {
        text += "  annotations:\n";
        for annotation in annotations {
            text += &format!("    {annotation}\n");
        }
    }
    text + &format!("spec:\n  package: {package}\n")
}

/// A Function of the Exec runtime.
pub fn exec_function(name: &str, image: &str) -> String {
    function_object(name, image, &["render.crossplane.io/runtime: Exec"])
}

pub fn pipeline_composition(steps: &str) -> String {
    format!(
        "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: buckets
spec:
  compositeTypeRef:
    apiVersion: example.org/v1
    kind: XBucket
  mode: Pipeline
  pipeline:
{steps}"
    )
}

/// A Function of the Development runtime, served at `target`.
pub fn development_function(name: &str, target: &str) -> String {
    let target = format!("render.crossplane.io/runtime-development-target: {target}");
    function_object(
        name,
        "xpkg.example.org/function-python:v0.1.0",
        &["render.crossplane.io/runtime: Development", &target],
    )
}

/// The 7-step pipeline of one Function `name` described by `function` (a
/// Function object that runs function.py or its Rust twin,
/// tests/fixtures/fn_server.rs, by any runtime) whose render is
/// tests/golden/v1-development.yaml: create, require (settings), label,
/// context write and read, ready, results. Render it with [`GOLDEN_ARGS`].
pub fn golden_pipeline(fx: &Fixture, name: &str, function: &str) {
    fx.write("xr.yaml", XR);
    fx.write("functions.yaml", function);
    let mut steps = String::new();
    for (step, input) in [
        ("create", "action: create"),
        ("require-settings", "action: require, name: settings"),
        ("label", "action: label, labels: {team: platform}"),
        ("write-context", "action: context, write: {greeting: hello}"),
        ("read-context", "action: context, read: greeting"),
        ("ready", "action: ready, names: [bucket-0, from-settings]"),
        ("warn", "action: results, warning: almost out of buckets"),
    ] {
        steps += &format!(
            "  - step: {step}
    functionRef: {{name: {name}}}
    input: {{apiVersion: test.xfn.dev/v1, kind: Input, {input}}}
"
        );
    }
    fx.write("composition.yaml", &pipeline_composition(&steps));
    fx.write("required.yaml", REQUIRED);
}

/// Resources steps may require (`-e required.yaml`): the ConfigMap
/// `settings` that steps ask for, and one that nothing selects.
pub const REQUIRED: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  region: eu-west-1
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: other
data:
  region: us-east-1
";

/// The arguments of a render of [`golden_pipeline`].
pub const GOLDEN_ARGS: &[&str] = &[
    "xr.yaml",
    "composition.yaml",
    "functions.yaml",
    "-e",
    "required.yaml",
    "-r",
    "-c",
];

/// Renders example/render/ (docs/render.md's worked example) with `functions`
/// (the text of its Functions file) and `-r`; returns the output, which
/// must be example/render/expected.yaml.
pub fn render_worked_example(fx: &Fixture, functions: &str) -> (String, String) {
    let example = crate::repo_root().join("example/render");
    fx.write("functions.yaml", functions);
    let out = fx.render(&[
        example.join("xr.yaml").to_str().unwrap(),
        example.join("composition.yaml").to_str().unwrap(),
        "functions.yaml",
        "-r",
    ]);
    let expected = std::fs::read_to_string(example.join("expected.yaml")).unwrap();
    (stdout(&out), expected)
}

/// The text of example/render/`name`.
pub fn worked_example_file(name: &str) -> String {
    let path = crate::repo_root().join("example/render").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Python function server from tests/render/function.py, killed on drop.
pub struct PythonFunction {
    child: std::process::Child,
    pub address: String,
}

impl PythonFunction {
    pub fn start() -> PythonFunction {
        let python = std::env::var("XFN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let check = std::process::Command::new(&python)
            .args(["-c", "import crossplane.function.runtime"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        assert!(
            check.status.success(),
            "{python} lacks Crossplane's Python function SDK: \
             `pip install crossplane-function-sdk-python` (or set XFN_TEST_PYTHON): {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let child = std::process::Command::new(&python)
            .arg(crate::repo_root().join("tests/render/function.py"))
            .args(["--insecure", "--address", &address])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the Python function");
        let mut function = PythonFunction { child, address };
        // Wait until it listens (or died).
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(&function.address).is_err() {
            if let Some(status) = function.child.try_wait().unwrap() {
                panic!("the Python function exited: {status}");
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "the Python function never listened on {}",
                function.address
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        function
    }
}

impl Drop for PythonFunction {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A namespaced XR of the v2 XRD [`XRD_V2`], without the fields the XRD
/// defaults.
pub const XR_NAMESPACED: &str = "apiVersion: example.org/v1
kind: XBucket
metadata:
  name: demo
  namespace: team-a
spec:
  count: 2
";

/// A v2 XRD (Namespaced) defining XBucket, with defaults.
pub const XRD_V2: &str = "apiVersion: apiextensions.crossplane.io/v2
kind: CompositeResourceDefinition
metadata:
  name: xbuckets.example.org
spec:
  group: example.org
  scope: Namespaced
  names: {kind: XBucket, plural: xbuckets}
  versions:
  - name: v1
    served: true
    referenceable: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              count: {type: integer, default: 1}
              region: {type: string, default: eu-west-1}
              storage:
                type: object
                default: {}
                properties:
                  class: {type: string, default: standard}
";

/// The same XRD as Crossplane v1 wrote it: no scope, so LegacyCluster.
pub fn xrd_v1_legacy() -> String {
    XRD_V2
        .replace(
            "apiextensions.crossplane.io/v2",
            "apiextensions.crossplane.io/v1",
        )
        .replace("  scope: Namespaced\n", "")
}

/// An OpenAPI v3 document (as `kubectl get --raw /openapi/v3/api/v1`
/// prints it, trimmed) with the ConfigMap schema, for `-s`.
pub const OPENAPI_CORE_V1: &str = r##"{"openapi": "3.0.0", "components": {"schemas": {
  "io.k8s.api.core.v1.ConfigMap": {"type": "object",
    "x-kubernetes-group-version-kind": [{"group": "", "kind": "ConfigMap", "version": "v1"}],
    "properties": {"apiVersion": {"type": "string"}, "data": {"type": "object"},
      "kind": {"type": "string"},
      "metadata": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}}},
  "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object",
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}}}}}}
"##;

/// The v2 pipeline of one Function `name` (function.py or its twin, by any
/// runtime): create, observe (what the reconciler gave the XR), schema (a
/// required ConfigMap schema), ready (bucket-0). Render it with
/// [`V2_ARGS`] and `--xrd` naming the XRD written as `xrd.yaml`.
pub fn v2_pipeline(fx: &Fixture, name: &str, function: &str, xr: &str, xrd: &str) {
    fx.write("xr.yaml", xr);
    fx.write("xrd.yaml", xrd);
    fx.write("functions.yaml", function);
    let mut steps = String::new();
    for (step, input) in [
        ("create", "action: create"),
        ("observe", "action: observe"),
        ("schema", "action: schema, apiVersion: v1, kind: ConfigMap"),
        ("ready", "action: ready, names: [bucket-0]"),
    ] {
        steps += &format!(
            "  - step: {step}
    functionRef: {{name: {name}}}
    input: {{apiVersion: test.xfn.dev/v1, kind: Input, {input}}}
"
        );
    }
    fx.write("composition.yaml", &pipeline_composition(&steps));
    std::fs::create_dir_all(fx.path("schemas")).unwrap();
    fx.write("schemas/api-v1.json", OPENAPI_CORE_V1);
}

/// The arguments of a render of [`v2_pipeline`].
pub const V2_ARGS: &[&str] = &[
    "xr.yaml",
    "composition.yaml",
    "functions.yaml",
    "--xrd",
    "xrd.yaml",
    "-s",
    "schemas",
    "-r",
    "-c",
];

/// An Operation of one step of Function `name` (action `operate`), as an
/// Operation, a CronOperation or a WatchOperation (`kind`).
pub fn operation(kind: &str, name: &str) -> String {
    let step = |indent: &str| {
        format!(
            "{indent}mode: Pipeline
{indent}pipeline:
{indent}- step: apply
{indent}  functionRef: {{name: {name}}}
{indent}  input: {{apiVersion: test.xfn.dev/v1, kind: Input, action: operate, name: rotated}}
"
        )
    };
    let head = format!(
        "apiVersion: ops.crossplane.io/v1alpha1\nkind: {kind}\nmetadata:\n  name: rotate\n"
    );
    match kind {
        "Operation" => format!("{head}spec:\n{}", step("  ")),
        "CronOperation" => format!(
            "{head}spec:\n  schedule: '*/5 * * * *'\n  operationTemplate:\n    metadata:\n      labels: {{team: a}}\n    spec:\n{}",
            step("      ")
        ),
        _ => format!(
            "{head}spec:\n  watch: {{apiVersion: v1, kind: ConfigMap}}\n  operationTemplate:\n    spec:\n{}",
            step("      ")
        ),
    }
}

/// The resource a WatchOperation renders for (`-w`).
pub const WATCHED: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  namespace: default
";
