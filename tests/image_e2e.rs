//! The runner image as it is deployed, proven under podman with no
//! registry besides one on 127.0.0.1: `scripts/image.sh` makes the Debian
//! base and builder images from Debian's packages (mmdebstrap) and builds
//! the repository's own `Dockerfile` with podman; then
//!
//! - the sidecar: the image run as uid 65532 (its default user) with the
//!   pod's seccomp profile `seccomp/runner.json` and an unmasked `/proc`
//!   (seccomp/README.md says why), sharing this test's network namespace as
//!   Crossplane's container shares the pod's, serves `RunFunction` on its
//!   abstract socket, pulls from the registry, runs the function and
//!   answers; SIGTERM stops it cleanly; started again on the same `/xfn`
//!   volume it serves again from its cache; xfn is PID 1 both times;
//! - the sidecar as deploy/ ships it: the image run as the root of a user
//!   namespace of its own (`--uidmap`, as a pod with `hostUsers: false`),
//!   with only SETUID, SETGID and SETFCAP, `no-new-privileges` and the same
//!   profile, maps that namespace's ids itself and runs a function under
//!   ids that are not its own, for a caller that is the pod's 65532;
//! - an adaptor: `xfn wrap` of a function onto that image, pushed, run the
//!   same way, answers the published Python SDK's stubs over mutual TLS.
//!
//! Needs (scripts/setup.sh installs them): podman, mmdebstrap, skopeo,
//! docker-registry, busybox-static, openssl, python3 with
//! crossplane-function-sdk-python; Debian's HTTP mirror (for the base
//! images and the image's crun). Without podman or mmdebstrap the tests
//! fail saying so: they are what proves the image, not optional.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use xfn_testkit::*;
use xfn_testkit::{abstract_channel, request, Client, FUNCTION_IO};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const PROFILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/seccomp/runner.json");
const ADAPT_FUNCTION: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/adapt/function.sh");
const SDK_CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/adapt/sdk_check.py");

/// The runner image, built once per test run by `scripts/image.sh`.
fn runner_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        for tool in ["podman", "mmdebstrap"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success());
            assert!(
                found,
                "tests/image_e2e.rs needs {tool} to build and run the runner image: run scripts/setup.sh"
            );
        }
        let tag = "localhost/xfn:e2e-test";
        let out = Command::new("scripts/image.sh")
            .arg(tag)
            .current_dir(REPO)
            .output()
            .expect("run scripts/image.sh");
        assert!(
            out.status.success(),
            "scripts/image.sh failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Its summary: the image's size and build time.
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
        tag.to_string()
    })
}

/// `podman ARGS` as this host needs it (scripts/lib/testbed.sh): in a
/// private mount namespace with `/sys/fs/cgroup` covered (hybrid cgroups).
fn podman(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(
            r#". scripts/lib/testbed.sh; exec $PODMAN_NS sh -c "$PODMAN_PRELUDE && exec podman \"\$@\"" podman "$@""#,
        )
        .arg("sh")
        .args(args)
        .current_dir(REPO)
        .output()
        .expect("run podman")
}

/// The stdout of `podman ARGS`, which must succeed.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `podman run`'s arguments from the volume on: `cache` as the image's
/// /xfn, the image, and its command `start` on `@socket`, a socket of this
/// test's own (the default one may be another runner's in this shared
/// network namespace); the command's other flags follow.
fn runner_start(cache: &Path, image: &str, socket: &str) -> [String; 6] {
    [
        "--volume".to_string(),
        format!("{}:/xfn", cache.display()),
        image.to_string(),
        "start".to_string(),
        "--address".to_string(),
        format!("@{socket}"),
    ]
}

