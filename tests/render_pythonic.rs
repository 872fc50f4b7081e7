//! `xfn render` against a renderer nobody here wrote: function-pythonic
//! 0.6.3's own `function-pythonic render`, on the examples of its repository
//! (tests/pythonic/, with its licence). Each example is rendered by the
//! peer, and by `xfn render` calling the same function-pythonic served by
//! `function-pythonic grpc --insecure` (Development runtime), with the flags
//! of the example's render.sh; both outputs are compared after normalising
//! what renderers may differ in (docs/render.md lists each rule and why).
//!
//! Needs: function-pythonic 0.6.3 on Python >= 3.12, which Debian bookworm
//! lacks: scripts/setup.sh builds a Debian trixie root with python3 and the
//! wheels at `xfn_testkit::python::ROOT` (or `XFN_TEST_PYTHONIC_ROOT`), run by chroot
//! (root). Without it the test says loudly that it skipped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xfn_testkit::python::ROOT as PYTHONIC_ROOT;
use xfn_testkit::xfn_command;

pub(crate) const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pythonic/examples");

/// What is expected of each example other than agreement.
pub(crate) fn expectation(example: &str) -> Option<&'static str> {
    match example {
        "import-existing-vpc" => Some(
            "skip: needs AWS (its composition imports aiobotocore and describes EC2 VPCs \
             with AWS credentials)",
        ),
        "connections" => Some(
            "refused: its observed resource is controlled by another kind than the XR; \
             xfn refuses it as crossplane render's CheckObservedResources does",
        ),
        "function-go-templating/functions/getComposedResource" => Some(
            "differ: its observed resource has no metadata.name; Crossplane skips a \
             nameless reference (composition_functions.go:795), so xfn does not observe it \
             and the function drops the resource whose field it cannot know",
        ),
        _ => None,
    }
}

/// A shell command run in `dir` (inside the root) by the root's python3.
pub(crate) fn chroot(root: &Path, dir: &str, command: &str) -> Command {
    let mut c = Command::new("chroot");
    c.arg(root).args([
        "/bin/sh",
        "-c",
        &format!("cd {dir} && exec env PYTHONPATH=/opt/function-pythonic {command}"),
    ]);
    c
}

/// The render.sh's `function-pythonic render` arguments (its first
/// uncommented one, continuation lines joined).
pub(crate) fn render_args(example: &Path) -> Vec<String> {
    let script = std::fs::read_to_string(example.join("render.sh")).unwrap();
    let joined: String = script
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.trim_end().trim_end_matches('\\'))
        .collect::<Vec<_>>()
        .join(" ");
    let at = joined
        .find("function-pythonic render")
        .unwrap_or_else(|| panic!("{}: no render command", example.display()));
    joined[at + "function-pythonic render".len()..]
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The function's own flags (for its server) and the rest (for xfn), the
/// peer's prefix-matched singular flags spelt out.
pub(crate) fn split_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    let mut function = Vec::new();
    let mut render = Vec::new();
    for arg in args {
        if arg.starts_with("--python-path")
            || arg == "--render-unknowns"
            || arg == "--crossplane-v1"
        {
            function.push(arg.clone());
        } else if arg == "--include-connection-xr" || arg == "--debug" {
            // The peer's own: a Connection object (dropped below), logs.
        } else if arg == "--observed-resource" || arg == "--required-resource" {
            render.push(format!("{arg}s"));
        } else {
            render.push(arg.clone());
        }
    }
    (function, render)
}

