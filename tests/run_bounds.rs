//! Functions are bounded without cgroups (this machine has none to
//! delegate): every test runs as root, which maps a 65536-id range, and as
//! uid 65532 without capabilities, which maps its own id.
//!
//! - `/tmp` and the rootfs (overlay and copy) are sized tmpfs mounts: a
//!   function filling them gets ENOSPC, in bytes and in files; the defaults
//!   are the documented ones.
//! - No core files, a bounded number of open files.
//! - Processes: a fork bomb stops at `--pids-limit` (RLIMIT_NPROC, counted
//!   per run: `src/sandbox/nproc.rs`) while a neighbour of the same uid
//!   forks freely, and nothing of it outlives its run (neighbours in one
//!   daemon: `run_kernel_counts.rs`).
//! - The seccomp allow-list: refused syscalls fail with EPERM, syscalls it
//!   does not name with ENOSYS; busybox, a static Rust binary and Python
//!   (the host's Debian python3, copied into an image) run.
//!
//! Needs: crun, docker-registry, busybox-static, util-linux (setpriv),
//! libc6-dev (a static test program), python3 at /usr/bin/python3 (Debian's,
//! which scripts/setup.sh installs); root.

use std::process::{Command, Output};

use xfn_testkit::*;

/// Who runs xfn.
#[derive(Debug, Clone, Copy)]
enum Who {
    /// Root: a 65536-id range is mapped.
    Root,
    /// uid 65532 without capabilities: its own id is mapped.
    Nonroot,
}

const EVERYONE: [Who; 2] = [Who::Root, Who::Nonroot];

struct Fixture {
    registry: Registry,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            registry: Registry::start(),
            dir: world_traversable_tempdir(),
        }
    }

    /// busybox with `script` as its entrypoint (`/bin/sh -c`).
    fn script_image(&self, name: &str, script: &str) -> String {
        script_image(&self.registry, name, script)
    }

    /// `xfn run FLAGS IMAGE -` as `who`, each with a cache of its own, a
    /// FunctionIO on its stdin.
    fn run(&self, who: Who, image: &str, flags: &[&str]) -> Output {
        run_with_input(self.command(who, image, flags), FUNCTION_IO.as_bytes())
    }

    /// The command [`Fixture::run`] runs.
    fn command(&self, who: Who, image: &str, flags: &[&str]) -> Command {
        let (mut cmd, cache) = match who {
            Who::Root => (xfn_command(), self.dir.path().join("cache-root")),
            Who::Nonroot => {
                let cache = self.dir.path().join("cache-nonroot");
                dir_owned_by(&cache, NONROOT);
                (
                    unprivileged(NONROOT, std::path::Path::new(env!("CARGO_BIN_EXE_xfn"))),
                    cache,
                )
            }
        };
        cmd.arg("run").arg("--cache-dir").arg(&cache);
        cmd.args(flags).arg(image).arg("-");
        cmd
    }
}

/// Writes 64 MiB to `path` with dd, then reports dd's error and the bytes
/// that landed: `<error line>\n<bytes>`.
fn fill(path: &str) -> String {
    format!(
        "dd if=/dev/zero of={path} bs=1M count=64 2>&1 >/dev/null | grep -o 'No space left on device'; \
         stat -c %s {path}"
    )
}

/// Creates empty files in `dir` until that fails; reports how many.
fn fill_inodes(dir: &str) -> String {
    format!("mkdir -p {dir}; i=0; while touch {dir}/f$i 2>/dev/null; do i=$((i+1)); done; echo $i")
}

#[test]
fn a_function_filling_tmp_gets_enospc_at_the_tmp_size() {
    let fx = Fixture::new();
    let image = fx.script_image(
        "fill-tmp:v1",
        &format!(
            "stat -f -c %T /tmp; {}; {}",
            fill("/tmp/big"),
            fill_inodes("/tmp/many")
        ),
    );
    for who in EVERYONE {
        let out = stdout(&fx.run(who, &image, &["--tmp-size", "8Mi"]));
        // A tmpfs (memory), never the disk; full at 8 MiB; and at 1024
        // inodes (the root dir, /tmp/big and /tmp/many take three), however
        // small the files.
        assert_eq!(
            out,
            format!("tmpfs\nNo space left on device\n{}\n1021\n", 8 << 20),
            "{who:?}"
        );
    }
}

