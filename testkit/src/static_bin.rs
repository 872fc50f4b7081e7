//! Small static programs for function images, built on demand with the
//! toolchain that builds the tests: a one-file Rust program
//! ([`static_rust_binary`]), and the C probes of `testkit/c/`
//! ([`dial_binary`], [`flood_binary`]).
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the one-file Rust program `source` into `dir/name`, linked
/// statically (glibc, `crt-static`) so it runs in an image without a libc,
/// with the rustc that builds the tests.
pub fn static_rust_binary(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.rs"));
    std::fs::write(&src, source).unwrap();
    let binary = dir.join(name);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let built = Command::new(rustc)
        .args(["-C", "target-feature=+crt-static", "-O", "-o"])
        .arg(&binary)
        .arg(&src)
        .output()
        .expect("rustc (static glibc needs libc6-dev)");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    binary
}

/// `testkit/c/dial.c`, linked statically (so any busybox image can carry
/// it): `dial NAME` connects to the abstract socket `@NAME` and prints
/// `served`, `refused` or `unreachable: …`. Built once per test process.
pub fn dial_binary() -> Vec<u8> {
    static BINARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| static_c_binary("dial")).clone()
}

/// `testkit/c/flood.c`, linked statically: `flood NAME` loops
/// `connect()` to the abstract socket `@NAME` for ever and keeps its counts
/// in `/tmp/flood`. Built once per test process.
pub fn flood_binary() -> Vec<u8> {
    static BINARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| static_c_binary("flood")).clone()
}

/// `testkit/c/NAME.c` built with `cc -static -O2`.
fn static_c_binary(name: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("c/{name}.c"));
    let status = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .expect("run cc (Debian packages gcc and libc6-dev)");
    assert!(status.success(), "cc -static {} failed", source.display());
    std::fs::read(&out).expect("read the built binary")
}
