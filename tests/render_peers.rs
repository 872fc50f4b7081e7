//! `xfn render` against `crossplane render` itself: crossplane/cli v2.5.0
//! with Crossplane v2.3.4's renderer (`--crossplane-binary`: its
//! `internal render`, no Docker), both built by scripts/peers.sh, on each
//! peer function's own `example/` (the inputs its README gives `crossplane
//! render`). The function runs natively as a gRPC server (`Development`
//! runtime, both renderers calling the same server), and then, for xfn,
//! as its image served rootless (`Docker` runtime): every output must be
//! the CLI's, byte for byte, with and without each of the CLI's output
//! flags. (`--output json` is xfn's only: the CLI has no such flag.)
//!
//! Needs: scripts/peers.sh's peers (a missing one fails the test, naming
//! the script), crun, docker-registry; root.

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

#[test]
fn a_missing_peer_fails_naming_the_script_that_builds_it() {
    let panic = std::panic::catch_unwind(|| PeerFunction::get("function-nobody-built"))
        .err()
        .expect("a missing peer function must panic");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("scripts/peers.sh"), "{message}");
}