#[test]
fn a_function_filling_its_rootfs_gets_enospc_at_the_rootfs_size_in_both_modes() {
    let fx = Fixture::new();
    let image = fx.script_image("fill-root:v1", &fill("/big"));
    for who in EVERYONE {
        for mode in ["overlay", "copy"] {
            let out = stdout(&fx.run(who, &image, &["--rootfs", mode, "--rootfs-size", "8Mi"]));
            let (error, bytes) = out.split_once('\n').unwrap();
            assert_eq!(error, "No space left on device", "{who:?} {mode}: {out}");
            // The overlay's work dir takes a few blocks of the 8 MiB.
            let bytes: u64 = bytes.trim().parse().unwrap();
            assert!(
                bytes <= 8 << 20 && bytes > 7 << 20,
                "{who:?} {mode}: {bytes} bytes"
            );
        }
    }
}

#[test]
fn by_default_tmp_holds_128_mib_and_the_rootfs_takes_256_mib_of_writes() {
    let fx = Fixture::new();
    // df -k: the size of /tmp; the space left on / (overlay: all of its
    // upper tmpfs, as nothing is written yet).
    let image = fx.script_image(
        "defaults:v1",
        "df -k /tmp | tail -1 | awk '{print $2}'; df -k / | tail -1 | awk '{print $4}'",
    );
    for who in EVERYONE {
        let out = stdout(&fx.run(who, &image, &["--rootfs", "overlay"]));
        assert_eq!(out, "131072\n262144\n", "{who:?}");
    }
}

#[test]
fn functions_may_not_write_core_files_and_have_bounded_files() {
    let fx = Fixture::new();
    let image = fx.script_image(
        "limits:v1",
        "grep -E '^Max (core file size|open files) ' /proc/self/limits | tr -s ' '",
    );
    for who in EVERYONE {
        let out = stdout(&fx.run(who, &image, &[]));
        let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
        assert_eq!(lines[0], "Max core file size 0 0 bytes", "{who:?}");
        assert!(lines[1].starts_with("Max open files "), "{who:?}: {out}");
    }
}

/// A fork bomb that cannot run away if the bound is missing: forks
/// sleepers (`sleep 3631`) until fork fails, at most 2048, from a subshell,
/// which busybox sh leaves with "can't fork: …" on stderr; then the
/// function's shell becomes `sleep 3632` (exec: no fork) and holds every
/// process the bomb got.
const FORK_BOMB: &str =
    "(i=0; while [ $i -lt 2048 ]; do sleep 3631 </dev/null >/dev/null 2>&1 & i=$((i+1)); done; \
                          echo forked 2048 times >&2); exec sleep 3632";

