//! `xfn render` against what `crossplane composition render` (crossplane/cli
//! release-2.5) does, item by item of issue 23, each through both function
//! runtimes: the real Python-SDK function of tests/render/function.py
//! (Development) and the static twin of it in an image served rootless
//! (Docker), both rendering the same golden file. Also what xfn adds
//! where the CLI has nothing (claims as input, Crossplane's renderer's deleted
//! resources and requirements), and a render stopped by a signal.
//!
//! Needs: python3 with crossplane-function-sdk-python (or XFN_TEST_PYTHON),
//! crun, docker-registry, busybox-static; root.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use xfn_testkit::function_server::function_server_image;
use xfn_testkit::render::*;
use xfn_testkit::*;

/// The Functions file of Function `name` for each runtime: the Python SDK
/// function (Development) and the function image (Docker). The Python
/// server lives as long as the returned guard.
fn each_runtime(fx: &Fixture, name: &str) -> Vec<(&'static str, String, Option<PythonFunction>)> {
    let python = PythonFunction::start();
    let development = development_function(name, &python.address);
    let image = function_server_image(&fx.registry, "fn-server:v1", &[]);
    vec![
        ("Development", development, Some(python)),
        ("Docker", function_object(name, &image, &[]), None),
    ]
}

/// `functions` and a pipeline of Function "fn" with these steps, written.
fn write_fn_pipeline(fx: &Fixture, functions: &str, steps: &[(&str, &str)]) {
    fx.write("functions.yaml", functions);
    fx.write("composition.yaml", &self::steps("fn", steps));
}

/// A pipeline of Function `name` with these `(step, input)` steps.
fn steps(name: &str, steps: &[(&str, &str)]) -> String {
    let mut text = String::new();
    for (step, input) in steps {
        text += &format!(
            "  - step: {step}
    functionRef: {{name: {name}}}
    input: {{apiVersion: test.xfn.dev/v1, kind: Input, {input}}}
"
        );
    }
    pipeline_composition(&text)
}

#[test]
fn the_full_xr_carries_the_xrds_defaults_as_the_cli_prints_it() {
    let fx = Fixture::new();
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        v2_pipeline(&fx, "fn", &functions, XR_NAMESPACED, XRD_V2);
        let mut args = V2_ARGS.to_vec();
        args.push("-x");
        let out = fx.render(&args);
        let text = stdout(&out);
        // spec.count as given, region and storage.class from the XRD.
        assert!(
            text.contains("  count: 2\n") && text.contains("region: eu-west-1"),
            "{runtime}: {text}"
        );
        assert_golden("parity-full-xr-defaults.yaml", &text);
    }
}

#[test]
fn context_flags_are_maps_separated_by_semicolons_of_json_or_yaml() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write("region.yaml", "name: eu-west-1\nzones: [a, b]\n");
    fx.write("team.json", "\"platform\"");
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        write_fn_pipeline(&fx, &functions, &[("read", "action: context, read: plain")]);
        let out = fx.render(&[
            "xr.yaml",
            "composition.yaml",
            "functions.yaml",
            "-c",
            "--context-files",
            "region=region.yaml;team=team.json",
            "--context-values",
            "plain=hello;count=3",
            "--context-values",
            r#"object={"a": [1, 2]};semi=x\;y"#,
        ]);
        let text = stdout(&out);
        // A YAML scalar as the CLI parses it (a string), read by the step.
        assert!(text.contains("fromContext: hello"), "{runtime}: {text}");
        assert_golden("parity-context-flags.yaml", &text);
    }
    // An entry without `=` is refused as kong refuses it.
    let err = failure(&fx.render(&[
        "xr.yaml",
        "composition.yaml",
        "functions.yaml",
        "--context-values",
        "a=1;oops",
    ]));
    assert!(
        err.contains("expected \"<key>=<value>\" but got \"oops\""),
        "{err}"
    );
}

