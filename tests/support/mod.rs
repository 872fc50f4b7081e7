//! Shared test harness for xfn's integration tests. Each test binary's root
//! declares it once (`mod support;`); its modules `use crate::support;`.
//! `format`, `layer`, `reexec` and `tree` are the crate `xfn-testkit`
//! (`testkit/`), re-exported here.
//!
//! - [`registry::Registry`]: a real `docker-registry` (Debian package
//!   `docker-registry`) on 127.0.0.1 with a random port and its own storage;
//!   [`registry::Registry::start_with_auth`] adds htpasswd basic auth.
//! - [`registry::hostile::HostileRegistry`]: a tiny registry of our own on
//!   127.0.0.1 that serves images from memory with faults (huge manifests,
//!   blobs longer or shorter than their descriptors, drip-feeding).
//! - [`layer::Layer`]: deterministic layer tarballs (files, dirs, symlinks,
//!   hardlinks, FIFOs, whiteouts, opaque dirs; gzip/zstd/plain);
//!   [`layer::Layer::verbatim`] forges every entry with its names as given
//!   (hostile `../` and absolute paths) for the extractor's tests;
//!   [`layer::Layer::busybox`] is a ready base layer from `/bin/busybox`
//!   (Debian package `busybox-static`).
//! - [`image::ImageBuilder`] / [`image::IndexBuilder`]: config + manifest
//!   (OCI or Docker schema 2) and multi-platform indexes, pushed over plain
//!   HTTP by a tiny client ([`http`]).
//! - [`format::Format`]: OCI or Docker schema 2, and the media types of
//!   each.
//! - [`function_server::function_server_binary`] /
//!   [`function_server::function_server_image`] /
//!   [`function_server::FunctionServer`]: `tests/fixtures/fn_server.rs`, a gRPC
//!   composition function server linked statically, as a binary, a busybox
//!   image, or a running server.
//! - [`hostile`]: layer blobs too big to build in memory (bombs, huge
//!   headers), as streams of forged tar blocks and runs of one byte.
//! - [`tree::snapshot`]: a directory tree's types, contents and metadata,
//!   to compare; [`reexec`]: re-runs one test as an unprivileged user, in
//!   a user or mount namespace of its own.
//! - [`child::ChildGuard`] kills a child when a test ends;
//!   [`child::measure`] runs one and reports its peak memory and the bytes
//!   it wrote.
//! - [`xfn_command`] / [`unprivileged`]: run the built `xfn` binary, also as
//!   an unprivileged user without capabilities via `setpriv`.
//!
//! A function image in three lines:
//!
//! ```ignore
//! let registry = Registry::start();
//! let image = ImageBuilder::new()
//!     .layer(Layer::busybox())
//!     .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
//!     .entrypoint(["/fn.sh"])
//!     .push(&registry, "fn:v1");
//! ```
// Each test crate uses a different part of the harness.
#![allow(dead_code, unused_imports)]

pub mod child;
// Layers, formats, tree snapshots and re-running a test: the crate
// `xfn-testkit` (testkit/), which the unit tests in src/ use too.
pub use xfn_testkit::{format, layer, reexec, tree};
pub mod function_server;
pub mod fuzz;
pub mod hostile;
pub mod http;
pub mod image;
pub mod registry;
pub mod render;
pub mod tls;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use format::Format;
pub use function_server::{function_server_binary, function_server_image, FunctionServer};
pub use image::{foreign_arch, host_arch, ImageBuilder, IndexBuilder, PushedImage};
pub use layer::{pseudo_random_bytes, sha256_digest, Compression, Layer};
pub use registry::{non_loopback_ip, Registry, RegistryConfig};

/// A FunctionIO, as Crossplane's runner sends it: the input `xfn start`
/// takes in a call and `xfn run` on stdin (both refuse any other,
/// `xfn::sidecar::validate::check_function_io`). A test whose function
/// ignores its input gives it this; one that needs runs told apart appends
/// a comment (`# run 3`).
pub const FUNCTION_IO: &str = "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved:\n  composite:\n    resource: {}\n";