/// A function's first process, seen from the host: killed (SIGKILL, which
/// ends its PID namespace) when dropped, also when the test fails, so that
/// no bomb outlives its test.
struct KilledOnDrop(u32);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[test]
fn a_fork_bomb_stops_at_the_pids_limit_while_a_neighbour_of_the_same_uid_forks_freely() {
    let fx = Fixture::new();
    let bomb = fx.script_image("fork-bomb:v1", FORK_BOMB);
    // 200 processes at once, waited for.
    let neighbour = fx.script_image(
        "neighbour:v1",
        "for i in $(seq 200); do sleep 1 & done; wait && echo forked 200",
    );
    let pids_limit = xfn::runner::DEFAULT_PIDS_LIMIT as usize;
    for who in EVERYONE {
        // The default --pids-limit; no cgroup enforces it on this machine
        // (xfn says limits are not enforced), so RLIMIT_NPROC is what holds.
        let mut running = xfn_testkit::child::ChildGuard::spawn_with_input(
            &mut fx.command(who, &bomb, &["--timeout", "5m"]),
            FUNCTION_IO.as_bytes(),
        );
        let holder = loop {
            if let Some(pid) = process_where(|cmdline| cmdline == "sleep 3632") {
                break KilledOnDrop(pid);
            }
            assert!(
                running.child().try_wait().unwrap().is_none(),
                "{who:?}: the bomb's run ended before it held its processes"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        // Its shell and the sleepers, below the limit; the subshell that
        // hit it is gone, and a few of the run's tasks counted while the
        // bomb forked (crun's own, setting the container up: 7 or 8 here
        // with any limit) are gone too.
        let sleepers = processes_where(|cmdline| cmdline == "sleep 3631").len();
        assert!(
            sleepers < pids_limit && sleepers >= pids_limit - 16,
            "{who:?}: the bomb holds {sleepers} processes, the limit is {pids_limit}"
        );
        // All of the same uid on the host as the bomb's: per-uid counting
        // would refuse its first fork.
        assert_eq!(
            stdout(&fx.run(who, &neighbour, &[])),
            "forked 200\n",
            "{who:?}"
        );
        assert!(
            running.child().try_wait().unwrap().is_none(),
            "{who:?}: the bomb held its processes all along"
        );
        drop(holder);
        let out = running.into_inner().wait_with_output().unwrap();
        let error = failure(&out);
        assert!(
            error.contains("can't fork: Resource temporarily unavailable"),
            "{who:?}: {error}"
        );
        // Killing the function's first process ends its run, and with it
        // every process the bomb made.
        assert_eq!(
            processes_where(|cmdline| cmdline.starts_with("sleep 363")),
            Vec::<u32>::new(),
            "{who:?}: left behind"
        );
    }
}

/// A static program that makes syscalls the profile refuses or does not
/// name, directly (no libc wrapper that might fall back), and prints the
/// errno of each.
const SYSCALLS: &str = r#"
use std::os::raw::c_long;
extern "C" {
    fn syscall(number: c_long, ...) -> c_long;
}
#[cfg(target_arch = "x86_64")]
const CALLS: [(&str, c_long); 9] = [("keyctl", 250), ("add_key", 248), ("bpf", 321),
    ("kexec_load", 246), ("open_by_handle_at", 304), ("unshare", 272), ("mount", 165),
    ("io_uring_setup", 425), ("personality", 135)];
#[cfg(target_arch = "aarch64")]
const CALLS: [(&str, c_long); 9] = [("keyctl", 219), ("add_key", 217), ("bpf", 280),
    ("kexec_load", 104), ("open_by_handle_at", 265), ("unshare", 97), ("mount", 40),
    ("io_uring_setup", 425), ("personality", 92)];
fn main() {
    for (name, number) in CALLS {
        // personality(ADDR_NO_RANDOMIZE): a real syscall with an argument
        // the profile does not allow; the others with arguments that would
        // do something were they let through (unshare: CLONE_NEWUSER).
        let arg: c_long = match name {
            "personality" => 0x0040000,
            "unshare" => 0x10000000,
            _ => 1,
        };
        let ret = unsafe { syscall(number, arg, 0 as c_long, 0 as c_long, 0 as c_long, 0 as c_long) };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let errno = match (ret, errno) {
            (r, _) if r >= 0 => "succeeded",
            (_, 1) => "EPERM",
            (_, 38) => "ENOSYS",
            _ => "another error",
        };
        println!("{name} {errno}");
    }
}
"#;

#[test]
fn syscalls_outside_the_profile_fail_with_eperm_or_enosys() {
    let fx = Fixture::new();
    let binary = static_rust_binary(fx.dir.path(), "syscalls", SYSCALLS);
    let image = ImageBuilder::new()
        .layer(Layer::new().file("/syscalls", 0o755, std::fs::read(binary).unwrap()))
        .entrypoint(["/syscalls"])
        .push(&fx.registry, "syscalls:v1")
        .reference;
    for who in EVERYONE {
        assert_eq!(
            stdout(&fx.run(who, &image, &[])),
            "keyctl EPERM\nadd_key EPERM\nbpf EPERM\nkexec_load EPERM\nopen_by_handle_at EPERM\n\
             unshare EPERM\nmount EPERM\nio_uring_setup EPERM\npersonality ENOSYS\n",
            "{who:?}"
        );
    }
}

#[test]
fn busybox_applets_and_a_static_rust_binary_work_under_the_profile() {
    let fx = Fixture::new();
    // Files, pipes, processes, signals, sockets, time, /proc.
    let busybox = fx.script_image(
        "everyday:v1",
        "set -e; mkdir -p /tmp/d && echo hi > /tmp/d/f && ln -s f /tmp/d/l && cat /tmp/d/l; \
         tar -C /tmp -cf /tmp/t.tar d && tar -tf /tmp/t.tar | sort | tr '\\n' ' '; echo; \
         echo abc | sed s/b/x/ | grep axc | wc -c; \
         sleep 10 & kill $!; wait $! || echo killed; \
         nc -l -p 8080 -e echo served & sleep 0.2; nc 127.0.0.1 8080 </dev/null; \
         date +%Y | grep -qE '^[0-9]{4}$' && echo date; ps -o comm | grep -cx ps; sha256sum /tmp/d/f | cut -c1-8",
    );
    // The static gRPC function server (tokio: threads, epoll, sockets)
    // serving until something connects.
    let fn_server = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file(
            "/fn_server",
            0o755,
            std::fs::read(function_server_binary()).unwrap(),
        ))
        .entrypoint([
            "/bin/sh",
            "-c",
            "/fn_server --insecure --address 127.0.0.1:9443 2>/dev/null & \
             for i in $(seq 100); do nc -w 1 127.0.0.1 9443 </dev/null >/dev/null 2>&1 && break; sleep 0.1; done \
             && echo listening; kill $!",
        ])
        .push(&fx.registry, "fn-server:v1")
        .reference;
    for who in EVERYONE {
        assert_eq!(
            stdout(&fx.run(who, &busybox, &[])),
            "hi\nd/ d/f d/l \n4\nkilled\nserved\ndate\n1\n98ea6e4f\n",
            "{who:?}"
        );
        assert_eq!(
            stdout(&fx.run(who, &fn_server, &[])),
            "listening\n",
            "{who:?}"
        );
    }
}

/// Debian's interpreter (scripts/setup.sh installs it); not one from PATH,
/// which may be a pyenv shim.
const PYTHON: &str = "/usr/bin/python3";

/// A layer with the host's python3 at its own path, the shared libraries
/// it and its extension modules load (as `ldd` names them), and the
/// standard library files `program` imports: found by running `program`
/// on the host with `LIST_FILES` (see tests/python/everyday.py), in
/// isolated mode without `site` (`-I -S`), as the image runs it.
fn python_layer(dir: &std::path::Path, program: &str) -> Layer {
    assert!(
        std::path::Path::new(PYTHON).exists(),
        "{PYTHON} is missing: run scripts/setup.sh (Debian's python3 comes with python3-yaml)"
    );
    let list = dir.join("python-files");
    let host_run = Command::new(PYTHON)
        .args(["-I", "-S", program])
        .env("LIST_FILES", &list)
        .output()
        .unwrap();
    assert!(
        host_run.status.success(),
        "{program} fails on the host: {}",
        String::from_utf8_lossy(&host_run.stderr)
    );
    let interpreter = std::fs::canonicalize(PYTHON).unwrap();
    let modules: Vec<String> = std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let mut files: std::collections::BTreeSet<String> = modules.iter().cloned().collect();
    for object in std::iter::once(interpreter.to_str().unwrap()).chain(
        modules
            .iter()
            .map(String::as_str)
            .filter(|m| m.ends_with(".so")),
    ) {
        let ldd = Command::new("ldd").arg(object).output().unwrap();
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x…)".
            let path = line.split("=>").last().unwrap_or("").trim();
            let path = path.split(" (").next().unwrap_or("");
            if path.starts_with('/') {
                files.insert(path.to_string());
            }
        }
    }
    let mut dirs = std::collections::BTreeSet::new();
    for file in &files {
        let mut parent = std::path::Path::new(file).parent();
        while let Some(dir) = parent.filter(|d| d != &std::path::Path::new("/")) {
            dirs.insert(dir.to_str().unwrap().to_string());
            parent = dir.parent();
        }
    }
    let mut layer = Layer::new();
    for dir in &dirs {
        layer = layer.dir(dir, 0o755);
    }
    layer = layer.file(PYTHON, 0o755, std::fs::read(&interpreter).unwrap());
    for file in &files {
        // Shared libraries through their links: the file they name.
        layer = layer.file(file, 0o755, std::fs::read(file).unwrap());
    }
    layer
}

#[test]
fn python_reads_and_writes_files_runs_threads_and_a_subprocess_under_the_profile() {
    let fx = Fixture::new();
    let program = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/everyday.py");
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(python_layer(fx.dir.path(), program))
        .layer(Layer::new().file("/everyday.py", 0o644, std::fs::read(program).unwrap()))
        .entrypoint([PYTHON, "-I", "-S", "/everyday.py"])
        .push(&fx.registry, "python:v1")
        .reference;
    for who in EVERYONE {
        assert_eq!(
            stdout(&fx.run(who, &image, &[])),
            "json 10\nthreads 140\nsubprocess 42\n",
            "{who:?}"
        );
    }
}