/// Observed resources of the golden pipeline's XR: `bucket-1` (still
/// desired), `retired` (no longer desired, controlled by the XR: deleted),
/// `adopted` (no longer desired, no controller: left alone).
const OBSERVED: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: demo-bucket-1
  annotations: {crossplane.io/composition-resource-name: bucket-1}
  ownerReferences:
  - {apiVersion: example.org/v1, kind: XBucket, name: demo, uid: 0b7d5c1e-0000-4000-8000-000000000001, controller: true}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: demo-retired
  annotations: {crossplane.io/composition-resource-name: retired}
  ownerReferences:
  - {apiVersion: example.org/v1, kind: XBucket, name: demo, uid: 0b7d5c1e-0000-4000-8000-000000000001, controller: true}
data: {old: 'true'}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: adopted
  annotations: {crossplane.io/composition-resource-name: adopted}
";

#[test]
fn deleted_resources_and_requirements_are_printed_as_crossplanes_renderer_returns_them() {
    let fx = Fixture::new();
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        golden_pipeline(&fx, "fn", &functions);
        fx.write("observed.yaml", OBSERVED);
        let schema_step = steps(
            "fn",
            &[
                ("create", "action: create"),
                ("require-settings", "action: require, name: settings"),
                ("schema", "action: schema, apiVersion: v1, kind: ConfigMap"),
            ],
        );
        fx.write("composition.yaml", &schema_step);
        let out = fx.render(&[
            "xr.yaml",
            "composition.yaml",
            "functions.yaml",
            "-e",
            "required.yaml",
            "-o",
            "observed.yaml",
            "--include-deleted-resources",
            "--include-requirements",
        ]);
        let text = stdout(&out);
        assert!(
            text.contains("kind: DeletedResource") && text.contains("name: demo-retired"),
            "{runtime}: {text}"
        );
        assert!(!text.contains("name: adopted"), "{runtime}: {text}");
        assert_golden("parity-deleted-requirements.yaml", &text);
    }
}

/// A claim of XBucket, bound to no XR yet.
const CLAIM: &str = "apiVersion: example.org/v1
kind: Bucket
metadata:
  name: mine
  namespace: team-a
  labels: {app: web}
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: '{}'
spec:
  count: 1
  compositionRef: {name: buckets}
  writeConnectionSecretToRef: {name: bucket-secret}
";

#[test]
fn a_claim_renders_as_the_xr_crossplane_creates_for_it() {
    let fx = Fixture::new();
    // The Legacy XRD, offering the claim.
    let xrd = xrd_v1_legacy().replace(
        "  names: {kind: XBucket, plural: xbuckets}\n",
        "  names: {kind: XBucket, plural: xbuckets}\n  claimNames: {kind: Bucket, plural: buckets}\n",
    );
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        fx.write("claim.yaml", CLAIM);
        fx.write("functions.yaml", &functions);
        fx.write("xrd.yaml", &xrd);
        fx.write(
            "composition.yaml",
            &steps(
                "fn",
                &[("create", "action: create"), ("observe", "action: observe")],
            ),
        );
        let args = ["claim.yaml", "composition.yaml", "functions.yaml", "-c"];
        // Without the XRD, a namespaced object of another kind than the
        // Composition's is not guessed to be a claim: it names both kinds.
        let err = failure(&fx.render(&args));
        assert!(
            err.contains("the XR input is an example.org/v1 Bucket")
                && err.contains("composes example.org/v1 XBucket")
                && err.contains("give the XRD (--xrd)"),
            "{runtime}: {err}"
        );
        // With the XRD that names the claim, it renders as the XR
        // Crossplane creates for it.
        let mut with_xrd = args.to_vec();
        with_xrd.extend(["--xrd", "xrd.yaml"]);
        let text = stdout(&fx.render(&with_xrd));
        // What the function observed: the XR, with the claim's labels.
        assert!(
            text.contains("crossplane.io/claim-name: mine")
                && text.contains("kind: XBucket")
                && text.contains("compositionUpdatePolicy"),
            "{runtime}: {text}"
        );
        assert_golden("parity-claim.yaml", &text);
    }
    // An XRD offering no such claim says so.
    fx.write("xrd.yaml", &xrd_v1_legacy());
    let err = failure(&fx.render(&[
        "claim.yaml",
        "composition.yaml",
        "functions.yaml",
        "--xrd",
        "xrd.yaml",
    ]));
    assert!(err.contains("names no such claim"), "{err}");
}