/// function-pythonic's gRPC server, killed on drop.
pub(crate) struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn serve(root: &Path, dir: &str, flags: &[String]) -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let child = chroot(
        root,
        dir,
        &format!(
            "python3 -m crossplane.pythonic grpc --insecure --address {address} {}",
            flags.join(" ")
        ),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start function-pythonic grpc");
    let mut server = Server(child);
    // A bound against a server that never listens, not a timing check.
    let started = Instant::now();
    while std::net::TcpStream::connect(&address).is_err() {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!("function-pythonic grpc exited: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "function-pythonic grpc never listened on {address}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, address)
}

/// function-pythonic's server for the example at `work` (`inside` the
/// root), with the function's flags of its render.sh `args`, named in a
/// Functions file `functions-xfn.yaml` written there (Development runtime);
/// and the render's arguments (those Crossplane's `render` and xfn's share),
/// that file last.
fn serve_for_render(
    root: &Path,
    work: &Path,
    inside: &str,
    args: &[String],
) -> (Server, Vec<String>) {
    let (function_flags, mut render) = split_args(args);
    let (server, address) = serve(root, inside, &function_flags);
    render.extend(functions_and_credentials(work, &address));
    (server, render)
}

/// A Functions file `functions-xfn.yaml` written in the example at `work`
/// naming function-pythonic at `address` (Development runtime), and the
/// render's arguments it adds: that file, and `--function-credentials`
/// when the Composition takes credentials (the peer takes a step's
/// credentials from the required resources; crossplane render from
/// --function-credentials: the same file).
pub(crate) fn functions_and_credentials(work: &Path, address: &str) -> Vec<String> {
    std::fs::write(
        work.join("functions-xfn.yaml"),
        format!(
            "apiVersion: pkg.crossplane.io/v1
kind: Function
metadata:
  name: function-pythonic
  annotations:
    render.crossplane.io/runtime: Development
    render.crossplane.io/runtime-development-target: {address}
spec:
  package: xpkg.crossplane.io/crossplane-contrib/function-pythonic:v0.6.3
"
        ),
    )
    .unwrap();
    let mut render = vec!["functions-xfn.yaml".to_string()];
    let composition = std::fs::read_to_string(work.join("composition.yaml")).unwrap();
    if composition.contains("credentials:") {
        render.push("--function-credentials=resources.yaml".into());
    }
    render
}

/// The YAML documents of `text`, the peer's log lines left out.
fn documents(text: &str) -> Vec<Value> {
    let is_log = |l: &str| {
        let b = l.as_bytes();
        b.len() > 12 && b[0] == b'[' && b[1..5].iter().all(u8::is_ascii_digit) && b[5] == b'-'
    };
    let yaml: String = text
        .lines()
        .filter(|l| !is_log(l))
        .map(|l| format!("{l}\n"))
        .collect();
    yaml_serde::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("a YAML document"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// What renderers may differ in, made equal (docs/render.md, "The
/// differential test").
fn normalise(docs: Vec<Value>, peer: bool) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, mut d) in docs.into_iter().enumerate() {
        let kind = d["kind"].as_str().unwrap_or_default().to_string();
        let render_kind = d["apiVersion"] == json!("render.crossplane.io/v1beta1");
        if render_kind && kind == "Connection" {
            continue;
        }
        if render_kind && kind == "Result" {
            if peer {
                let severity = match d["severity"].as_str() {
                    Some("SEVERITY_WARNING") => "Warning",
                    Some("SEVERITY_NORMAL") => "Normal",
                    other => panic!("peer result severity {other:?}"),
                };
                let reason = match d["reason"].as_str() {
                    None | Some("") => "ComposeResources",
                    Some(r) => r,
                };
                let step = d["step"].as_str().unwrap_or_default();
                let message = d["message"].as_str().unwrap_or_default();
                d = json!({
                    "apiVersion": "render.crossplane.io/v1beta1", "kind": "Result",
                    "severity": severity, "reason": reason,
                    "message": format!("Pipeline step {step:?}: {message}"),
                });
            } else if !d["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Pipeline step "))
            {
                continue; // Crossplane's own events: the peer has none.
            }
            out.push(d);
            continue;
        }
        if render_kind && kind == "Context" {
            if let Some(values) = d.as_object_mut().and_then(|o| o.remove("values")) {
                d["fields"] = values;
            }
            // function-pythonic keys its memory by the step name its own
            // renderer writes into the input; Crossplane tells no step name.
            if let Some(memory) = d["fields"]["_pythonic"].as_object_mut() {
                let values: Vec<Value> = std::mem::take(memory).into_values().collect();
                for (n, v) in values.into_iter().enumerate() {
                    memory.insert(format!("<step {n}>"), v);
                }
            }
            out.push(d);
            continue;
        }
        if let Some(o) = d.as_object_mut() {
            if peer {
                o.remove("ready");
            }
        }
        let composed =
            d["metadata"]["annotations"]["crossplane.io/composition-resource-name"].is_string();
        if let Some(md) = d["metadata"].as_object_mut() {
            if composed {
                md.remove("name");
                md.remove("generateName");
            }
            if let Some(labels) = md.get_mut("labels").and_then(Value::as_object_mut) {
                labels.retain(|k, _| !k.starts_with("crossplane.io/"));
                if labels.is_empty() {
                    md.remove("labels");
                }
            }
            if let Some(refs) = md.get_mut("ownerReferences").and_then(Value::as_array_mut) {
                for r in refs {
                    r["uid"] = json!("<uid>");
                }
            }
        }
        if i == 0 {
            // The XR: its conditions and references are Crossplane's.
            if let Some(o) = d.as_object_mut() {
                if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
                    status.remove("conditions");
                    if status.is_empty() {
                        o.remove("status");
                    }
                }
                if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("resourceRefs");
                    if let Some(c) = spec.get_mut("crossplane").and_then(Value::as_object_mut) {
                        c.remove("resourceRefs");
                        if c.is_empty() {
                            spec.remove("crossplane");
                        }
                    }
                    if spec.is_empty() {
                        o.remove("spec");
                    }
                }
            }
        }
        out.push(d);
    }
    out
}