/// `podman run -d` flags of a confined xfn container: the host's podman
/// flags, this network namespace, the pod's seccomp profile, an unmasked
/// `/proc` and a read-only root with no tmpfs added (as the manifests'
/// `readOnlyRootFilesystem`); nothing else: no added capabilities, the
/// image's own user.
fn confined_run(name: &str) -> Vec<String> {
    let host_flags = Command::new("sh")
        .args([
            "-c",
            ". scripts/lib/testbed.sh; printf %s \"$PODMAN_HOST_FLAGS\"",
        ])
        .current_dir(REPO)
        .output()
        .expect("read scripts/lib/testbed.sh");
    let mut args: Vec<String> = ["run", "-d", "--name", name, "--network", "host"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(
        String::from_utf8_lossy(&host_flags.stdout)
            .split_whitespace()
            .map(str::to_string),
    );
    args.extend([
        "--security-opt".to_string(),
        format!("seccomp={PROFILE}"),
        "--security-opt".to_string(),
        "unmask=/proc/*".to_string(),
        "--read-only".to_string(),
        "--read-only-tmpfs=false".to_string(),
    ]);
    args
}

/// A container removed when dropped.
struct Container {
    name: String,
}

impl Container {
    fn start(name: String, args: &[String]) -> Container {
        let _ = podman(&["rm", "-f", &name]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        podman_ok(&args);
        Container { name }
    }

    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn running(&self) -> bool {
        podman_ok(&["inspect", "--format", "{{.State.Running}}", &self.name]) == "true"
    }

    /// `/proc/PID/status` of the container's main process, as the host
    /// sees it.
    fn main_process_status(&self) -> String {
        let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &self.name]);
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the main process")
    }

    /// Checks what the deployment promises of the main process: xfn, PID 1
    /// of its container, host uid `uid`, under a seccomp filter.
    fn assert_confined_xfn(&self, uid: u32) {
        let status = self.main_process_status();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in\n{status}"))
                .trim()
                .to_string()
        };
        assert_eq!(field("Name:"), "xfn", "{status}");
        assert!(
            field("NSpid:").ends_with("\t1") || field("NSpid:").ends_with(" 1"),
            "xfn is not PID 1 of its container: {status}"
        );
        assert_eq!(
            field("Uid:").split_whitespace().collect::<Vec<_>>(),
            [uid.to_string().as_str(); 4],
            "{status}"
        );
        assert_eq!(field("Seccomp:"), "2", "no seccomp filter: {status}");
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// Waits until the runner on `@socket` answers health checks (or the
/// container has exited: then its log).
async fn wait_serving(container: &Container, socket: &str) -> Client {
    for _ in 0..1200 {
        if let Ok(channel) = abstract_channel(socket, None).await {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
            let check = tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            };
            if health.check(check).await.is_ok() {
                return Client::new(channel);
            }
        }
        assert!(
            container.running(),
            "the sidecar exited:\n{}",
            container.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the sidecar did not serve within a minute:\n{}",
        container.logs()
    );
}

/// A busybox function that prints what `says` (a shell line) tells of
/// where it runs, then echoes its input: pushed to `registry` as `name`.
fn shell_function(registry: &Registry, says: &str, name: &str) -> PushedImage {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, format!("#!/bin/sh\n{says}\ncat\n")))
        .entrypoint(["/fn.sh"])
        .push(registry, name)
}