#[test]
fn render_help_and_errors_say_what_its_short_flags_mean() {
    let help = xfn_command()
        .args(["render", "-h"])
        .output()
        .expect("spawn xfn");
    let help = stdout(&help);
    assert!(help.contains("-r, --include-function-results"), "{help}");
    assert!(help.contains("-c, --include-context"), "{help}");
    assert!(
        help.contains("      --registry") && !help.contains("-r, --registry"),
        "{help}"
    );
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write("composition.yaml", &steps("fn", &[("a", "action: create")]));
    // `-c DIR` as another command's cache dir: DIR becomes the XR.
    std::fs::create_dir_all(fx.path("cache-dir")).unwrap();
    for args in [
        vec!["-c", "cache-dir", "xr.yaml", "composition.yaml"],
        vec![
            "-c",
            "cache-dir",
            "xr.yaml",
            "composition.yaml",
            "fns",
            "extra",
        ],
    ] {
        let out = fx.render(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("-c is --include-context") && err.contains("--cache-dir"),
            "{args:?}: {err}"
        );
    }
}

/// The processes whose parent chain leads to `root` (its descendants), with
/// their start times (so a reused pid is not taken for one of them).
fn descendants(root: u32) -> Vec<(u32, u64)> {
    let stat_of = |pid: u32| -> Option<(u32, u64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command (which may hold spaces) in parentheses.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        Some((fields[1].parse().ok()?, fields[19].parse().ok()?))
    };
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| stat_of(pid).map(|(ppid, start)| (pid, ppid, start)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            all.iter()
                .filter(|(_, p, _)| *p == parent)
                .map(|(pid, _, _)| *pid),
        );
        i += 1;
    }
    all.iter()
        .filter(|(pid, _, _)| *pid != root && found.contains(pid))
        .map(|(pid, _, start)| (*pid, *start))
        .collect()
}

fn alive(pid: u32, start: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 2..];
            rest.split(' ').nth(19)?.parse::<u64>().ok()
        })
        .is_some_and(|s| s == start)
}

