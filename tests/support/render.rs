//! `xfn render` fixtures shared by the render tests: a registry and work
//! dir ([`Fixture`]), function images of shell scripts (tests/render/exec and
//! tests/render/alpha), Function and Composition objects, and golden files in
//! tests/golden/ ([`assert_golden`]; `XFN_UPDATE_GOLDEN=1` rewrites them).
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use super::*;

pub const EXEC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/render/exec");
pub const ALPHA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/render/alpha");
pub const GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

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
        let cache = self.path("cache");
        dir_owned_by(&cache, NONROOT);
        unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
            .arg("render")
            .arg("--cache-dir")
            .arg(&cache)
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("spawn xfn")
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
/// examples/fn_server.rs, by any runtime) whose render is
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

/// Renders example/render/ (the README's worked example) with `functions`
/// (the text of its Functions file) and `-r`; returns the output, which
/// must be example/render/expected.yaml.
pub fn render_worked_example(fx: &Fixture, functions: &str) -> (String, String) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("example/render");
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
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("example/render")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
