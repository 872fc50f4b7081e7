//! Re-running one test of this test binary in another setting, as the
//! extractor and rootfs tests need: as uid 65532 without capabilities in a
//! user + mount namespace of its own ([`run_unprivileged`]), without any
//! namespace ([`run_without_privilege`]), or as root in a private mount
//! namespace ([`run_in_mount_namespace`]); the child knows it is one by an
//! environment variable. A test is named as libtest lists it (the re-run
//! selects it with `--exact`): its module path without the binary's name,
//! in an integration test its file's and function's name
//! (`extract_layers::…`), in the crate's unit tests `rootfs::tests::…`.
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

/// This test binary at a path uid 65532 can reach (the checkout may sit
/// under a private directory such as /root): a hardlink, or a copy, in a
/// fresh world-readable temp dir, removed when the guard drops.
fn reachable_exe() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe().expect("current exe");
    let dir = tempfile::Builder::new()
        .prefix("xfn-test-exe-")
        .tempdir_in("/tmp")
        .expect("temp dir in /tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("test-binary");
    if std::fs::hard_link(&exe, &copy).is_err() {
        std::fs::copy(&exe, &copy).expect("copy of the test binary");
    }
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, copy)
}

/// Whether this process is already the re-executed unprivileged copy.
pub fn in_unprivileged_child() -> bool {
    std::env::var_os("XFN_TEST_UNPRIV_CHILD").is_some()
}

/// Re-runs the test `name` of this test binary as uid/gid 65532 with no
/// capabilities, inside a new user namespace (mapped to root) and mount
/// namespace (`setpriv` + `unshare -r -m`, util-linux), and panics unless it
/// passes. The child sees `XFN_TEST_UNPRIV_CHILD`.
pub fn run_unprivileged(name: &str) {
    let (_guard, exe) = reachable_exe();
    let mut args: Vec<OsString> = [
        "--reuid=65532",
        "--regid=65532",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push(exe.into_os_string());
    for a in [name, "--exact", "--nocapture", "--test-threads=1"] {
        args.push(a.into());
    }
    let out = Command::new("setpriv")
        .args(&args)
        .env("XFN_TEST_UNPRIV_CHILD", "1")
        .current_dir("/")
        // The child needs a scratch dir it may write to.
        .env("TMPDIR", "/tmp")
        .output()
        .expect("setpriv (util-linux) must be installed");
    passed("unprivileged", name, &out);
}

/// Re-runs the test `name` of this test binary as root in a new, private
/// mount namespace (`unshare --mount`), so mounts it leaves on a failure die
/// with it, and panics unless it passes. The child sees
/// `XFN_TEST_MOUNTNS_CHILD`.
pub fn run_in_mount_namespace(name: &str) {
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("XFN_TEST_MOUNTNS_CHILD", "1")
        .output()
        .expect("unshare (util-linux) must be installed");
    passed("mount-namespace", name, &out);
}

/// Whether this process is the copy re-executed in a private mount namespace.
pub fn in_mount_namespace_child() -> bool {
    std::env::var_os("XFN_TEST_MOUNTNS_CHILD").is_some()
}

/// Re-runs the test `name` as uid/gid 65532 with no capabilities and no
/// namespace of its own (`setpriv` only), and panics unless it passes. The
/// child sees `XFN_TEST_NOPRIV_CHILD`.
pub fn run_without_privilege(name: &str) {
    let (_guard, exe) = reachable_exe();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65532",
            "--regid=65532",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("XFN_TEST_NOPRIV_CHILD", "1")
        .current_dir("/")
        .env("TMPDIR", "/tmp")
        .output()
        .expect("setpriv (util-linux) must be installed");
    passed("unprivileged", name, &out);
}

/// Whether this process is the copy re-executed by [`run_without_privilege`].
pub fn in_no_privilege_child() -> bool {
    std::env::var_os("XFN_TEST_NOPRIV_CHILD").is_some()
}

/// Panics unless the re-run `name` (`what` run) passed its one test.
fn passed(what: &str, name: &str, out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{what} run of {name} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

/// Whether anything is mounted at or under `path` (per /proc/self/mountinfo).
pub fn mounted_under(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.as_os_str().as_bytes();
    info.lines().any(|l| {
        let mp = l.split(' ').nth(4).unwrap_or("");
        let mp = mp.as_bytes();
        mp == p || (mp.starts_with(p) && mp.get(p.len()) == Some(&b'/'))
    })
}