#[test]
fn a_signal_during_a_render_leaves_no_function_server_and_no_bundle() {
    let fx = Fixture::new();
    let serving = function_server_image(&fx.registry, "fn-server:v1", &[]);
    // A server that never listens keeps the render waiting (up to 30 s)
    // while the other already serves.
    let silent = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", "exec sleep 3600", "sh"])
        .push(&fx.registry, "silent:v1")
        .reference;
    fx.write("xr.yaml", XR);
    fx.write(
        "functions.yaml",
        &(function_object("serving", &serving, &[]) + &function_object("silent", &silent, &[])),
    );
    fx.write(
        "composition.yaml",
        &pipeline_composition(
            "  - step: a
    functionRef: {name: serving}
    input: {apiVersion: test.xfn.dev/v1, kind: Input, action: create}
  - step: b
    functionRef: {name: silent}
",
        ),
    );
    // Root, then the rootless sidecar's user without capabilities (setpriv
    // execs xfn: the pid signalled is xfn's).
    for (signal, code, user) in [
        (libc::SIGTERM, 143, None),
        (libc::SIGINT, 130, None),
        (libc::SIGTERM, 143, Some(NONROOT)),
    ] {
        // A cache of its own for the unprivileged user (root's is root's).
        let cache = fx.path(if user.is_some() {
            "cache-nonroot"
        } else {
            "cache"
        });
        let mut command = match user {
            None => xfn_command(),
            Some(uid) => {
                dir_owned_by(&cache, uid);
                unprivileged(uid, Path::new(env!("CARGO_BIN_EXE_xfn")))
            }
        };
        let log_path = fx.path(&format!("render-{code}-{}.log", user.is_some()));
        let mut child = command
            .args(["render", "--timeout", "2m", "--cache-dir"])
            .arg(&cache)
            .args(["xr.yaml", "composition.yaml", "functions.yaml"])
            .current_dir(fx.dir.path())
            .env("RUST_LOG", "xfn::compose=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("spawn xfn");
        let pid = child.id();
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        // Both containers run (two bundles) and the serving one listens
        // (xfn logs "function server started" once it listens), the
        // silent one never.
        let started = Instant::now();
        loop {
            let bundles = std::fs::read_dir(cache.join("run/bundles"))
                .map(|d| d.count())
                .unwrap_or(0);
            let servers = descendants(pid);
            if bundles >= 2 && servers.len() >= 2 && log().contains("function server started") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the servers never started"
            );
            if let Some(status) = child.try_wait().unwrap() {
                panic!("xfn exited early: {status}: {}", log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let before = descendants(pid);
        assert!(!before.is_empty());
        // SAFETY: kill(2) of the child this test spawned.
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
        let status = child.wait().unwrap();
        let log = log();
        assert_eq!(status.code(), Some(code), "{log}");
        assert!(log.contains("the render was stopped by"), "{log}");
        let left: Vec<_> = before.iter().filter(|(p, s)| alive(*p, *s)).collect();
        assert!(left.is_empty(), "processes left: {left:?}\n{log}");
        for sub in ["bundles", "crun", "rootfs"] {
            let dir = cache.join("run").join(sub);
            let entries: Vec<_> = std::fs::read_dir(&dir)
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(entries.is_empty(), "{} left: {entries:?}", dir.display());
        }
    }
}

/// The example function of the README (docs/render.md) (example/function/fn.sh) in an alpha
/// Composition, which passes it `desired: {}`.
#[test]
fn the_readmes_example_function_renders_in_an_alpha_composition() {
    let fx = Fixture::new();
    let script =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("example/function/fn.sh"))
            .unwrap();
    let example = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, script))
        .entrypoint(["/bin/sh", "/fn.sh"])
        .push(&fx.registry, "example/add-bucket:v1")
        .reference;
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &format!(
            "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: buckets-alpha
spec:
  compositeTypeRef: {{apiVersion: example.org/v1, kind: XBucket}}
  functions:
  - name: add-bucket
    type: Container
    container: {{image: {example}}}
"
        ),
    );
    let out = fx.render(&["xr.yaml", "composition.yaml"]);
    let text = stdout(&out);
    assert!(text.contains("name: demo-bucket"), "{text}");
    assert_golden("parity-alpha-example.yaml", &text);
}

#[test]
fn iterations_feed_the_output_back_until_it_is_stable() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        write_fn_pipeline(
            &fx,
            &functions,
            &[("create", "action: create"), ("mirror", "action: mirror")],
        );
        let args = ["xr.yaml", "composition.yaml", "functions.yaml"];
        // Once, as the CLI: nothing is observed yet.
        let once = stdout(&fx.render(&args));
        assert!(once.contains("mirrored: {}"), "{runtime}: {once}");
        // The second render observes the buckets, the third changes nothing.
        let out = fx.render(&[&args[..], &["--iterations", "5"]].concat());
        let text = stdout(&out);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            log.contains("the output is stable") && log.contains("renders=3"),
            "{runtime}: {log}"
        );
        assert!(text.contains("index: \"1\""), "{runtime}: {text}");
        assert_golden("parity-iterations.yaml", &text);
        // Two renders are too few to tell: said so, the second printed.
        let out = fx.render(&[&args[..], &["--iterations", "2"]].concat());
        assert_eq!(stdout(&out), text, "{runtime}");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            log.contains("the output still changed in the last of 2 renders (--iterations 2)"),
            "{runtime}: {log}"
        );
        // No step runs a container per call: no warm pool is made.
        assert!(!log.contains("warm containers"), "{runtime}: {log}");
    }
}

/// Two more XRs of the golden pipeline's type: one without a uid (the
/// render gives it a stable one), one namespaced-free with other fields.
const MORE_XRS: &str = "apiVersion: example.org/v1
kind: XBucket
metadata:
  name: second
spec:
  count: 1
---
apiVersion: example.org/v1
kind: XBucket
metadata:
  name: third
spec:
  count: 3
";

