//! The Go functions people run, through `xfn host`, called as Crossplane
//! core calls them: function-patch-and-transform (grpc-go, function-sdk-go;
//! built by scripts/peers.sh) as its package image, served rootless over
//! mutual TLS, and dialled by tests/peers/dial — grpc-go with core's target
//! shape (`dns:///NAME.crossplane-system:9443`, every name resolved to the
//! host's port as a headless Service's DNS resolves it to the pod), its
//! service config (round_robin, waitForReady), `credentials.NewTLS` with a
//! client certificate of the CA and the SNI from the target, and its v1 →
//! v1beta1 fallback. Every answer must be the one the same function gives
//! natively: from zero, warm, over v1beta1, after its server is killed, and
//! after it stopped when idle.
//!
//! Needs: scripts/peers.sh (function-patch-and-transform, core-dial; a
//! missing one fails the test naming the script), crun, docker-registry,
//! openssl; root.
use std::path::Path;
use std::process::{Command, Output, Stdio};

use xfn_testkit::child::descendants;
use xfn_testkit::peers::{self, PeerFunction};
use xfn_testkit::{FunctionServer, Registry};

use crate::host_e2e::{crossplane_ca, functions_file, XfnHost};

const NAME: &str = "function-patch-and-transform";

/// The RunFunctionRequest `crossplane render` sends the first step of the
/// function's own example: the example's XR observed, the step's input.
fn request(example: &Path) -> String {
    let read = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(example.join(name)).expect("read the example");
        yaml_serde::from_str(&text).expect("the example's YAML")
    };
    let xr = read("xr.yaml");
    let composition = read("composition.yaml");
    let input = &composition["spec"]["pipeline"][0]["input"];
    assert!(input.is_object(), "the example's first step has an input");
    serde_json::json!({
        "meta": {"tag": "host-peers"},
        "observed": {"composite": {"resource": xr}},
        "input": input,
    })
    .to_string()
}

/// `core-dial` making `calls` calls of `request` to `target`, every name
/// resolved to `address`; over mutual TLS with the CA and client
/// certificate in `tls` (`crossplane_ca`), plaintext without.
fn dial(target: &str, address: &str, tls: Option<&Path>, flags: &[&str], request: &str) -> Output {
    let mut command = Command::new(peers::binary("core-dial"));
    command.args(["-target", target, "-address", address]);
    if let Some(dir) = tls {
        command
            .arg("-ca")
            .arg(dir.join("ca/tls.crt"))
            .arg("-cert")
            .arg(dir.join("client.crt"))
            .arg("-key")
            .arg(dir.join("client.key"));
    }
    let mut child = command
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run core-dial");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.as_bytes())
        .expect("write the request");
    child.wait_with_output().expect("core-dial's output")
}

/// The `desired` state of each answer of a dial that succeeded.
fn desired(what: &str, out: Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{what}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let response: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: {e}: {line}"));
            response["desired"].clone()
        })
        .collect()
}

/// The function's servers under `host` (its entrypoint is `/function`).
fn servers(host: &XfnHost) -> Vec<u32> {
    descendants(host.child.id())
        .into_iter()
        .filter(|(_, cmdline)| cmdline.starts_with("/function"))
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn a_go_function_hosted_answers_core_shaped_calls_as_it_answers_natively() {
    let function = PeerFunction::get(NAME);
    let request = request(&function.example());
    let target = format!("dns:///{NAME}.crossplane-system:9443");

    // Natively, plaintext: what every hosted answer must be.
    let native = FunctionServer::start_command(Command::new(function.binary()));
    let expected = desired(
        "native",
        dial(&target, &native.address, None, &[], &request),
    );
    assert_eq!(expected.len(), 1);
    assert!(
        expected[0]["resources"]
            .as_object()
            .is_some_and(|r| !r.is_empty()),
        "the example composes resources: {}",
        expected[0]
    );
    drop(native);

    let dir = tempfile::tempdir().unwrap();
    crossplane_ca(dir.path());
    let registry = Registry::start();
    let image = function.image(&registry, &format!("{NAME}:peer"));
    let file = functions_file(dir.path(), &[(NAME, &image)]);
    let host = XfnHost::start_tls(dir.path(), &file, &["--server-idle", "3s"]);
    let address = format!("127.0.0.1:{}", host.port);
    let call = |what: &str, flags: &[&str]| {
        desired(
            &format!("{what} through xfn host ({})", function.version()),
            dial(&target, &address, Some(dir.path()), flags, &request),
        )
    };

    // From zero: the first call starts the server.
    assert!(servers(&host).is_empty());
    assert_eq!(call("the first call", &[]), expected);
    assert_eq!(servers(&host).len(), 1, "{}", host.log_text());

    // Warm: three calls on one connection, one server.
    assert_eq!(
        call("warm calls", &["-calls", "3"]),
        vec![expected[0].clone(); 3]
    );
    // v1 alone, and v1beta1 (as core falls back to it for older servers).
    assert_eq!(call("a v1 call", &["-version", "v1"]), expected);
    assert_eq!(call("a v1beta1 call", &["-version", "v1beta1"]), expected);
    assert_eq!(servers(&host).len(), 1, "{}", host.log_text());

    // Killed: the next call is answered by a new server.
    let killed = servers(&host)[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    host.wait_for("the killed server to be gone", || {
        !servers(&host).contains(&killed)
    });
    assert_eq!(call("a call after the server was killed", &[]), expected);
    let replaced = servers(&host);
    assert!(
        replaced.len() == 1 && replaced[0] != killed,
        "{replaced:?}: {}",
        host.log_text()
    );

    // Idle: stopped after --server-idle, started again by the next call.
    host.wait_for("the idle server to stop", || servers(&host).is_empty());
    assert_eq!(call("a call after the idle stop", &[]), expected);
    assert_eq!(host.metric("calls_total", NAME), 8, "{}", host.log_text());
    assert_eq!(
        host.metric("cold_starts_total", NAME),
        3,
        "{}",
        host.log_text()
    );
}