/// The YAML alias bombs of issue 31 (as src/nesting.rs's unit tests build
/// them), each a one-line flow mapping that fits wherever a value does:
/// 1.9 KB of wide aliases (250 copies of 100 copies of 400 items), one
/// 500 KB list referenced 1,000 times, a nested billion laughs.
pub fn alias_bombs() -> [(&'static str, String); 3] {
    let wide = format!(
        "{{a: &a [{}], b: &b [{}], c: [{}]}}",
        ["x"; 400].join(","),
        ["*a"; 100].join(","),
        ["*b"; 250].join(",")
    );
    let item = "y".repeat(499);
    let listed = format!(
        "{{a: &a [{}], b: [{}]}}",
        vec![item.as_str(); 1000].join(","),
        ["*a"; 1000].join(",")
    );
    let mut levels = vec![format!("l0: &l0 [{}]", ["lol"; 10].join(","))];
    for level in 1..9 {
        let prev = format!("*l{}", level - 1);
        levels.push(format!(
            "l{level}: &l{level} [{}]",
            [prev.as_str(); 10].join(",")
        ));
    }
    let laughs = format!("{{{}}}", levels.join(", "));
    [("wide", wide), ("listed", listed), ("laughs", laughs)]
}

/// The uid/gid of the unprivileged user tests run things as (distroless `nonroot`).
pub const NONROOT: u32 = 65532;

/// The peak resident memory (`VmHWM`) of `pid`, in bytes: what an attack
/// cost a daemon is the growth of this across it.
pub fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib << 10
}

/// A `Command` for the `xfn` binary cargo built for this test run.
pub fn xfn_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xfn"))
}

/// Wraps `program` so it runs as `uid:gid` with no capabilities at all and
/// no supplementary groups (`setpriv`, Debian package `util-linux`): the
/// realistic rootless sidecar. `HOME` is cleared so nothing of root's leaks.
pub fn unprivileged(uid: u32, program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("--inh-caps=-all")
        .arg("--bounding-set=-all")
        .arg("--")
        .arg(program)
        .env_remove("HOME");
    cmd
}

/// The pids of the processes whose command line (arguments joined by
/// spaces) passes `test`, as the host sees them: a test's view of what its
/// functions run, and of what they left.
pub fn processes_where(test: impl Fn(&str) -> bool) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            test(
                String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .trim_end(),
            )
            .then_some(pid)
        })
        .collect()
}

/// The pid of a process whose command line passes `test` (see
/// [`processes_where`]).
pub fn process_where(test: impl Fn(&str) -> bool) -> Option<u32> {
    processes_where(test).first().copied()
}

/// Creates `path` (and parents) owned by `uid:gid`, for an unprivileged
/// user's cache dir. Panics unless run as root, which it needs.
pub fn dir_owned_by(path: &Path, uid: u32) {
    std::fs::create_dir_all(path).expect("create dir");
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown (tests run as root)");
}

/// A fresh temp dir whose parents are traversable by any user (mode 0755),
/// so an unprivileged process can use a subdirectory of it.
pub fn world_traversable_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("xfn-test-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod temp dir");
    dir
}

/// Runs `cmd` with `input` on stdin and collects its output.
pub fn run_with_input(mut cmd: Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // xfn may refuse its flags and exit before it reads its input: the
    // pipe is then closed, and the refusal is what the caller checks.
    if let Err(err) = child.stdin.take().unwrap().write_all(input) {
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
    }
    child.wait_with_output().unwrap()
}

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

/// The stdout of an `xfn` command that must have succeeded (its status and
/// stderr in the panic otherwise).
pub fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "xfn failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("xfn wrote UTF-8")
}

/// The stderr of an `xfn` command that must have failed (its stdout in the
/// panic otherwise).
pub fn failure(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "xfn should have failed; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `tests/support/dial.c`, linked statically (so any busybox image can carry
/// it): `dial NAME` connects to the abstract socket `@NAME` and prints
/// `served`, `refused` or `unreachable: …`. Built once per test process.
pub fn dial_binary() -> Vec<u8> {
    static BINARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| static_c_binary("dial")).clone()
}

/// `tests/support/flood.c`, linked statically: `flood NAME` loops
/// `connect()` to the abstract socket `@NAME` for ever and keeps its counts
/// in `/tmp/flood`. Built once per test process.
pub fn flood_binary() -> Vec<u8> {
    static BINARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| static_c_binary("flood")).clone()
}

/// `tests/support/NAME.c` built with `cc -static -O2`.
fn static_c_binary(name: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/support/{name}.c"));
    let status = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .expect("run cc (Debian packages gcc and libc6-dev)");
    assert!(status.success(), "cc -static {} failed", source.display());
    std::fs::read(&out).expect("read the built binary")
}