#[test]
fn many_xrs_render_in_one_run_in_input_order_over_servers_started_once() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write("more.yaml", MORE_XRS);
    let (second, third) = MORE_XRS.split_once("---\n").unwrap();
    fx.write("second.yaml", second);
    fx.write("third.yaml", third);
    fx.write("xrs.yaml", &format!("{XR}---\n{second}"));
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        write_fn_pipeline(
            &fx,
            &functions,
            &[
                ("create", "action: create"),
                ("warn", "action: results, warning: almost out of buckets"),
            ],
        );
        let flags = ["composition.yaml", "functions.yaml", "-r", "-c"];
        let single = |xr: &str| stdout(&fx.render(&[&[xr][..], &flags[..]].concat()));
        let each: String = ["xr.yaml", "second.yaml", "third.yaml"]
            .map(single)
            .concat();
        // A multi-document XR file, and more XRs with --xr (a file of
        // several, here): the outputs of one render per XR, in order.
        let out = fx.render(
            &[
                &["xrs.yaml"][..],
                &flags[..],
                &["--xr", "third.yaml", "--debug"],
            ]
            .concat(),
        );
        let text = stdout(&out);
        assert_eq!(text, each, "{runtime}");
        let out2 = fx.render(&[&["xr.yaml"][..], &flags[..], &["--xr", "more.yaml"]].concat());
        assert_eq!(stdout(&out2), each, "{runtime}");
        assert_golden("parity-many-xrs.yaml", &text);
        if runtime == "Docker" {
            // The image's server started once for the three XRs.
            let log = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                log.matches("function server started").count(),
                1,
                "{runtime}: {log}"
            );
            // And as an unprivileged user with no capabilities (with a
            // cache of its own: the image from this fixture's registry).
            let own = Fixture::new();
            for file in ["xr.yaml", "more.yaml", "composition.yaml", "functions.yaml"] {
                own.write(file, &std::fs::read_to_string(fx.path(file)).unwrap());
            }
            let out = own.render_unprivileged(
                &[&["xr.yaml"][..], &flags[..], &["--xr", "more.yaml"]].concat(),
            );
            assert_eq!(stdout(&out), each, "{runtime} as uid 65532");
        }
        // --output json: one object a line per XR, in the same order.
        let out = fx.render(
            &[
                &["xr.yaml"][..],
                &flags[..],
                &["--xr", "more.yaml", "--output", "json"],
            ]
            .concat(),
        );
        let lines: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let names: Vec<&str> = lines
            .iter()
            .map(|o| o["xr"]["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["demo", "second", "third"], "{runtime}");
        for (object, count) in lines.iter().zip([2, 1, 3]) {
            assert_eq!(
                object["resources"].as_array().unwrap().len(),
                count,
                "{runtime}"
            );
            assert!(
                object["results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["message"]
                        .as_str()
                        .unwrap()
                        .ends_with("almost out of buckets")),
                "{runtime}: {object}"
            );
            assert!(object["context"].is_object(), "{runtime}: {object}");
        }
        assert_golden("parity-many-xrs.jsonl", &stdout(&out));
    }
}

#[test]
fn observed_resources_of_many_xrs_go_to_the_xr_that_controls_each() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write("more.yaml", MORE_XRS);
    fx.write("observed.yaml", OBSERVED);
    let python = PythonFunction::start();
    fx.write(
        "functions.yaml",
        &development_function("fn", &python.address),
    );
    fx.write(
        "composition.yaml",
        &steps("fn", &[("create", "action: create")]),
    );
    // Every observed resource is demo's or no XR's: `adopted` has no
    // controller, which a single XR accepts and several refuse.
    let err = failure(&fx.render(&[
        "xr.yaml",
        "composition.yaml",
        "functions.yaml",
        "--xr",
        "more.yaml",
        "-o",
        "observed.yaml",
    ]));
    assert!(
        err.contains("observed resource adopted is controlled by none of the XRs"),
        "{err}"
    );
    // An Operation is rendered alone.
    fx.write("operation.yaml", &operation("Operation", "op"));
    let err = failure(&fx.render(&["operation.yaml", "functions.yaml", "--xr", "more.yaml"]));
    assert!(
        err.contains("an Operation render takes one Operation"),
        "{err}"
    );
    let controlled = OBSERVED.rsplit_once("---\n").unwrap().0;
    fx.write("controlled.yaml", controlled);
    let args = [
        "composition.yaml",
        "functions.yaml",
        "-o",
        "controlled.yaml",
        "--include-deleted-resources",
    ];
    let alone = stdout(&fx.render(&[&["xr.yaml"][..], &args[..]].concat()));
    let text = stdout(&fx.render(&[&["xr.yaml"][..], &args[..], &["--xr", "more.yaml"]].concat()));
    // demo's output is what it is alone (with its deleted resource); the
    // others observe nothing.
    assert!(text.starts_with(&alone), "{text}");
    assert!(alone.contains("kind: DeletedResource"), "{alone}");
    assert_eq!(text.matches("kind: DeletedResource").count(), 1, "{text}");
}

