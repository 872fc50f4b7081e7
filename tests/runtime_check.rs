//! The OCI runtime check: `xfn run` and `xfn start` with a runtime that is
//! not new enough crun fail with one clear line naming the version found
//! and the version needed, and the real crun of this host passes.
//!
//! Needs: crun, docker-registry, busybox-static, util-linux (setpriv).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use xfn_testkit::*;

/// A stand-in runtime that reports `version_line` and can run nothing.
fn fake_runtime(dir: &Path, version_line: &str) -> PathBuf {
    let path = dir.join("old-crun");
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho '{version_line}'\necho 'commit: 0'\nexit 0\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

#[test]
fn xfn_run_refuses_an_old_crun_naming_the_version_found_and_needed() {
    let registry = Registry::start();
    let image = echo_image(&registry, "runtime-check:v1");
    let dir = world_traversable_tempdir();
    let runtime = fake_runtime(dir.path(), "crun version 1.4.5");
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    let run = |runtime: &Path| {
        let mut cmd = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")));
        cmd.args(["run", "--cache-dir"])
            .arg(&cache)
            .arg("--runtime")
            .arg(runtime)
            .args([&image, "-"]);
        run_with_input(cmd, FUNCTION_IO.as_bytes())
    };
    let err = failure(&run(&runtime));
    assert!(
        err.contains(&format!(
            "the OCI runtime {} is crun 1.4.5; xfn needs crun 1.8.1 or newer",
            runtime.display()
        )),
        "{err}"
    );
    // The host's crun (Debian bookworm's 1.8.1) passes, on the same cache.
    assert_eq!(stdout(&run(Path::new("crun"))), FUNCTION_IO);
}

#[test]
fn xfn_start_refuses_to_serve_without_crun() {
    let dir = world_traversable_tempdir();
    let runtime = fake_runtime(dir.path(), "runc version 1.1.12");
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    let out = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["start", "--cache-dir"])
        .arg(&cache)
        .args([
            "--address",
            &format!("@xfn-test/runtime-check/{}", std::process::id()),
        ])
        .arg("--runtime")
        .arg(&runtime)
        .arg("--allow-shared-uid")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("is not crun")
            && err.contains("runc version 1.1.12")
            && err.contains("xfn needs crun 1.8.1 or newer"),
        "{err}"
    );
}
