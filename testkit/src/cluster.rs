//! A real Crossplane control plane for the tests (scripts/cluster.sh): etcd,
//! kube-apiserver, a garbage-collecting kube-controller-manager, Crossplane
//! core with `--package-runtime=Function=External`, and `xfn host`
//! replicas in controller mode serving every Function.
//!
//! Invariant: a missing cluster binary fails the test that needs it, naming
//! `scripts/cluster.sh build`, never a skip: an end-to-end case that did not
//! run must not read as one that passed. The cluster is stopped (every
//! process `up` started, by its pid) when the [`Cluster`] drops, panics
//! included. One cluster at a time per loopback net: its `xfn host`
//! replicas listen on 127.0.45.N:9443 (core dials port 9443 of the
//! Function's name, as it would a pod's); `XFN_CLUSTER_NET=127.X.Y` in the
//! environment moves them, for a second cluster beside it.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{function_server_binary, ImageBuilder, Layer, Registry};

/// Where scripts/cluster.sh builds (`XFN_CLUSTER_CACHE` overrides it, for
/// both).
pub const CACHE: &str = "/var/cache/xfn-test/cluster";

/// The binaries scripts/cluster.sh builds.
pub const BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
    "crossplane-core",
];

/// Crossplane's namespace in the cluster.
pub const NAMESPACE: &str = "crossplane-system";

fn cache() -> PathBuf {
    PathBuf::from(std::env::var("XFN_CLUSTER_CACHE").unwrap_or_else(|_| CACHE.into()))
}

fn script() -> PathBuf {
    crate::repo_root().join("scripts/cluster.sh")
}

