//! `xfn render` against `crossplane render` itself: crossplane/cli v2.5.0
//! with Crossplane v2.3.4's renderer (`--crossplane-binary`: its
//! `internal render`, no Docker), both built by scripts/peers.sh, on each
//! peer function's own `example/` (the inputs its README gives `crossplane
//! render`). The function runs natively as a gRPC server (`Development`
//! runtime, both renderers calling the same server), and then, for xfn,
//! as its image served rootless (`Docker` runtime): every output must be
//! the CLI's, byte for byte, with and without each of the CLI's output
//! flags. (`--output json` is xfn's only: the CLI has no such flag.)
//! Then function-pythonic's examples (tests/pythonic/) through both, and
//! long strings (go-yaml's folding) with the XR's own conditions.
//!
//! Needs: scripts/peers.sh's peers (a missing one fails the test, naming
//! the script), crun, docker-registry; root; for function-pythonic's
//! examples, scripts/setup.sh's Python root (without it, that test says
//! loudly that it skipped, as tests/render_pythonic.rs does).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use xfn_testkit::peers::{self, PeerFunction};
use xfn_testkit::{xfn_command, FunctionServer, Registry};

/// The CLI's output flags, alone and together.
const FLAG_SETS: &[&[&str]] = &[
    &[],
    &["-x"],
    &["-r"],
    &["--include-function-results"],
    &["--include-context"],
    &["-x", "-r", "--include-context"],
];

/// `-a` flags that make every Function of the example's functions file
/// (each example has one) run as `runtime`.
fn annotations(runtime: &str, value: &str) -> Vec<String> {
    let key = match runtime {
        "Development" => "runtime-development-target",
        _ => "runtime-docker-image",
    };
    vec![
        "-a".into(),
        format!("render.crossplane.io/runtime={runtime}"),
        "-a".into(),
        format!("render.crossplane.io/{key}={value}"),
    ]
}

fn crossplane_render(example: &Path, address: &str, flags: &[&str]) -> Output {
    Command::new(peers::binary("crossplane"))
        .args(["render", "xr.yaml", "composition.yaml", "functions.yaml"])
        .arg("--crossplane-binary")
        .arg(peers::binary("crossplane-core"))
        .args(annotations("Development", address))
        .args(flags)
        .current_dir(example)
        .stdin(Stdio::null())
        .output()
        .expect("run crossplane render")
}

fn xfn_render(example: &Path, cache: &Path, annotations: &[String], flags: &[&str]) -> Output {
    xfn_command()
        .arg("render")
        .arg("--cache-dir")
        .arg(cache)
        .args(["xr.yaml", "composition.yaml", "functions.yaml"])
        .args(annotations)
        .args(flags)
        .current_dir(example)
        .stdin(Stdio::null())
        .output()
        .expect("run xfn render")
}