/// One `RunFunction` call; the function's output.
async fn run(client: &mut Client, container: &Container, image: &str) -> String {
    let response = client
        .run_function(request(image, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", container.logs()))
        .into_inner();
    String::from_utf8(response.output).expect("UTF-8 output")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sidecar_image_serves_stops_on_sigterm_and_serves_again_from_its_cache_volume() {
    let image = runner_image();
    let registry = Registry::start();
    let function = shell_function(
        &registry,
        "echo \"ran as $(id -u) on $(hostname)\"",
        "image-e2e-fn:v1",
    );
    let dir = world_traversable_tempdir();
    let cache = dir.path().join("xfn");
    dir_owned_by(&cache, NONROOT);
    let socket = format!("xfn-image-e2e/{}", std::process::id());
    let name = format!("xfn-e2e-sidecar-{}", std::process::id());
    let mut args = confined_run(&name);
    args.extend(runner_start(&cache, image, &socket));
    args.extend([
        "--debug".to_string(),
        // 65532 without capabilities: functions share its uid
        // (deploy/'s shared-uid fallback passes the same).
        "--allow-shared-uid".to_string(),
    ]);
    let container = Container::start(name.clone(), &args);
    assert_eq!(
        podman_ok(&["inspect", "--format", "{{.Config.User}}", &name]),
        "65532:65532"
    );

    let expected = format!("ran as 0 on function\n{FUNCTION_IO}");
    let mut client = wait_serving(&container, &socket).await;
    container.assert_confined_xfn(NONROOT);
    assert_eq!(
        run(&mut client, &container, &function.reference).await,
        expected
    );
    assert!(
        std::fs::read_dir(cache.join("layers")).is_ok_and(|mut d| d.next().is_some()),
        "nothing cached in the /xfn volume"
    );

    // SIGTERM: a clean exit (0), logged.
    drop(client);
    podman_ok(&["kill", "--signal", "TERM", &name]);
    assert_eq!(podman_ok(&["wait", &name]), "0", "{}", container.logs());
    let logs = container.logs();
    assert!(
        logs.contains("SIGTERM received") && logs.contains("stopped"),
        "{logs}"
    );

    // Started again on the same volume: serves again, from its cache (the
    // layers are not fetched a second time), and is PID 1 again.
    let layer = &function.image.layers[0].digest;
    let fetched = registry.blob_get_count(layer);
    podman_ok(&["start", &name]);
    let mut client = wait_serving(&container, &socket).await;
    container.assert_confined_xfn(NONROOT);
    assert_eq!(
        run(&mut client, &container, &function.reference).await,
        expected
    );
    assert_eq!(registry.blob_get_count(layer), fetched, "pulled again");
}

/// deploy/'s shape (`tests/run_pod_shape.rs` proves the binary in it; this,
/// the image): the pod's root over a range of unprivileged host ids, only
/// the capabilities the manifests add, no privilege escalation, the pod's
/// seccomp profile. xfn maps the pod's ids with its default flags, and the
/// function's user namespace maps its root onto the pod's 1, not xfn's 0.
#[tokio::test(flavor = "multi_thread")]
async fn the_sidecar_image_as_its_pods_root_runs_functions_under_the_pods_other_ids() {
    let image = runner_image();
    let registry = Registry::start();
    let function = shell_function(
        &registry,
        "echo \"ran as $(id -u) over\" $(cat /proc/self/uid_map)",
        "image-e2e-pod-fn:v1",
    );
    let base = xfn_testkit::subordinate_range(3);
    let dir = world_traversable_tempdir();
    let cache = dir.path().join("xfn");
    // The emptyDir, as the kubelet gives it to the pod's root.
    dir_owned_by(&cache, base);
    let socket = format!("xfn-image-e2e-pod/{}", std::process::id());
    let name = format!("xfn-e2e-pod-{}", std::process::id());
    let ids = format!("0:{base}:65536");
    let mut args = confined_run(&name);
    args.extend(
        [
            "--user",
            "0:0",
            "--uidmap",
            &ids,
            "--gidmap",
            &ids,
            "--cap-drop",
            "all",
            "--cap-add",
            "setuid,setgid,setfcap",
            "--security-opt",
            "no-new-privileges",
        ]
        .map(str::to_string),
    );
    args.extend(runner_start(&cache, image, &socket));
    args.extend([
        // Crossplane's container in the pod (deploy/ passes the same).
        "--allow-uid=65532".to_string(),
    ]);
    let container = Container::start(name, &args);
    let crossplane = base + NONROOT;
    let channel = loop {
        match abstract_channel(&socket, Some(crossplane)).await {
            Ok(channel) => break channel,
            Err(_) if container.running() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("the sidecar exited ({e}):\n{}", container.logs()),
        }
    };
    container.assert_confined_xfn(base);
    let status = container.main_process_status();
    for (field, value) in [("CapEff:", "00000000800000c0"), ("NoNewPrivs:", "1")] {
        assert!(
            status
                .lines()
                .any(|l| l.split_whitespace().eq([field, value])),
            "{field} is not {value}: {status}"
        );
    }
    let output = run(&mut Client::new(channel), &container, &function.reference).await;
    assert_eq!(
        output,
        format!("ran as 0 over 0 1 65535\n{FUNCTION_IO}"),
        "{}",
        container.logs()
    );
    let logs = container.logs();
    assert!(
        logs.contains(&format!("xfn_uid={base} "))
            && logs.contains(&format!("function_uids={}-{} ", base + 1, base + 65535)),
        "{logs}"
    );
}

/// Makes `dir`'s files readable only by 65532, as a Secret mounted for the
/// pod's user would be.
fn owned_by_nonroot(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        std::os::unix::fs::chown(entry.unwrap().path(), Some(NONROOT), Some(NONROOT)).unwrap();
    }
    std::os::unix::fs::chown(dir, Some(NONROOT), Some(NONROOT)).unwrap();
}

fn command_ok(command: &mut Command) -> String {
    let out = command.output().expect("run");
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adaptor_image_wrapped_onto_the_runner_image_answers_the_python_sdk_over_mtls() {
    let image = runner_image();
    let registry = Registry::start();
    let dir = world_traversable_tempdir();

    // The runner image in the registry, as `xfn wrap --base` takes it.
    let base = format!("{}/xfn:e2e", registry.host());
    podman_ok(&[
        "push",
        "--tls-verify=false",
        image,
        &format!("docker://{base}"),
    ]);

    // A function container, saved as `docker save` writes it, wrapped.
    let function = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, std::fs::read(ADAPT_FUNCTION).unwrap()))
        .entrypoint(["/bin/sh", "/fn.sh"])
        .push(&registry, "image-e2e-adapt-fn:v1");
    let tarball = dir.path().join("fn.tar");
    command_ok(
        Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{}", function.reference))
            .arg(format!("docker-archive:{}", tarball.display())),
    );
    let adapted = format!("{}/fn-adapted:v1", registry.host());
    command_ok(
        xfn_command()
            .args(["wrap", "--function"])
            .arg(&tarball)
            .args([
                "--base", &base, "--tag", &adapted, "--push", "--name", "e2e-fn",
            ]),
    );

    // Run as Crossplane runs a Function's pod: its TLS secret mounted, a
    // cache volume, the pod's profile.
    let certs: PathBuf = xfn_testkit::tls::mtls_certs(dir.path());
    owned_by_nonroot(&certs);
    let cache = dir.path().join("xfn");
    dir_owned_by(&cache, NONROOT);
    let port = free_port();
    let name = format!("xfn-e2e-adaptor-{}", std::process::id());
    let mut args = confined_run(&name);
    args.extend([
        "--tls-verify=false".to_string(),
        "--volume".to_string(),
        format!("{}:/tls:ro", certs.display()),
        "--volume".to_string(),
        format!("{}:/xfn", cache.display()),
        "--env".to_string(),
        "TLS_SERVER_CERTS_DIR=/tls".to_string(),
        adapted.clone(),
        "--address".to_string(),
        format!("127.0.0.1:{port}"),
    ]);
    let container = Container::start(name, &args);
    for _ in 0..1200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        assert!(
            container.running(),
            "the adaptor exited:\n{}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    container.assert_confined_xfn(NONROOT);

    // The published Python SDK's generated stubs, over mutual TLS.
    let out = Command::new("python3")
        .arg(SDK_CHECK)
        .arg(format!("127.0.0.1:{port}"))
        .arg(dir.path())
        .output()
        .expect("run python3");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("sdk-check-ok"),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        container.logs()
    );
    drop(container);
    // The pulled copy would outlive the registry (its layers stay shared
    // with the runner image).
    let _ = podman(&["rmi", &adapted]);
}
