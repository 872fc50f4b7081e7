//! `xfn run` end to end: the real binary (namespace entry happens in its
//! main), real crun, a real registry on 127.0.0.1 and images built here.
//!
//! Needs: crun, docker-registry, busybox-static, util-linux (setpriv); root
//! (to test both the 65536-id range and, via setpriv, uid 65532 without
//! capabilities).

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use xfn_testkit::child::ChildGuard;
use xfn_testkit::registry::hostile::HostileRegistry;
use xfn_testkit::*;

struct Fixture {
    registry: Registry,
    dir: tempfile::TempDir,
    cache: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = world_traversable_tempdir();
        let cache = dir.path().join("cache");
        Fixture {
            registry: Registry::start(),
            dir,
            cache,
        }
    }

    /// An image of busybox plus the script as entrypoint, at
    /// `/fn-<repo>.sh`: a name unique per test, so a leftover-process check
    /// cannot mistake another test's function for its own.
    fn script_image(&self, name: &str, script: &str) -> String {
        let path = script_path(name);
        ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(Layer::new().file(&path, 0o755, format!("#!/bin/sh\n{script}\n")))
            .entrypoint([path.as_str()])
            .push(&self.registry, name)
            .reference
    }

    fn command(&self) -> Command {
        let mut cmd = xfn_command();
        cmd.arg("run").arg("--cache-dir").arg(&self.cache);
        cmd
    }

    /// Pulls `image` into the cache first: `--timeout` bounds a run's pull
    /// too, and a test of the function's own timeout must not spend its
    /// second pulling on a busy machine.
    fn pull(&self, image: &str) {
        let out = xfn_command()
            .arg("pull")
            .arg("--cache-dir")
            .arg(&self.cache)
            .arg(image)
            .output()
            .expect("run xfn pull");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Where [`Fixture::script_image`] puts the script of image `name`.
fn script_path(name: &str) -> String {
    format!("/fn-{}.sh", name.split(':').next().unwrap())
}

fn run(fx: &Fixture, image: &str, input: &str, flags: &[&str]) -> Output {
    let mut cmd = fx.command();
    cmd.args(flags).arg(image).arg("-");
    run_with_input(cmd, input.as_bytes())
}

/// Spawns `cmd` (with `input`), waits until one of its function's
/// processes runs `sleep <marker>`, reads that process's uid map and real
/// uid as the host sees them, kills it (the function then goes on) and
/// returns both with the output of the run.
fn host_view_of_the_function(mut cmd: Command, input: &str, marker: &str) -> (String, u32, Output) {
    let mut child = ChildGuard::spawn_with_input(&mut cmd, input.as_bytes());
    let pid = loop {
        let sleep = format!("sleep {marker}");
        if let Some(pid) = process_where(|cmdline| cmdline == sleep) {
            break pid;
        }
        assert!(
            child.child().try_wait().unwrap().is_none(),
            "xfn exited early"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    (uid_map, uid, child.into_inner().wait_with_output().unwrap())
}

/// Nothing of any run is left in the cache dir, and no container process.
fn assert_no_leftovers(cache: &Path, marker: &str) {
    for sub in ["run/bundles", "run/crun", "run/rootfs"] {
        let left: Vec<_> = std::fs::read_dir(cache.join(sub))
            .unwrap_or_else(|e| panic!("{sub}: {e}"))
            .collect();
        assert!(left.is_empty(), "{sub} not empty: {left:?}");
    }
    if let Some(pid) = process_where(|cmdline| cmdline.contains(marker)) {
        panic!("process {pid} of {marker:?} is left");
    }
}

/// A FunctionIO of an XR, whose `desired: {}` a function replaces.
const XBUCKET_IO: &str = "apiVersion: apiextensions.crossplane.io/v1alpha1
kind: FunctionIO
observed:
  composite:
    resource:
      apiVersion: example.org/v1
      kind: XBucket
      metadata:
        name: test
desired: {}
";

#[test]
fn a_function_adds_a_desired_resource_to_its_function_io() {
    let fx = Fixture::new();
    let image = fx.script_image(
        "add-resource:v1",
        r#"sed '/^desired: {}$/d'
printf 'desired:\n  resources:\n  - name: bucket\n    resource:\n      apiVersion: s3.aws.upbound.io/v1beta1\n      kind: Bucket\n'"#,
    );
    let out = run(&fx, &image, XBUCKET_IO, &[]);
    let expected = XBUCKET_IO.replace("desired: {}\n", "")
        + "desired:\n  resources:\n  - name: bucket\n    resource:\n      apiVersion: s3.aws.upbound.io/v1beta1\n      kind: Bucket\n";
    assert_eq!(stdout(&out), expected);
    assert_no_leftovers(&fx.cache, &script_path("add-resource"));
}

/// What is no FunctionIO is refused as `xfn start` refuses it, with exit
/// code 2 (a usage error) and one line naming the input, before anything
/// is pulled: the registry serving the image sees no request at all. The
/// same run with a FunctionIO pulls and runs, so the count could move.
#[test]
fn input_that_is_no_function_io_is_refused_with_exit_code_2_before_any_pull() {
    let fx = Fixture::new();
    let registry = HostileRegistry::start();
    let cat = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/cat"]);
    let image = registry.serve(&cat, "refused:v1").reference;
    let deep = format!("observed: {}", "[".repeat(100));
    let bombs = alias_bombs().map(|(_, bomb)| format!("{FUNCTION_IO}config: {bomb}\n"));
    for (input, said) in [
        ("", "stdin: input is empty: a FunctionIO is required"),
        ("  \n# only a comment\n", "stdin: input is empty"),
        (
            "- a\n- list\n",
            "stdin: input is not a FunctionIO: not a YAML mapping",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\n",
            "stdin: input is not a FunctionIO: apiVersion \"v1\" is not one of",
        ),
        ("{ unclosed", "stdin: input is not a FunctionIO: not YAML"),
        (&deep, "nested more than 64 levels deep"),
    ]
    .into_iter()
    .chain(bombs.iter().map(|bomb| {
        (
            bomb.as_str(),
            "stdin: input is not a FunctionIO: its aliases expand too far",
        )
    })) {
        let out = run(&fx, &image, input, &[]);
        let err = failure(&out);
        assert_eq!(out.status.code(), Some(2), "{input:?}: {err}");
        assert!(err.contains(said), "{input:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    // A file is named, and one that cannot be read is the same usage error.
    let composition = fx.dir.path().join("composition.yaml");
    std::fs::write(
        &composition,
        "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: Composition\n",
    )
    .unwrap();
    let missing = fx.dir.path().join("missing.yaml");
    for (file, said) in [
        (
            &composition,
            format!(
                "{}: input is not a FunctionIO: kind is \"Composition\", not FunctionIO",
                composition.display()
            ),
        ),
        (
            &missing,
            format!("cannot read the input {}", missing.display()),
        ),
    ] {
        let out = fx.command().arg(&image).arg(file).output().unwrap();
        let err = failure(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&said), "{err}");
    }
    assert_eq!(registry.requests(), 0, "the registry was asked first");

    assert_eq!(stdout(&run(&fx, &image, FUNCTION_IO, &[])), FUNCTION_IO);
    assert!(registry.manifest_gets() > 0 && registry.blob_gets() > 0);
}

/// xfn reads its input as the user who runs it, before it enters its user
/// namespace, whose root (host uid 100000 here) could not read a file only
/// root may.
#[test]
fn an_input_file_only_its_owner_can_read_is_read() {
    let fx = Fixture::new();
    let image = fx.script_image("private-input:v1", "cat");
    let input = fx.dir.path().join("private.yaml");
    std::fs::write(&input, FUNCTION_IO).unwrap();
    std::fs::set_permissions(&input, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = fx.command().arg(&image).arg(&input).output().unwrap();
    assert_eq!(stdout(&out), FUNCTION_IO);
}

#[test]
fn a_function_answers_a_run_function_request() {
    let fx = Fixture::new();
    let image = fx.script_image(
        "v1-fn:v1",
        r#"tag=$(sed -n 's/.*"tag":"\([^"]*\)".*/\1/p')
printf '{"meta":{"tag":"%s","ttl":"60s"},"desired":{"composite":{}}}' "$tag""#,
    );
    let request = r#"{"meta":{"tag":"abc123"},"observed":{"composite":{"resource":{}}}}"#;
    let out = run(&fx, &image, request, &[]);
    assert_eq!(
        stdout(&out),
        r#"{"meta":{"tag":"abc123","ttl":"60s"},"desired":{"composite":{}}}"#
    );
}

#[test]
fn entrypoint_and_cmd_combinations() {
    let fx = Fixture::new();
    let both = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/echo", "entry"])
        .cmd(["cmd"])
        .push(&fx.registry, "both:v1")
        .reference;
    assert_eq!(stdout(&run(&fx, &both, FUNCTION_IO, &[])), "entry cmd\n");
    let entry_only = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/echo", "only-entry"])
        .push(&fx.registry, "entry:v1")
        .reference;
    assert_eq!(
        stdout(&run(&fx, &entry_only, FUNCTION_IO, &[])),
        "only-entry\n"
    );
    let cmd_only = ImageBuilder::new()
        .layer(Layer::busybox())
        .cmd(["/bin/echo", "only-cmd"])
        .push(&fx.registry, "cmd:v1")
        .reference;
    assert_eq!(stdout(&run(&fx, &cmd_only, FUNCTION_IO, &[])), "only-cmd\n");
    let neither = ImageBuilder::new()
        .layer(Layer::busybox())
        .push(&fx.registry, "neither:v1")
        .reference;
    let err = failure(&run(&fx, &neither, FUNCTION_IO, &[]));
    assert!(err.contains("neither an Entrypoint nor a Cmd"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
}

#[test]
fn env_workdir_and_default_path() {
    let fx = Fixture::new();
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", "echo $GREETING; pwd; echo $PATH"])
        .env(["GREETING=hello", "PATH=/bin"])
        .working_dir("/work")
        .push(&fx.registry, "env:v1")
        .reference;
    assert_eq!(
        stdout(&run(&fx, &image, FUNCTION_IO, &[])),
        "hello\n/work\n/bin\n"
    );
    let no_path = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", "echo $PATH; pwd"])
        .env(Vec::<String>::new())
        .push(&fx.registry, "nopath:v1")
        .reference;
    assert_eq!(
        stdout(&run(&fx, &no_path, FUNCTION_IO, &[])),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n/\n"
    );
}

#[test]
fn user_by_name_and_by_number() {
    let fx = Fixture::new();
    let with_user = |name: &str, user: &str| {
        ImageBuilder::new()
            .layer(Layer::busybox())
            .entrypoint(["/bin/sh", "-c", "id -u; id -g"])
            .user(user)
            .push(&fx.registry, name)
            .reference
    };
    let by_name = with_user("byname:v1", "nonroot");
    assert_eq!(
        stdout(&run(&fx, &by_name, FUNCTION_IO, &[])),
        "65532\n65532\n"
    );
    let by_number = with_user("bynumber:v1", "1234:4321");
    assert_eq!(
        stdout(&run(&fx, &by_number, FUNCTION_IO, &[])),
        "1234\n4321\n"
    );
    let name_group = with_user("namegroup:v1", "nonroot:nogroup");
    assert_eq!(
        stdout(&run(&fx, &name_group, FUNCTION_IO, &[])),
        "65532\n65534\n"
    );
    let unknown = with_user("unknown:v1", "nosuchuser");
    let err = failure(&run(&fx, &unknown, FUNCTION_IO, &[]));
    assert!(
        err.contains("\"nosuchuser\" is not in the image's /etc/passwd"),
        "{err}"
    );
}

/// A TCP server on 127.0.0.1 answering every connection with "pong".
fn pong_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.write_all(b"pong\n");
        }
    });
    port
}

#[test]
fn network_isolated_cannot_reach_the_host_runner_can() {
    let fx = Fixture::new();
    let port = pong_server();
    let image = fx.script_image(
        "net:v1",
        &format!("nc -w 2 127.0.0.1 {port} </dev/null && echo reached || echo unreachable"),
    );
    assert_eq!(
        stdout(&run(
            &fx,
            &image,
            FUNCTION_IO,
            &["--network-policy", "Isolated"]
        )),
        "unreachable\n"
    );
    assert_eq!(
        stdout(&run(
            &fx,
            &image,
            FUNCTION_IO,
            &["--network-policy", "Runner"]
        )),
        "pong\nreached\n"
    );
    // Isolated is the default.
    assert_eq!(stdout(&run(&fx, &image, FUNCTION_IO, &[])), "unreachable\n");
}

#[test]
fn a_function_that_never_exits_is_killed_at_the_timeout() {
    let fx = Fixture::new();
    let image = fx.script_image("hang:v1", "sleep 4711 & sleep 4711");
    fx.pull(&image);
    let err = failure(&run(&fx, &image, FUNCTION_IO, &["--timeout", "1s"]));
    assert!(err.contains("timed out after 1s"), "{err}");
    assert_no_leftovers(&fx.cache, "sleep 4711");
}

#[test]
fn non_zero_exit_reports_code_and_stderr_tail() {
    let fx = Fixture::new();
    let image = fx.script_image(
        "fail:v1",
        "echo 'first line' >&2; echo 'cannot compose: bad input' >&2; exit 7",
    );
    let err = failure(&run(&fx, &image, FUNCTION_IO, &[]));
    assert!(err.contains("exit code 7"), "{err}");
    assert!(
        err.contains("first line | cannot compose: bad input"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert_no_leftovers(&fx.cache, &script_path("fail"));
}

#[test]
fn xfn_run_exits_with_the_function_s_exit_code_and_124_on_a_timeout() {
    let fx = Fixture::new();
    let image = fx.script_image("exit-code:v1", "exit 7");
    assert_eq!(run(&fx, &image, FUNCTION_IO, &[]).status.code(), Some(7));
    let image = fx.script_image("killed:v1", "sh -c 'kill -KILL $$'");
    assert_eq!(run(&fx, &image, FUNCTION_IO, &[]).status.code(), Some(137));
    let image = fx.script_image("slow:v1", "sleep 4719");
    fx.pull(&image);
    let out = run(&fx, &image, FUNCTION_IO, &["--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(124), "{}", failure(&out));
}

#[test]
fn a_missing_runtime_is_named_as_missing_before_anything_is_pulled() {
    let fx = Fixture::new();
    let err = failure(&run(
        &fx,
        "127.0.0.1:1/never-pulled:v1",
        FUNCTION_IO,
        &["--runtime", "no-such-runtime"],
    ));
    assert!(
        err.contains("cannot run the OCI runtime no-such-runtime: not found in PATH"),
        "{err}"
    );
}

#[test]
fn an_output_flood_hits_the_cap() {
    let fx = Fixture::new();
    let image = fx.script_image("flood:v1", "yes flood-4712");
    let err = failure(&run(
        &fx,
        &image,
        FUNCTION_IO,
        &["--max-output-bytes", "100000"],
    ));
    assert!(err.contains("more than 100000 bytes to stdout"), "{err}");
    assert_no_leftovers(&fx.cache, "flood-4712");
}

#[test]
fn files_written_to_the_rootfs_do_not_outlive_the_run() {
    for mode in ["overlay", "copy"] {
        let fx = Fixture::new();
        let image = fx.script_image(
            "writer:v1",
            "test -e /left-behind && echo found || echo absent; echo x > /left-behind; echo y > /bin/busybox-was-here",
        );
        let flags = ["--rootfs", mode];
        assert_eq!(
            stdout(&run(&fx, &image, FUNCTION_IO, &flags)),
            "absent\n",
            "{mode}"
        );
        assert_eq!(
            stdout(&run(&fx, &image, FUNCTION_IO, &flags)),
            "absent\n",
            "{mode}"
        );
        let found = Command::new("find")
            .arg(&fx.cache)
            .args(["-name", "left-behind", "-o", "-name", "busybox-was-here"])
            .output()
            .unwrap();
        assert!(
            found.stdout.is_empty(),
            "{mode}: {}",
            String::from_utf8_lossy(&found.stdout)
        );
        assert_no_leftovers(&fx.cache, &script_path("writer"));
    }
}

#[test]
fn as_root_a_range_is_mapped_functions_run_past_xfns_own_id_and_owners_are_right() {
    let fx = Fixture::new();
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().owner(65532, 65532).dir("/home", 0o755).file(
            "/home/owned",
            0o644,
            "mine\n",
        ))
        .entrypoint([
            "/bin/sh",
            "-c",
            "id -u; stat -c '%u:%g' /home/owned /bin/busybox; cat /proc/self/uid_map; sleep 4715 || true",
        ])
        .push(&fx.registry, "owners:v1")
        .reference;
    let mut cmd = fx.command();
    cmd.arg(&image).arg("-");
    let (host_map, host_uid, out) = host_view_of_the_function(cmd, FUNCTION_IO, "4715");
    let out = stdout(&out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..3], ["0", "65532:65532", "0:0"], "{out}");
    // The run's own user namespace maps xfn's 65535 ids past its own 0 one
    // to one…
    let map: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(map, ["0", "1", "65535"], "{out}");
    // …so container uid 0 is host uid 100001, and xfn (the default
    // --map-root-uid) keeps 100000 to itself.
    let host_map: Vec<&str> = host_map.split_whitespace().collect();
    assert_eq!(host_map, ["0", "100001", "65535"]);
    assert_eq!(host_uid, 100001);
}

#[test]
fn unprivileged_without_capabilities_maps_its_own_id() {
    let fx = Fixture::new();
    dir_owned_by(&fx.cache, NONROOT);
    let image = fx.script_image(
        "unpriv:v1",
        "id -u; stat -c '%u' /bin/busybox; cat /proc/self/uid_map; cat; sleep 4716 || true",
    );
    let mut cmd = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")));
    cmd.arg("run")
        .arg("--cache-dir")
        .arg(&fx.cache)
        .arg(&image)
        .arg("-");
    let (host_map, host_uid, out) = host_view_of_the_function(cmd, FUNCTION_IO, "4716");
    let out = stdout(&out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["0", "0"], "{out}");
    // The run's own user namespace maps xfn's one id…
    let map: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(map, ["0", "0", "1"], "{out}");
    assert_eq!(lines[3..].join("\n") + "\n", FUNCTION_IO, "{out}");
    // …which is the host's 65532.
    let host_map: Vec<&str> = host_map.split_whitespace().collect();
    assert_eq!(host_map, ["0", "65532", "1"]);
    assert_eq!(host_uid, NONROOT);
    // The runner's network (sysfs bound, not mounted) works unprivileged too.
    let mut cmd = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")));
    cmd.arg("run")
        .arg("--cache-dir")
        .arg(&fx.cache)
        .args(["--network-policy", "Runner"])
        .arg(&image)
        .arg("-");
    let input = format!("{FUNCTION_IO}# runner\n");
    let (_, host_uid, out) = host_view_of_the_function(cmd, &input, "4716");
    let out = stdout(&out);
    assert!(out.ends_with(&input), "{out}");
    assert_eq!(host_uid, NONROOT);
    assert_no_leftovers(&fx.cache, &script_path("unpriv"));
}

#[test]
fn twenty_concurrent_runs_of_one_image_succeed() {
    let fx = Fixture::new();
    let image = fx.script_image("concurrent:v1", "cat; echo ' done'");
    // Pull once so the runs share a warm cache (concurrent pulls are the store's tests).
    assert_eq!(
        stdout(&run(&fx, &image, FUNCTION_IO, &[])),
        format!("{FUNCTION_IO} done\n")
    );
    // Each run's input its own, so a mixed-up output shows.
    let input = |i| format!("{FUNCTION_IO}# run {i}\n");
    let children: Vec<_> = (0..20)
        .map(|i| {
            let mut cmd = fx.command();
            cmd.arg(&image).arg("-");
            (
                i,
                ChildGuard::spawn_with_input(&mut cmd, input(i).as_bytes()),
            )
        })
        .collect();
    for (i, child) in children {
        let out = child.into_inner().wait_with_output().unwrap();
        assert_eq!(stdout(&out), format!("{} done\n", input(i)));
    }
    assert_no_leftovers(&fx.cache, &script_path("concurrent"));
}

#[test]
fn limits_flags_are_validated_and_required_limits_refused() {
    let fx = Fixture::new();
    let image = fx.script_image("limits:v1", "echo ran");
    assert_eq!(
        stdout(&run(
            &fx,
            &image,
            FUNCTION_IO,
            &["--cpu", "500m", "--memory", "128Mi"]
        )),
        "ran\n"
    );
    let err = failure(&run(&fx, &image, FUNCTION_IO, &["--cpu", "1x"]));
    assert!(err.contains("\"1x\" is not a Kubernetes quantity"), "{err}");
    let err = failure(&run(&fx, &image, FUNCTION_IO, &["--require-limits"]));
    assert!(
        err.contains("limits are required but not enforced"),
        "{err}"
    );
}

#[test]
fn functions_run_hardened() {
    let fx = Fixture::new();
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().symlink("/bin/unshare", "busybox"))
        .entrypoint([
            "/bin/sh",
            "-c",
            "grep -E '^(Seccomp|NoNewPrivs|CapBnd|CapEff):' /proc/self/status | sort; \
             hostname; \
             unshare -U true 2>/dev/null && echo unshare-allowed || echo unshare-denied; \
             mount -t tmpfs tmpfs /mnt 2>/dev/null && echo mount-allowed || echo mount-denied; \
             echo 1 > /proc/sys/kernel/pid_max 2>/dev/null && echo procsys-writable || echo procsys-readonly; \
             stat -c '%F %t:%T' /proc/keys /proc/interrupts; \
             touch /sys/x 2>/dev/null && echo sys-writable || echo sys-readonly; \
             touch /tmp/x && echo tmp-writable",
        ])
        .push(&fx.registry, "hardened:v1")
        .reference;
    let out = stdout(&run(&fx, &image, FUNCTION_IO, &[]));
    // CHOWN(0) DAC_OVERRIDE(1) FOWNER(3) FSETID(4) KILL(5) SETGID(6) SETUID(7);
    // masked /proc files are bound to /dev/null (1:3).
    let caps = "00000000000000fb";
    assert_eq!(
        out,
        format!(
            "CapBnd:\t{caps}\nCapEff:\t{caps}\nNoNewPrivs:\t1\nSeccomp:\t2\n\
             function\nunshare-denied\nmount-denied\nprocsys-readonly\n\
             character special file 1:3\ncharacter special file 1:3\nsys-readonly\ntmp-writable\n"
        )
    );
}

/// A static Rust binary (glibc, `crt-static`) that spawns threads: its libc
/// tries clone3, which the seccomp profile answers with ENOSYS, and must
/// fall back to clone. Built here with the rustc that builds the tests.
#[test]
fn a_static_binary_with_threads_runs_under_the_seccomp_profile() {
    let fx = Fixture::new();
    let binary = static_rust_binary(
        fx.dir.path(),
        "static_fn",
        r#"use std::io::Read;
fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).unwrap();
    let handles: Vec<_> = (0..4).map(|i| std::thread::spawn(move || i * 2)).collect();
    let sum: i32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    println!("static: {} bytes in, threads sum {}", input.len(), sum);
}
"#,
    );
    let image = ImageBuilder::new()
        .layer(Layer::new().file("/static_fn", 0o755, std::fs::read(&binary).unwrap()))
        .entrypoint(["/static_fn"])
        .push(&fx.registry, "static:v1")
        .reference;
    assert_eq!(
        stdout(&run(&fx, &image, FUNCTION_IO, &[])),
        format!("static: {} bytes in, threads sum 12\n", FUNCTION_IO.len())
    );
}

#[test]
fn a_relative_cache_dir_works() {
    let fx = Fixture::new();
    let image = fx.script_image("relative:v1", "cat");
    let mut cmd = xfn_command();
    cmd.current_dir(fx.dir.path())
        .args(["run", "--cache-dir", "cache"])
        .arg(&image)
        .arg("-");
    assert_eq!(
        stdout(&run_with_input(cmd, FUNCTION_IO.as_bytes())),
        FUNCTION_IO
    );
}

/// "root" whose own namespace maps a single id (as in a rootless
/// container) cannot map a 65536-id range: xfn maps its own id instead.
#[test]
fn root_of_a_single_id_namespace_falls_back_to_its_own_id() {
    let fx = Fixture::new();
    let image = fx.script_image("nested:v1", "id -u; cat /proc/self/uid_map");
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--"])
        .arg(env!("CARGO_BIN_EXE_xfn"))
        .arg("run")
        .arg("--cache-dir")
        .arg(&fx.cache)
        .arg(&image)
        .arg("-");
    let out = stdout(&run_with_input(cmd, FUNCTION_IO.as_bytes()));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0", "{out}");
    let map: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(map, ["0", "0", "1"], "{out}");
}

#[test]
fn sigterm_stops_the_run_and_leaves_nothing() {
    let fx = Fixture::new();
    let image = fx.script_image("sigterm:v1", "sleep 4713");
    let mut cmd = fx.command();
    cmd.arg(&image).arg("-");
    let mut child = ChildGuard::spawn_with_input(&mut cmd, FUNCTION_IO.as_bytes()).into_inner();
    // Wait for the function to be running.
    let marker = "sleep 4713";
    while process_where(|cmdline| cmdline.contains(marker)).is_none() {
        assert!(child.try_wait().unwrap().is_none(), "xfn exited early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    // The shell's code for SIGTERM, as any command a script runs.
    assert_eq!(out.status.code(), Some(143));
    let err = failure(&out);
    assert!(err.contains("terminated; the run was stopped"), "{err}");
    assert_no_leftovers(&fx.cache, marker);
}