/// A Composition of `kind` (example.org/v1) whose steps create
/// `spec.count` buckets and, when `composes` names a kind, one XR of it
/// (`name: child`, `spec.count: 1`).
fn nested_composition(kind: &str, composes: Option<&str>) -> String {
    let mut text = String::new();
    let mut steps_ = vec![("create".to_string(), "action: create".to_string())];
    if let Some(child) = composes {
        steps_.push((
            "compose".into(),
            format!(
                "action: compose, name: child, resource: {{apiVersion: example.org/v1, \
                 kind: {child}, spec: {{count: 1}}}}"
            ),
        ));
    }
    for (step, input) in &steps_ {
        text += &format!(
            "  - step: {step}
    functionRef: {{name: fn}}
    input: {{apiVersion: test.xfn.dev/v1, kind: Input, {input}}}
"
        );
    }
    pipeline_composition(&text)
        .replace("kind: XBucket", &format!("kind: {kind}"))
        .replace("name: buckets", &format!("name: {}", kind.to_lowercase()))
}

#[test]
fn nested_xrs_render_through_their_compositions_after_the_xr_that_composed_them() {
    let fx = Fixture::new();
    fx.write("xr.yaml", XR);
    fx.write(
        "composition.yaml",
        &nested_composition("XBucket", Some("XNetwork")),
    );
    fx.write(
        "network.yaml",
        &nested_composition("XNetwork", Some("XSubnet")),
    );
    fx.write("subnet.yaml", &nested_composition("XSubnet", None));
    let args = [
        "xr.yaml",
        "composition.yaml",
        "functions.yaml",
        "--nested-composition",
        "network.yaml",
        "--nested-composition",
        "subnet.yaml",
    ];
    for (runtime, functions, _python) in each_runtime(&fx, "fn") {
        fx.write("functions.yaml", &functions);
        // Without the nested Compositions the XNetwork is only composed.
        let flat = stdout(&fx.render(&args[..3]));
        assert_eq!(
            flat.matches("\nkind: XNetwork").count(),
            1,
            "{runtime}: {flat}"
        );
        let text = stdout(&fx.render(&args));
        // The XBucket's output, then the XNetwork's (which it composed,
        // rendered with its own bucket and XSubnet), then the XSubnet's.
        let order: Vec<&str> = text
            .split("---\n")
            .filter_map(|doc| doc.lines().nth(1))
            .filter(|line| line.starts_with("kind: X"))
            .collect();
        assert_eq!(
            order,
            [
                "kind: XBucket",
                "kind: XNetwork",
                "kind: XNetwork",
                "kind: XSubnet",
                "kind: XSubnet"
            ],
            "{runtime}: {text}"
        );
        assert!(text.starts_with(&flat), "{runtime}: {text}");
        assert_golden("parity-nested.yaml", &text);
        let json = stdout(&fx.render(&[&args[..], &["--output", "json"]].concat()));
        assert_eq!(json.lines().count(), 3, "{runtime}: {json}");
    }
    // A Composition composing its own type ends with an error, not a loop.
    fx.write(
        "network.yaml",
        &nested_composition("XNetwork", Some("XNetwork")),
    );
    let err = failure(&fx.render(&args));
    assert!(err.contains("XRs nested 8 deep"), "{err}");
}