/// A running control plane, stopped on drop.
pub struct Cluster {
    run: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the control plane and `xfn host` replica 1 (the binary cargo
    /// built) in a run directory of its own; panics naming
    /// scripts/cluster.sh when a binary is missing or it does not come up.
    pub fn up() -> Cluster {
        for name in BINARIES {
            let path = cache().join("bin").join(name);
            assert!(
                path.is_file(),
                "the cluster binary {} is missing: run scripts/cluster.sh build (it builds \
                 etcd, kube-apiserver, kube-controller-manager, kubectl and Crossplane core \
                 from the Go module proxy)",
                path.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("xfn-cluster-")
            .tempdir()
            .unwrap();
        // xfn host reads its kubeconfig inside its user namespace, where
        // a 0700 directory of root's is not its own.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let cluster = Cluster {
            run: dir.path().join("run"),
            _dir: dir,
        };
        cluster.script(&["up"]);
        cluster
    }

    /// Runs scripts/cluster.sh with this cluster's run directory; panics
    /// with its output and the logs when it fails.
    pub fn script(&self, args: &[&str]) {
        let output = Command::new(script())
            .args(args)
            .env("XFN_CLUSTER_RUN", &self.run)
            .env("XFN", crate::xfn_binary())
            .output()
            .expect("run scripts/cluster.sh");
        assert!(
            output.status.success(),
            "scripts/cluster.sh {} failed: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr),
            self.logs()
        );
    }

    /// `scripts/cluster.sh host VERB N`: start, stop (SIGTERM, drained) or
    /// kill (SIGKILL) replica N of `xfn host`.
    pub fn host(&self, verb: &str, replica: u8) {
        self.script(&["host", verb, &replica.to_string()]);
    }

    /// The run directory (logs under `log/`, the pids under `pid/`).
    pub fn run_dir(&self) -> &Path {
        &self.run
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.run.join("admin.kubeconfig")
    }

    /// `kubectl ARGS` as the admin: its stdout, or its stderr as the error.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new(cache().join("bin/kubectl"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        let mut input = child.stdin.take().expect("kubectl's stdin");
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("write kubectl's stdin");
        drop(input);
        let output = child.wait_with_output().expect("wait for kubectl");
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// `kubectl ARGS`, which must succeed.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None)
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        if let Err(e) = self.try_kubectl(&["apply", "-f", "-"], Some(yaml)) {
            panic!("kubectl apply: {e}\n{yaml}");
        }
    }

    /// An object as JSON (`kubectl get RESOURCE NAME -o json`, `-n NS` when
    /// given), `None` when it does not exist.
    pub fn get(&self, resource: &str, name: &str, namespace: Option<&str>) -> Option<Value> {
        let mut args = vec!["get", resource, name, "-o", "json"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        match self.try_kubectl(&args, None) {
            Ok(json) => Some(serde_json::from_str(&json).expect("kubectl's JSON")),
            Err(e) if e.contains("NotFound") => None,
            Err(e) => panic!("kubectl {}: {e}", args.join(" ")),
        }
    }

    /// The items of `kubectl get RESOURCE [-l SELECTOR] [-n NS | -A]`.
    pub fn list(
        &self,
        resource: &str,
        selector: Option<&str>,
        namespace: Option<&str>,
    ) -> Vec<Value> {
        let mut args = vec!["get", resource, "-o", "json"];
        if let Some(selector) = selector {
            args.extend(["-l", selector]);
        }
        match namespace {
            Some(ns) => args.extend(["-n", ns]),
            None => args.push("-A"),
        }
        let list: Value = serde_json::from_str(&self.kubectl(&args)).expect("kubectl's JSON");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Polls `check` every 500 ms until it gives a value; panics after
    /// `patience` naming `what`, with the last state `check` described and
    /// the components' logs. A generous bound on a wait that would
    /// otherwise never end, not a timing claim.
    pub fn wait<T>(
        &self,
        what: &str,
        patience: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> T {
        let started = Instant::now();
        loop {
            match check() {
                Ok(value) => return value,
                Err(last) if started.elapsed() > patience => panic!(
                    "{what}: not within {patience:?}; last: {last}\n{}",
                    self.logs()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// A component's log (`crossplane-core`, `xfn-host-1`, …).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.run.join("log").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    /// The last lines of every component's log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir(self.run.join("log"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out += &format!(
                "--- {} (last {} lines)\n{}\n",
                entry.path().display(),
                tail.len(),
                tail.join("\n")
            );
        }
        out
    }

    /// The pid of a component `up` started.
    pub fn pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.run.join("pid").join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .env("XFN_CLUSTER_RUN", &self.run)
            .status();
    }
}

/// The status of condition `kind` of an object (`"True"`, `"False"`, …).
pub fn condition(object: &Value, kind: &str) -> Option<String> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
}

/// A condition's type, status, reason and message, for a failure's message.
pub fn conditions(object: &Value) -> String {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} ({}: {})",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A Crossplane Function package of the tests' own function server
/// (`tests/fixtures/fn_server.rs`) as an xpkg: busybox, `/fn_server` as
/// entrypoint, `FN_VERSION=version` in its environment (its `env` action
/// reads it back, so a caller can tell which package answered), and the
/// package metadata layer (`package.yaml`, a `meta.pkg.crossplane.io`
/// Function, annotated `io.crossplane.xpkg: base`) as `crossplane xpkg
/// build` lays it out. Returns its reference.
pub fn function_server_package(registry: &Registry, name: &str, version: &str) -> String {
    let binary = std::fs::read(function_server_binary()).expect("read the static fn_server");
    let package = format!(
        "apiVersion: meta.pkg.crossplane.io/v1beta1\nkind: Function\nmetadata:\n  name: {name}\n  \
         annotations:\n    meta.crossplane.io/description: xfn's test function server {version}\nspec: {{}}\n"
    );
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(
            Layer::new()
                .compression(crate::Compression::None)
                .file("/fn_server", 0o755, binary),
        )
        .layer(
            Layer::new()
                .file("/package.yaml", 0o644, package)
                .annotation("io.crossplane.xpkg", "base"),
        )
        .entrypoint(["/fn_server"])
        .env(["PATH=/bin".to_owned(), format!("FN_VERSION={version}")])
        .push(registry, &format!("{name}:{version}"))
        .reference
}