/// The output of a render that succeeded, or a panic with its stderr.
fn stdout(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Renders `function`'s example with both renderers and every flag set,
/// through both of xfn's runtimes; returns the differences found.
fn compare(function: &PeerFunction) -> Vec<String> {
    let example = function.example();
    let server = FunctionServer::start_command(Command::new(function.binary()));
    let registry = Registry::start();
    let image = function.image(&registry, &format!("{}:peer", function.name));
    let cache = tempfile::tempdir().expect("cache dir");
    let mut differences = Vec::new();
    for flags in FLAG_SETS {
        let what = format!("{} ({}) {flags:?}", function.name, function.version());
        let expected = stdout(
            &format!("crossplane render of {what}"),
            crossplane_render(&example, &server.address, flags),
        );
        assert!(expected.contains("kind: "), "{what}: {expected}");
        for (runtime, target) in [("Development", &server.address), ("Docker", &image)] {
            let actual = stdout(
                &format!("xfn render ({runtime}) of {what}"),
                xfn_render(&example, cache.path(), &annotations(runtime, target), flags),
            );
            if actual != expected {
                differences.push(format!(
                    "{what}, xfn's {runtime} runtime:\n--- crossplane render\n{expected}\n\
                     --- xfn render\n{actual}"
                ));
            }
        }
    }
    differences
}

#[test]
fn function_patch_and_transforms_example_renders_as_crossplane_render_renders_it() {
    let differences = compare(&PeerFunction::get("function-patch-and-transform"));
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// Strings around go-yaml's width of 80, in every scalar style it folds
/// (plain, single- and double-quoted), with double spaces, quotes and
/// multi-byte characters, at several depths.
fn long_strings() -> serde_json::Value {
    let mut strings = serde_json::Map::new();
    for n in 68..92 {
        let a = "a".repeat(n);
        let e = "é".repeat(n);
        let values = [
            format!("{a} b c d e f g h"),
            format!("x: {a} b: c d e f g"),
            format!("\t{a} b c d e f"),
            format!("{a}  b  c   d e f"),
            format!("\t{a}  b  c   d e f"),
            format!("it's {a} don't 'q' b c d"),
            format!("{e} ü 日本 é b c"),
            format!(" {a} trailing b c "),
        ];
        for (i, v) in values.into_iter().enumerate() {
            strings.insert(format!("s{n}-{i}"), serde_json::json!(v));
        }
    }
    let strings = serde_json::Value::Object(strings);
    let list: Vec<serde_json::Value> = strings
        .as_object()
        .into_iter()
        .flat_map(|m| m.values().step_by(7).cloned())
        .collect();
    serde_json::json!({
        "flat": strings,
        "list": list,
        "nested": {"deeper": [{"key": list.clone(), "and": {"more": list}}]},
    })
}

/// The XR carries a generation and conditions of its own too: set over in
/// their places, `Responsive` marked with the generation.
#[test]
fn long_strings_and_the_xrs_own_conditions_print_as_crossplane_render_prints_them() {
    let function = PeerFunction::get("function-patch-and-transform");
    let server = FunctionServer::start_command(Command::new(function.binary()));
    let dir = tempfile::tempdir().expect("a dir");
    let xr = serde_json::json!({
        "apiVersion": "example.org/v1", "kind": "XThing",
        "metadata": {"name": "t", "generation": 3},
        "spec": long_strings(),
        "status": {"conditions": [
            {"type": "Custom", "status": "True", "reason": "Mine", "observedGeneration": 2,
             "lastTransitionTime": "2023-01-01T00:00:00Z"},
            {"type": "Ready", "status": "True", "reason": "Available",
             "lastTransitionTime": "2023-01-01T00:00:00Z"},
            {"type": "Synced", "status": "False", "reason": "ReconcileError", "message": "old"},
        ]},
    });
    std::fs::write(dir.path().join("xr.yaml"), xr.to_string()).expect("write the XR");
    std::fs::write(
        dir.path().join("composition.yaml"),
        "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata: {name: fold}
spec:
  compositeTypeRef: {apiVersion: example.org/v1, kind: XThing}
  mode: Pipeline
  pipeline:
  - step: pt
    functionRef: {name: function-patch-and-transform}
    input:
      apiVersion: pt.fn.crossplane.io/v1beta1
      kind: Resources
      resources:
      - name: cm
        base: {apiVersion: v1, kind: ConfigMap, data: {a: b}}
",
    )
    .expect("write the Composition");
    std::fs::copy(
        function.example().join("functions.yaml"),
        dir.path().join("functions.yaml"),
    )
    .expect("copy the Functions");
    let cache = tempfile::tempdir().expect("cache dir");
    let expected = stdout(
        "crossplane render -x",
        crossplane_render(dir.path(), &server.address, &["-x"]),
    );
    // Not a vacuous comparison: the CLI did fold (`s80-0: a…a b c d e f g
    // h`, its key at column 4, breaks at its first space).
    assert!(
        expected.contains(&format!("s80-0: {}\n      b c d e f g h\n", "a".repeat(80)))
            && expected.contains("observedGeneration: 3\n    reason: WatchCircuitClosed\n"),
        "{expected}"
    );
    let actual = stdout(
        "xfn render -x",
        xfn_render(
            dir.path(),
            cache.path(),
            &annotations("Development", &server.address),
            &["-x"],
        ),
    );
    if actual != expected {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .map_or(0, |n| n + 1);
        panic!(
            "differ from line {line}\n--- crossplane render\n{expected}\n--- xfn render\n{actual}"
        );
    }
}

#[test]
fn a_missing_peer_fails_naming_the_script_that_builds_it() {
    let panic = std::panic::catch_unwind(|| PeerFunction::get("function-nobody-built"))
        .err()
        .expect("a missing peer function must panic");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("scripts/peers.sh"), "{message}");
}

/// function-pythonic's examples (tests/pythonic/) rendered by `crossplane
/// render` and by `xfn render`, both calling function-pythonic 0.6.3's
/// gRPC servers (Development runtime): one server for every example that
/// needs no function flag but `--python-path` (each example's path given to
/// it), one for `--render-unknowns`. Each example with its render.sh's
/// flags, then with `-x -r --include-context` added: the same bytes, save
/// the order of the `Composed resource "X" is not yet ready` events, which
/// is Go's map order in the CLI, new on every run (Crossplane v2.3.4
/// `composition_functions.go:618`, `for name, cd := range desired`; xfn
/// emits them by name): those documents are compared sorted among their
/// places, everything else as bytes.
#[test]
fn function_pythonics_examples_render_as_crossplane_render_renders_them() {
    use crate::render_pythonic as pythonic;
    // A missing peer fails here, naming scripts/peers.sh.
    let (crossplane, core) = (
        peers::binary("crossplane"),
        peers::binary("crossplane-core"),
    );
    let Some(root) = xfn_testkit::python::root(false) else {
        eprintln!(
            "\n*** SKIPPED: no function-pythonic 0.6.3 on Python >= 3.12 at {} \
             (XFN_TEST_PYTHONIC_ROOT): run scripts/setup.sh as root ***\n",
            xfn_testkit::python::ROOT
        );
        return;
    };
    let tmp = tempfile::Builder::new()
        .prefix("xfn-peers-pythonic-")
        .tempdir_in(root.join("tmp"))
        .unwrap();
    pythonic::copy_dir(Path::new(pythonic::EXAMPLES), tmp.path());
    let inside = |p: &Path| format!("/{}", p.strip_prefix(&root).unwrap().display());
    let mut examples = pythonic::walk(tmp.path());
    examples.sort();
    examples.retain(|e| !pythonic::expectation(e).is_some_and(|r| r.starts_with("skip")));
    assert!(examples.len() >= 20, "{examples:?}");

    // Each example's render flags and the server flags it needs.
    let mut python_paths = Vec::new();
    let mut plans = Vec::new();
    for example in &examples {
        let work = tmp.path().join(example);
        let (function, render) = pythonic::split_args(&pythonic::render_args(&work));
        let mut server = Vec::new();
        for flag in function {
            match flag.strip_prefix("--python-path=") {
                Some(path) => python_paths.push(format!("--python-path={}/{path}", inside(&work))),
                None => server.push(flag),
            }
        }
        plans.push((example.clone(), work, server, render));
    }
    let mut servers = std::collections::BTreeMap::new();
    for (_, _, flags, _) in &plans {
        if !servers.contains_key(flags) {
            let all: Vec<String> = python_paths.iter().chain(flags).cloned().collect();
            servers.insert(
                flags.clone(),
                pythonic::serve(&root, &inside(tmp.path()), &all),
            );
        }
    }
    let mut jobs = Vec::new();
    for (example, work, flags, mut render) in plans {
        render.extend(pythonic::functions_and_credentials(
            &work,
            &servers[&flags].1,
        ));
        for extra in [&[][..], &["-x", "-r", "--include-context"][..]] {
            let mut args = render.clone();
            args.extend(extra.iter().map(|s| s.to_string()));
            let label = match extra {
                [] => format!("{example} (its flags)"),
                _ => format!("{example} (its flags {})", extra.join(" ")),
            };
            jobs.push((label, example.clone(), work.clone(), args));
        }
    }

    let cache = tempfile::tempdir().unwrap();
    let queue = std::sync::Mutex::new(jobs.into_iter());
    let results = std::sync::Mutex::new(Vec::new());
    // Three renders at a time: each CLI render is two Go processes.
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| loop {
                let Some((label, example, work, args)) = queue.lock().unwrap().next() else {
                    return;
                };
                let cli = Command::new(&crossplane)
                    .arg("render")
                    .args(&args)
                    .arg("--crossplane-binary")
                    .arg(&core)
                    .current_dir(&work)
                    .stdin(Stdio::null())
                    .output()
                    .expect("run crossplane render");
                let xfn = xfn_command()
                    .arg("render")
                    .arg("--cache-dir")
                    .arg(cache.path())
                    .args(&args)
                    .current_dir(&work)
                    .stdin(Stdio::null())
                    .output()
                    .expect("run xfn render");
                let verdict = verdict(&example, &cli, &xfn);
                results.lock().unwrap().push((label, verdict));
            });
        }
    });
    drop(servers);
    let mut results = results.into_inner().unwrap();
    results.sort();
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for (what, verdict) in results {
        match verdict {
            Ok(how) => table.push(format!("{what}: {how}")),
            Err(why) => {
                table.push(format!("{what}: DIFFER"));
                failures.push(format!("{what}: {why}"));
            }
        }
    }
    eprintln!(
        "crossplane render and xfn render on function-pythonic's examples:\n  {}",
        table.join("\n  ")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// How the two renders of `example` agree, or why they do not.
fn verdict(example: &str, cli: &Output, xfn: &Output) -> Result<&'static str, String> {
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    match (cli.status.success(), xfn.status.success()) {
        (true, true) => {}
        (false, false) if example == "connections" => {
            // Its observed resource is controlled by another kind than the XR.
            let refused = "has a controller ref but is not controlled by the XR";
            return if err(cli).contains(refused) && err(xfn).contains(refused) {
                Ok("both refuse it (invalid observed resources)")
            } else {
                Err(format!(
                    "--- crossplane\n{}\n--- xfn\n{}",
                    err(cli),
                    err(xfn)
                ))
            };
        }
        _ => {
            return Err(format!(
                "crossplane render: {}: {}\nxfn render: {}: {}",
                cli.status,
                err(cli),
                xfn.status,
                err(xfn)
            ))
        }
    }
    let (theirs, ours) = (text(cli), text(xfn));
    if theirs == ours {
        return Ok("the same bytes");
    }
    if not_ready_events_sorted(&theirs) == not_ready_events_sorted(&ours) {
        return Ok("the same bytes, the not-ready events in another order");
    }
    let first = theirs
        .lines()
        .zip(ours.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(theirs.lines().count().min(ours.lines().count()));
    Err(format!(
        "differ from line {}\n--- crossplane render\n{theirs}\n--- xfn render\n{ours}",
        first + 1
    ))
}

/// `text`'s documents, those of the `Composed resource "X" is not yet
/// ready` events sorted among the places they hold.
fn not_ready_events_sorted(text: &str) -> Vec<String> {
    let mut documents: Vec<String> = Vec::new();
    for line in text.lines() {
        if line == "---" || documents.is_empty() {
            documents.push(String::new());
        }
        let last = documents.last_mut().expect("a document");
        last.push_str(line);
        last.push('\n');
    }
    let is_event = |d: &String| {
        d.contains("\nkind: Result\n")
            && d.contains("\nmessage: Composed resource \"")
            && d.contains(" is not yet ready\n")
    };
    let places: Vec<usize> = (0..documents.len())
        .filter(|&i| is_event(&documents[i]))
        .collect();
    let mut events: Vec<String> = places.iter().map(|&i| documents[i].clone()).collect();
    events.sort();
    for (place, event) in places.into_iter().zip(events) {
        documents[place] = event;
    }
    documents
}