#[test]
fn function_pythonics_examples_render_as_function_pythonics_own_renderer_renders_them() {
    let Some(root) = xfn_testkit::python::root(false) else {
        eprintln!(
            "\n*** SKIPPED: no function-pythonic 0.6.3 on Python >= 3.12 at {PYTHONIC_ROOT} \
             (XFN_TEST_PYTHONIC_ROOT): run scripts/setup.sh as root ***\n"
        );
        return;
    };
    let mut examples: Vec<String> = walk(Path::new(EXAMPLES));
    examples.sort();
    assert!(examples.len() >= 20, "{examples:?}");
    let tmp = tempfile::Builder::new()
        .prefix("xfn-pythonic-")
        .tempdir_in(root.join("tmp"))
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for example in &examples {
        let expected = expectation(example);
        if let Some(reason) = expected.filter(|r| r.starts_with("skip")) {
            table.push(format!("{example}: {reason}"));
            continue;
        }
        let work = tmp.path().join(example);
        copy_dir(&Path::new(EXAMPLES).join(example), &work);
        let inside = format!("/{}", work.strip_prefix(&root).unwrap().display());
        let args = render_args(&work);
        let peer = chroot(
            &root,
            &inside,
            &format!("python3 -m crossplane.pythonic render {}", args.join(" ")),
        )
        .output()
        .unwrap();
        assert!(
            peer.status.success(),
            "{example}: function-pythonic render: {}",
            String::from_utf8_lossy(&peer.stderr)
        );
        let (_server, render) = serve_for_render(&root, &work, &inside, &args);
        let xfn = xfn_command()
            .arg("render")
            .arg("--cache-dir")
            .arg(cache.path())
            .args(&render)
            .current_dir(&work)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&xfn.stderr);
        if let Some(reason) = expected.filter(|r| r.starts_with("refused")) {
            if xfn.status.success() || !stderr.contains("is not controlled by the XR") {
                failures.push(format!(
                    "{example}: expected to be refused ({reason}): {stderr}"
                ));
            }
            table.push(format!("{example}: {reason}"));
            continue;
        }
        if !xfn.status.success() {
            failures.push(format!("{example}: xfn render failed: {stderr}"));
            table.push(format!("{example}: FAILED"));
            continue;
        }
        let ours_text = String::from_utf8_lossy(&xfn.stdout);
        // What a YAML 1.1 reader (PyYAML, as the comparison read
        // it) makes of xfn's output is what a YAML 1.2 one makes of it.
        if pyyaml(&ours_text) != Value::Array(documents(&ours_text)) {
            failures.push(format!(
                "{example}: PyYAML reads xfn's output otherwise: {ours_text}"
            ));
        }
        let theirs = normalise(documents(&String::from_utf8_lossy(&peer.stdout)), true);
        let ours = normalise(documents(&ours_text), false);
        if let Some(reason) = expected.filter(|r| r.starts_with("differ")) {
            if theirs == ours {
                failures.push(format!("{example}: expected to differ ({reason})"));
            }
            table.push(format!("{example}: {reason}"));
        } else if theirs == ours {
            table.push(format!("{example}: agree"));
        } else {
            table.push(format!("{example}: DIFFER"));
            failures.push(format!(
                "{example}: the renders differ\n--- function-pythonic render\n{}\n--- xfn render\n{}",
                yaml_serde::to_string(&theirs).unwrap(),
                yaml_serde::to_string(&ours).unwrap()
            ));
        }
    }
    eprintln!(
        "function-pythonic 0.6.3 examples:\n  {}",
        table.join("\n  ")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `text` as the host's PyYAML reads it (scripts/setup.sh installs it),
/// as JSON; a value JSON has no type for (a timestamp) as `<type value>`.
fn pyyaml(text: &str) -> Value {
    use std::io::Write;
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = [d for d in yaml.safe_load_all(sys.stdin) if d is not None]\n\
             print(json.dumps(docs, default=lambda o: f'<{type(o).__name__} {o}>'))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with PyYAML (scripts/setup.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python3 -c 'import yaml' failed: scripts/setup.sh"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The example dirs (those with a render.sh) under `dir`, relative to it.
pub(crate) fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.join("render.sh").is_file() {
            found.push(d.strip_prefix(dir).unwrap().display().to_string());
        }
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
