//! xfn as a program: the binary cargo built for this test run
//! ([`xfn_binary`], found at run time, for this crate is built before it),
//! run as an unprivileged user ([`unprivileged`]), fed and checked
//! ([`run_with_input`], [`stdout`], [`failure`]), and the inputs many tests
//! give it ([`FUNCTION_IO`], [`alias_bombs`]).
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The `xfn` binary cargo built for this test run. `cargo test` names it in
/// `CARGO_BIN_EXE_xfn` when it runs a test; a test binary run by hand
/// (`target/<profile>/deps/NAME-HASH`) finds it two levels up, where cargo
/// puts the binaries of that profile.
pub fn xfn_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_xfn") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test
        .parent()
        .and_then(Path::parent)
        .expect("a test binary lives in target/<profile>/deps");
    let xfn = profile_dir.join("xfn");
    assert!(
        xfn.is_file(),
        "no xfn binary at {}: run the tests with cargo test",
        xfn.display()
    );
    xfn
}

/// The repository's root (tests/, example/ and proto/ are below it).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ is in the repository")
}

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

/// A `Command` for the `xfn` binary cargo built for this test run.
pub fn xfn_command() -> Command {
    Command::new(xfn_binary())
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
