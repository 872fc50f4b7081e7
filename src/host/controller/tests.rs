//! The reconcile against a recorded API conversation: kube's own client
//! over a scripted service that checks every request against the next
//! expected one (method, path) and answers with the object an API server
//! holding Crossplane v2's objects would. No API server runs here (no
//! kind, no kube-apiserver binary on this machine), so what a real one
//! adds — admission, defaulting beyond what the answers carry, garbage
//! collection, server-side apply merging — is not exercised.

use std::collections::VecDeque;
use std::process::Command;
use std::sync::Mutex;

use base64::Engine;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::json;

use super::*;
use crate::host::controller::Hosting;

const NS: &str = "crossplane-system";
const FUNCTION: &str = "function-patch-and-transform";
const FUNCTION_UID: &str = "5b3c1f0e-7d0a-4c3e-9f4e-1f0f7b7a2c11";
const REVISION: &str = "function-patch-and-transform-a1f3bd2c6e01";
const PACKAGE: &str = "xpkg.crossplane.io/crossplane-contrib/function-patch-and-transform:v0.8.2";

// ---- the fake catalog ----

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Host(HostedFunction),
    Unhost(String),
}

/// Records what it is told; its packages are ready unless its second
/// field says otherwise.
#[derive(Default)]
struct RecordingHosting(
    Mutex<Vec<Call>>,
    Mutex<Option<Readiness>>,
    tokio::sync::watch::Sender<()>,
);

impl Hosting for RecordingHosting {
    fn host(&self, function: HostedFunction) {
        self.0.lock().unwrap().push(Call::Host(function));
    }
    fn unhost(&self, name: &str) {
        self.0.lock().unwrap().push(Call::Unhost(name.to_owned()));
    }
    fn readiness(&self, _: &str) -> Readiness {
        self.1.lock().unwrap().clone().unwrap_or(Readiness::Ready)
    }
    fn readiness_changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.2.subscribe()
    }
}

// ---- the recorded conversation ----

struct Exchange {
    method: &'static str,
    path: String,
    status: u16,
    answer: Value,
}

fn exchange(method: &'static str, path: impl Into<String>, status: u16, answer: Value) -> Exchange {
    Exchange {
        method,
        path: path.into(),
        status,
        answer,
    }
}

#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Option<Value>,
}

#[derive(Default)]
struct Conversation {
    script: Mutex<VecDeque<Exchange>>,
    seen: Mutex<Vec<Request>>,
    wrong: Mutex<Vec<String>>,
}

impl Conversation {
    fn new(script: Vec<Exchange>) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(script.into()),
            ..Self::default()
        })
    }

    /// The conversation went as recorded: every request expected, in order,
    /// none left unasked, and each one allowed by deploy/host's RBAC.
    fn assert_complete(&self) {
        let wrong = self.wrong.lock().unwrap();
        assert!(wrong.is_empty(), "unexpected requests: {wrong:#?}");
        let left: Vec<_> = self
            .script
            .lock()
            .unwrap()
            .iter()
            .map(|e| format!("{} {}", e.method, e.path))
            .collect();
        assert!(left.is_empty(), "requests never made: {left:#?}");
        let rbac = Rbac::shipped();
        for request in self.seen.lock().unwrap().iter() {
            for (group, resource, verb, namespace) in rbac_attributes(request) {
                assert!(
                    rbac.allows(&group, &resource, verb, namespace.as_deref()),
                    "deploy/host/xfn-host.yaml does not allow {verb} {group}/{resource} in {namespace:?} ({} {})",
                    request.method,
                    request.path
                );
            }
        }
    }

    fn writes(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.method != "GET")
            .map(|r| format!("{} {}", r.method, r.path))
            .collect()
    }

    fn body_of(&self, method: &str, path: &str) -> (Request, Value) {
        let mut seen = self.seen.lock().unwrap();
        let at = seen
            .iter()
            .position(|r| r.method == method && r.path == path)
            .unwrap_or_else(|| panic!("no {method} {path} in {seen:#?}"));
        let request = seen.remove(at);
        let body = request.body.clone().expect("a body");
        (request, body)
    }

    fn client(self: &Arc<Self>) -> Client {
        let conversation = Arc::clone(self);
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let conversation = Arc::clone(&conversation);
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await?;
                let seen = Request {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_owned(),
                    query: parts.uri.query().unwrap_or_default().to_owned(),
                    content_type: parts
                        .headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned(),
                    body: serde_json::from_slice(&bytes).ok(),
                };
                let next = conversation.script.lock().unwrap().pop_front();
                let (status, answer) = match next {
                    Some(e) if e.method == seen.method && e.path == seen.path => {
                        (e.status, e.answer)
                    }
                    other => {
                        conversation.wrong.lock().unwrap().push(format!(
                            "{} {}?{} (expected {:?})",
                            seen.method,
                            seen.path,
                            seen.query,
                            other.map(|e| format!("{} {}", e.method, e.path))
                        ));
                        (500, status_of(500, "InternalError"))
                    }
                };
                conversation.seen.lock().unwrap().push(seen);
                let body =
                    kube::client::Body::from(serde_json::to_vec(&answer).unwrap_or_default());
                hyper::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(body)
                    .map_err(|e| kube::Error::Service(e.into()))
            }
        });
        Client::new(service, "default")
    }
}

// ---- deploy/host's RBAC, as the API server would authorize a request ----

struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    /// `None` for a ClusterRole's rule, else the Role's namespace.
    namespace: Option<String>,
}

struct Rbac(Vec<Rule>);

impl Rbac {
    fn shipped() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/host/xfn-host.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let strings = |v: &yaml_serde::Value| -> Vec<String> {
            v.as_sequence()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        let mut rules = Vec::new();
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let doc = <yaml_serde::Value as serde::Deserialize>::deserialize(doc).unwrap();
            let namespace = match doc["kind"].as_str() {
                Some("ClusterRole") => None,
                Some("Role") => Some(doc["metadata"]["namespace"].as_str().unwrap().to_owned()),
                _ => continue,
            };
            for rule in doc["rules"].as_sequence().unwrap() {
                assert!(
                    rule["resourceNames"].is_null(),
                    "no rule by name: this check does not model them"
                );
                rules.push(Rule {
                    groups: strings(&rule["apiGroups"]),
                    resources: strings(&rule["resources"]),
                    verbs: strings(&rule["verbs"]),
                    namespace: namespace.clone(),
                });
            }
        }
        assert!(!rules.is_empty());
        Self(rules)
    }

    fn allows(&self, group: &str, resource: &str, verb: &str, namespace: Option<&str>) -> bool {
        self.0.iter().any(|r| {
            r.groups.iter().any(|g| g == group)
                && r.resources.iter().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
                && (r.namespace.is_none() || r.namespace.as_deref() == namespace)
        })
    }
}

/// What RBAC authorizes a request as: (group, resource[/subresource], verb,
/// namespace). An apply may create its object, so it needs create too.
fn rbac_attributes(request: &Request) -> Vec<(String, String, &'static str, Option<String>)> {
    let parts: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("not an API path: {}", request.path),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] => (Some((*ns).to_owned()), rest),
        rest => (None, rest),
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => panic!("not a resource path: {}", request.path),
    };
    let verbs: &[&'static str] = match (request.method.as_str(), named) {
        ("GET", true) => &["get"],
        ("GET", false) if request.query.contains("watch=true") => &["watch"],
        ("GET", false) => &["list"],
        ("PATCH", _)
            if !resource.contains('/')
                && request.content_type == "application/apply-patch+yaml" =>
        {
            &["patch", "create"]
        }
        ("PATCH", _) => &["patch"],
        ("POST", _) => &["create"],
        ("DELETE", _) => &["delete"],
        (method, _) => panic!("an unexpected method {method}"),
    };
    verbs
        .iter()
        .map(|verb| (group.to_owned(), resource.clone(), *verb, namespace.clone()))
        .collect()
}

fn status_of(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("{reason} (recorded)"), "reason": reason, "code": code})
}

fn not_found() -> Value {
    status_of(404, "NotFound")
}

// ---- objects shaped as Crossplane v2 writes them ----

fn function(deleting: bool) -> Value {
    let mut f = json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "Function",
        "metadata": {
            "name": FUNCTION,
            "uid": FUNCTION_UID,
            "resourceVersion": "48211",
            "generation": 1,
            "creationTimestamp": "2026-11-28T12:00:00Z",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
        },
        "spec": {
            "package": PACKAGE,
            "packagePullPolicy": "IfNotPresent",
            "revisionActivationPolicy": "Automatic",
            "revisionHistoryLimit": 1,
            "ignoreCrossplaneConstraints": false,
            "skipDependencyResolution": false,
            "runtimeConfigRef": {"apiVersion": "pkg.crossplane.io/v1beta1", "kind": "DeploymentRuntimeConfig", "name": "default"}
        },
        "status": {
            "conditions": [
                {"type": "Installed", "status": "True", "reason": "ActivePackageRevision", "lastTransitionTime": "2026-11-28T12:00:05Z"},
                {"type": "Healthy", "status": "True", "reason": "HealthyPackageRevision", "lastTransitionTime": "2026-11-28T12:00:09Z"}
            ],
            "currentRevision": REVISION,
            "currentIdentifier": PACKAGE,
            "resolvedPackage": PACKAGE
        }
    });
    if deleting {
        f["metadata"]["deletionTimestamp"] = json!("2026-11-28T13:00:00Z");
        f["metadata"]["finalizers"] = json!(["function.pkg.crossplane.io"]);
    }
    f
}

fn revision(name: &str, image: &str, number: i64, state: &str, endpoint: Option<&str>) -> Value {
    let mut r = json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "FunctionRevision",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "resourceVersion": "48230",
            "generation": 1,
            "labels": {"pkg.crossplane.io/package": FUNCTION},
            "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "Function", "name": FUNCTION,
                                 "uid": FUNCTION_UID, "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["revision.pkg.crossplane.io"]
        },
        "spec": {
            "desiredState": state,
            "image": image,
            "packagePullPolicy": "IfNotPresent",
            "revision": number,
            "ignoreCrossplaneConstraints": false,
            "skipDependencyResolution": false,
            // Its CRD's default; core copies neither this nor the TLS
            // secret names from the Function with an External runtime
            // (PR #6567), as a real API server showed (tests/cluster.rs).
            "runtimeConfigRef": {"apiVersion": "pkg.crossplane.io/v1beta1", "kind": "DeploymentRuntimeConfig", "name": "default"}
        },
        "status": {
            "conditions": [
                {"type": "RevisionHealthy", "status": "True", "reason": "HealthyPackageRevision", "lastTransitionTime": "2026-11-28T12:00:07Z"}
            ],
            "capabilities": ["composition"],
            "objectRefs": [{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                            "name": "resources.pt.fn.crossplane.io", "uid": "crd-uid"}],
            "resolvedImage": image
        }
    });
    if let Some(endpoint) = endpoint {
        // As this controller writes them beside the endpoint.
        r["status"]["endpoint"] = json!(endpoint);
        r["status"]["tlsServerSecretName"] = json!(format!("{FUNCTION}-tls-server"));
        for (kind, reason) in [
            ("RuntimeHealthy", "HealthyPackageRevision"),
            ("RuntimeActive", "ActiveRuntime"),
        ] {
            r["status"]["conditions"].as_array_mut().unwrap().push(json!(
                {"type": kind, "status": "True", "reason": reason, "lastTransitionTime": "2026-11-28T12:00:11Z"}));
        }
    }
    r
}

fn revision_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "FunctionRevisionList",
           "metadata": {"resourceVersion": "48240"}, "items": items})
}

/// The Service as an API server returns it after this controller's apply:
/// with the defaults and fields it adds.
fn service_as_stored(labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": FUNCTION, "namespace": NS, "uid": "svc-uid", "resourceVersion": "48250",
            "labels": labels,
            "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "Function", "name": FUNCTION, "uid": FUNCTION_UID}],
            "managedFields": [{"manager": "xfn-host", "operation": "Apply", "apiVersion": "v1"}]
        },
        "spec": {
            "clusterIP": "None", "clusterIPs": ["None"], "type": "ClusterIP", "sessionAffinity": "None",
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
            "selector": {"app.kubernetes.io/name": "xfn-host"},
            "ports": [{"name": "grpc", "protocol": "TCP", "port": 9443, "targetPort": "grpc", "appProtocol": "tls"}]
        },
        "status": {"loadBalancer": {}}
    })
}

fn ours() -> Value {
    json!({"app.kubernetes.io/managed-by": "xfn-host"})
}

fn secret(name: &str, data: &[(&str, &[u8])]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    let data: serde_json::Map<_, _> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(b64.encode(v))))
        .collect();
    json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "48260"},
           "data": data})
}

// ---- Crossplane's root CA, made as its initializer makes it ----

struct Ca {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// An RSA 2048 CA with a PKCS#1 key ("RSA PRIVATE KEY"), what Crossplane's
/// initializer stores in `crossplane-root-ca`; made by openssl so that the
/// key reader is tested on a key rcgen did not write.
fn crossplane_ca() -> Ca {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tls.key");
    let cert = dir.path().join("tls.crt");
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "genrsa",
        "-traditional",
        "-out",
        key.to_str().unwrap(),
        "2048",
    ]);
    run(&[
        "req",
        "-x509",
        "-new",
        "-key",
        key.to_str().unwrap(),
        "-out",
        cert.to_str().unwrap(),
        "-days",
        "3650",
        "-subj",
        "/O=Crossplane/ST=Earth/L=Earth/CN=Crossplane",
        "-addext",
        "subjectAltName=DNS:crossplane-root-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    let ca = Ca {
        cert: std::fs::read(&cert).unwrap(),
        key: std::fs::read(&key).unwrap(),
    };
    assert!(String::from_utf8_lossy(&ca.key).contains("BEGIN RSA PRIVATE KEY"));
    ca
}

fn ca_secret(ca: &Ca) -> Value {
    secret(
        "crossplane-root-ca",
        &[("tls.crt", &ca.cert), ("tls.key", &ca.key)],
    )
}

/// The revision's server Secret as stored: a certificate for the
/// Function's names from `issuer`, its key, and `issuer`'s certificate.
fn stored_server_secret(issuer: &Ca) -> Value {
    let issued = issue_server_certificate(
        "crossplane-root-ca",
        &issuer.cert,
        &issuer.key,
        &dns_names(FUNCTION, NS),
    )
    .unwrap();
    secret(
        &server_secret(),
        &[
            ("tls.crt", issued.cert_pem.as_bytes()),
            ("tls.key", issued.key_pem.as_bytes()),
            ("ca.crt", &issuer.cert),
        ],
    )
}

/// The list of the Function's revisions, answered with `items`.
fn revisions(items: Vec<Value>) -> Exchange {
    exchange("GET", REVISIONS_PATH, 200, revision_list(items))
}

/// What a reconcile of the hosted Function reads, up to its server
/// Secret: the Function, its Active revision at its endpoint, its Service,
/// the CA Secret (`ca`) and the server Secret (`stored`).
fn hosted_reads(ca: &Ca, stored: Value) -> Vec<Exchange> {
    let mut reads = reads_to_the_ca("Active");
    reads.extend([
        ca_get(ca),
        exchange("GET", secret_path(&server_secret()), 200, stored),
    ]);
    reads
}

/// What a reconcile of the Function reads before the CA Secret: the
/// Function, its revision in `state` at its endpoint, its Service.
fn reads_to_the_ca(state: &str) -> Vec<Exchange> {
    vec![
        exchange("GET", function_path(), 200, function(false)),
        revisions(vec![revision(REVISION, PACKAGE, 1, state, Some(ENDPOINT))]),
        exchange("GET", service_path(), 200, service_as_stored(ours())),
    ]
}

/// What a reconcile of `function`, whose Active revision `rev` names the
/// DeploymentRuntimeConfig `config` of these `limits`, reads: as
/// `hosted_reads`, then the config.
fn runtime_config_reads(function: Value, rev: Value, config: &str, limits: Value) -> Vec<Exchange> {
    let ca = crossplane_ca();
    vec![
        exchange("GET", function_path(), 200, function),
        exchange("GET", REVISIONS_PATH, 200, revision_list(vec![rev])),
        exchange("GET", service_path(), 200, service_as_stored(ours())),
        ca_get(&ca),
        exchange(
            "GET",
            secret_path(&server_secret()),
            200,
            stored_server_secret(&ca),
        ),
        exchange(
            "GET",
            format!("{CONFIGS_PATH}/{config}"),
            200,
            runtime_config(config, Some(limits)),
        ),
    ]
}

/// The CA Secret, answered with `ca`.
fn ca_get(ca: &Ca) -> Exchange {
    exchange("GET", secret_path("crossplane-root-ca"), 200, ca_secret(ca))
}

/// Verify `cert_pem` as a TLS client dialling `name` and trusting only `ca`
/// would (chain, validity, server auth, the name).
fn verify(ca_pem: &[u8], cert_pem: &[u8], name: &str) -> Result<(), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem).unwrap())
        .unwrap();
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .build()
    .unwrap();
    let cert = CertificateDer::from_pem_slice(cert_pem).unwrap();
    verifier
        .verify_server_cert(
            &cert,
            &[],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

fn san_dns_names(cert_pem: &[u8]) -> Vec<String> {
    let der = CertificateDer::from_pem_slice(cert_pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let san = cert
        .subject_alternative_name()
        .unwrap()
        .expect("a SAN extension");
    san.value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => (*d).to_owned(),
            other => panic!("an unexpected SAN {other:?}"),
        })
        .collect()
}

fn secret_data(body: &Value, key: &str) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    b64.decode(
        body["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} in {body}")),
    )
    .unwrap()
}

// ---- paths ----

fn function_path() -> String {
    format!("/apis/pkg.crossplane.io/v1/functions/{FUNCTION}")
}
const REVISIONS_PATH: &str = "/apis/pkg.crossplane.io/v1/functionrevisions";
fn status_path(revision: &str) -> String {
    format!("{REVISIONS_PATH}/{revision}/status")
}
fn service_path() -> String {
    format!("/api/v1/namespaces/{NS}/services/{FUNCTION}")
}
fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/secrets/{name}")
}
fn server_secret() -> String {
    format!("{FUNCTION}-tls-server")
}
const ENDPOINT: &str = "dns:///function-patch-and-transform.crossplane-system:9443";

fn reconciler(conversation: &Arc<Conversation>) -> (Reconciler, Arc<RecordingHosting>) {
    let catalog = Arc::new(RecordingHosting::default());
    let reconciler = Reconciler::new(
        conversation.client(),
        catalog.clone(),
        ControllerOptions::default(),
    );
    (reconciler, catalog)
}

fn hosted(package: &str) -> Call {
    Call::Host(HostedFunction {
        name: FUNCTION.to_owned(),
        package: package.to_owned(),
        kind: None,
        limits: crate::runner::Limits::default(),
        servers: Default::default(),
    })
}

const CONFIGS_PATH: &str = "/apis/pkg.crossplane.io/v1beta1/deploymentruntimeconfigs";

/// A DeploymentRuntimeConfig as Crossplane stores it, its package-runtime
/// container limited to `limits` (none: the `default` config Crossplane
/// installs, which sets no resources).
fn runtime_config(name: &str, limits: Option<Value>) -> Value {
    let mut spec = json!({});
    if let Some(limits) = limits {
        spec = json!({"deploymentTemplate": {"spec": {"selector": {}, "template": {"spec": {
            "containers": [{"name": "package-runtime", "resources": {
                "requests": {"cpu": "100m", "memory": "32Mi"}, "limits": limits}}]}}}}});
    }
    json!({"apiVersion": "pkg.crossplane.io/v1beta1", "kind": "DeploymentRuntimeConfig",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "48100",
                        "generation": 1, "creationTimestamp": "2026-11-28T11:59:00Z"},
           "spec": spec})
}

/// The `default` config's read at the end of a reconcile that hosts.
fn default_config() -> Exchange {
    exchange(
        "GET",
        format!("{CONFIGS_PATH}/default"),
        200,
        runtime_config("default", None),
    )
}

// ---- the tests ----

#[tokio::test]
async fn a_new_active_revision_gets_a_service_a_certificate_an_endpoint_and_is_hosted() {
    let ca = crossplane_ca();
    let conversation = Conversation::new(vec![
        exchange("GET", function_path(), 200, function(false)),
        revisions(vec![revision(REVISION, PACKAGE, 1, "Active", None)]),
        exchange("GET", service_path(), 404, not_found()),
        exchange("PATCH", service_path(), 200, service_as_stored(ours())),
        ca_get(&ca),
        exchange("GET", secret_path(&server_secret()), 404, not_found()),
        exchange(
            "PATCH",
            secret_path(&server_secret()),
            200,
            secret(&server_secret(), &[]),
        ),
        exchange(
            "PATCH",
            status_path(REVISION),
            200,
            revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT)),
        ),
        default_config(),
    ]);
    let (reconciler, catalog) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(*catalog.0.lock().unwrap(), vec![hosted(PACKAGE)]);

    let list = {
        let seen = conversation.seen.lock().unwrap();
        seen.iter()
            .find(|r| r.path == REVISIONS_PATH)
            .map(|r| r.query.clone())
            .unwrap()
    };
    assert!(
        list.contains("labelSelector=pkg.crossplane.io%2Fpackage%3Dfunction-patch-and-transform"),
        "{list}"
    );

    let (request, service) = conversation.body_of("PATCH", &service_path());
    assert_eq!(request.content_type, "application/apply-patch+yaml");
    assert!(
        request.query.contains("fieldManager=xfn-host") && request.query.contains("force=true"),
        "{}",
        request.query
    );
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(
        service["spec"]["selector"],
        json!({"app.kubernetes.io/name": "xfn-host"})
    );
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "grpc", "protocol": "TCP", "port": 9443, "targetPort": "grpc", "appProtocol": "tls"}])
    );
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["uid"],
        FUNCTION_UID
    );
    assert_eq!(service["metadata"]["labels"], ours());

    let (request, status) = conversation.body_of("PATCH", &status_path(REVISION));
    assert_eq!(request.content_type, "application/apply-patch+yaml");
    assert_eq!(status["status"]["endpoint"], ENDPOINT);
    // The Secret core's establisher reads (a CRD's conversion webhook CA)
    // once a runtime has named it: it waits for it otherwise.
    assert_eq!(status["status"]["tlsServerSecretName"], server_secret());
    // The conditions core's package manager needs to call the Function
    // Healthy, which the Deployment runtime would set (none of core's
    // controllers does with an External runtime).
    let conditions = status["status"]["conditions"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = conditions
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [("RuntimeHealthy", "True"), ("RuntimeActive", "True")]
    );
    assert!(conditions.iter().all(|c| c["lastTransitionTime"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z'))));
    assert_eq!(status["kind"], "FunctionRevision");

    let (_, issued) = conversation.body_of("PATCH", &secret_path(&server_secret()));
    assert_eq!(
        issued.get("type"),
        None,
        "an Opaque Secret, as Crossplane's, whose type cannot change"
    );
    let cert = secret_data(&issued, "tls.crt");
    assert_eq!(secret_data(&issued, "ca.crt"), ca.cert);
    assert!(!secret_data(&issued, "tls.key").is_empty());
    assert_eq!(
        san_dns_names(&cert),
        vec![
            FUNCTION.to_owned(),
            format!("{FUNCTION}.{NS}"),
            format!("{FUNCTION}.{NS}.svc")
        ]
    );
    for name in dns_names(FUNCTION, NS) {
        verify(&ca.cert, &cert, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[tokio::test]
async fn re_reconciling_a_hosted_function_writes_nothing() {
    let ca = crossplane_ca();
    let stored = stored_server_secret(&ca);
    let mut exchanges = hosted_reads(&ca, stored);
    exchanges.push(default_config());
    let conversation = Conversation::new(exchanges);
    let (reconciler, catalog) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(conversation.writes(), Vec::<String>::new());
    assert_eq!(
        *catalog.0.lock().unwrap(),
        vec![hosted(PACKAGE)],
        "the catalog's host is idempotent"
    );
}

#[tokio::test]
async fn a_revision_at_its_endpoint_without_runtime_conditions_gets_them_and_its_secret_name() {
    // What an xfn before this controller wrote: the endpoint only. Core's
    // package manager then kept the Function Unhealthy ("Package runtime
    // health is Unknown") and its establisher waited for the revision's
    // server Secret name (tests/cluster.rs showed both).
    let ca = crossplane_ca();
    let mut exchanges = hosted_reads(&ca, stored_server_secret(&ca));
    let mut old = revision(REVISION, PACKAGE, 1, "Active", None);
    old["status"]["endpoint"] = json!(ENDPOINT);
    exchanges[1] = revisions(vec![old]);
    exchanges.push(exchange(
        "PATCH",
        status_path(REVISION),
        200,
        revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT)),
    ));
    exchanges.push(default_config());
    let conversation = Conversation::new(exchanges);
    let (reconciler, _) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(
        conversation.writes(),
        vec![format!("PATCH {}", status_path(REVISION))]
    );
    let (_, status) = conversation.body_of("PATCH", &status_path(REVISION));
    assert_eq!(status["status"]["tlsServerSecretName"], server_secret());
    assert_eq!(status["status"]["conditions"][0]["type"], "RuntimeHealthy");
    assert_eq!(status["status"]["conditions"][1]["type"], "RuntimeActive");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_issued_again() {
    let old = crossplane_ca();
    let ca = crossplane_ca();
    let stored = stored_server_secret(&old);
    let mut exchanges = hosted_reads(&ca, stored);
    exchanges.push(exchange(
        "PATCH",
        secret_path(&server_secret()),
        200,
        secret(&server_secret(), &[]),
    ));
    exchanges.push(default_config());
    let conversation = Conversation::new(exchanges);
    let (reconciler, _) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    let (_, body) = conversation.body_of("PATCH", &secret_path(&server_secret()));
    verify(&ca.cert, &secret_data(&body, "tls.crt"), FUNCTION).unwrap();
    assert!(verify(&old.cert, &secret_data(&body, "tls.crt"), FUNCTION).is_err());
}

#[tokio::test]
async fn an_upgrade_hosts_the_newly_active_revisions_package_at_its_endpoint() {
    let ca = crossplane_ca();
    let stored = stored_server_secret(&ca);
    let new_package = "xpkg.crossplane.io/crossplane-contrib/function-patch-and-transform:v0.9.0";
    let new_revision = "function-patch-and-transform-77c0e9d4b512";
    let conversation = Conversation::new(vec![
        exchange("GET", function_path(), 200, function(false)),
        revisions(vec![
            revision(REVISION, PACKAGE, 1, "Inactive", Some(ENDPOINT)),
            revision(new_revision, new_package, 2, "Active", None),
        ]),
        exchange("GET", service_path(), 200, service_as_stored(ours())),
        ca_get(&ca),
        exchange("GET", secret_path(&server_secret()), 200, stored),
        exchange(
            "PATCH",
            status_path(new_revision),
            200,
            revision(new_revision, new_package, 2, "Active", Some(ENDPOINT)),
        ),
        default_config(),
    ]);
    let (reconciler, catalog) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(*catalog.0.lock().unwrap(), vec![hosted(new_package)]);
}

#[tokio::test]
async fn a_revision_becoming_inactive_unhosts_the_function_and_deletes_its_service() {
    let mut reads = reads_to_the_ca("Inactive");
    reads.push(exchange(
        "DELETE",
        service_path(),
        200,
        service_as_stored(ours()),
    ));
    let conversation = Conversation::new(reads);
    let (reconciler, catalog) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(
        *catalog.0.lock().unwrap(),
        vec![Call::Unhost(FUNCTION.to_owned())]
    );
    assert_eq!(
        conversation.writes(),
        vec![format!("DELETE {}", service_path())]
    );
}

#[tokio::test]
async fn a_deleted_function_is_unhosted_and_its_service_deleted() {
    for (what, answer) in [
        ("gone", (404, not_found())),
        ("being deleted", (200, function(true))),
    ] {
        let conversation = Conversation::new(vec![
            exchange("GET", function_path(), answer.0, answer.1),
            exchange("GET", service_path(), 200, service_as_stored(ours())),
            exchange("DELETE", service_path(), 200, service_as_stored(ours())),
        ]);
        let (reconciler, catalog) = reconciler(&conversation);

        reconciler.reconcile(FUNCTION).await.unwrap();

        conversation.assert_complete();
        assert_eq!(
            *catalog.0.lock().unwrap(),
            vec![Call::Unhost(FUNCTION.to_owned())],
            "{what}"
        );
    }
}

#[tokio::test]
async fn a_deleted_function_whose_service_is_gone_writes_nothing() {
    let conversation = Conversation::new(vec![
        exchange("GET", function_path(), 404, not_found()),
        exchange("GET", service_path(), 404, not_found()),
    ]);
    let (reconciler, catalog) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(conversation.writes(), Vec::<String>::new());
    assert_eq!(
        *catalog.0.lock().unwrap(),
        vec![Call::Unhost(FUNCTION.to_owned())]
    );
}

#[tokio::test]
async fn a_service_another_controller_made_is_never_deleted() {
    let conversation = Conversation::new(vec![
        exchange("GET", function_path(), 404, not_found()),
        exchange(
            "GET",
            service_path(),
            200,
            service_as_stored(json!({"app": "someone-else"})),
        ),
    ]);
    let (reconciler, _) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(conversation.writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_missing_ca_is_an_error_naming_the_secret_and_hosts_nothing() {
    let mut reads = reads_to_the_ca("Active");
    reads.push(exchange(
        "GET",
        secret_path("crossplane-root-ca"),
        404,
        not_found(),
    ));
    let conversation = Conversation::new(reads);
    let (reconciler, catalog) = reconciler(&conversation);

    let error = reconciler.reconcile(FUNCTION).await.unwrap_err();

    conversation.assert_complete();
    assert!(
        matches!(&error, ControllerError::CaIncomplete { name, key: "tls.crt" } if name == "crossplane-root-ca"),
        "{error:?}"
    );
    assert!(catalog.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_api_error_keeps_its_status_as_the_source() {
    let conversation = Conversation::new(vec![exchange(
        "GET",
        function_path(),
        403,
        status_of(403, "Forbidden"),
    )]);
    let (reconciler, _) = reconciler(&conversation);

    let error = reconciler.reconcile(FUNCTION).await.unwrap_err();

    conversation.assert_complete();
    let ControllerError::Api {
        verb: "get",
        kind: "Function",
        source: kube::Error::Api(status),
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(status.code, 403);
}

#[test]
fn the_server_certificate_verifies_only_for_the_services_names_and_only_against_its_ca() {
    let ca = crossplane_ca();
    let other = crossplane_ca();
    let issued = issue_server_certificate(
        "crossplane-root-ca",
        &ca.cert,
        &ca.key,
        &dns_names(FUNCTION, NS),
    )
    .unwrap();
    let cert = issued.cert_pem.as_bytes();
    for name in dns_names(FUNCTION, NS) {
        verify(&ca.cert, cert, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(verify(&ca.cert, cert, "function-auto-ready.crossplane-system").is_err());
    assert!(verify(&other.cert, cert, FUNCTION).is_err());
}

#[test]
fn a_ca_key_that_is_not_a_key_is_a_ca_error() {
    let ca = crossplane_ca();
    let error = issue_server_certificate(
        "crossplane-root-ca",
        &ca.cert,
        b"not a key",
        &dns_names(FUNCTION, NS),
    )
    .err()
    .unwrap();
    assert!(matches!(error, ControllerError::Ca { .. }), "{error:?}");
}

#[tokio::test]
async fn revision_events_ask_for_their_function_and_a_relist_for_every_hosted_one() {
    let conversation = Conversation::new(vec![]);
    let (reconciler, _) = reconciler(&conversation);
    reconciler.set_hosted("function-auto-ready", true);
    let rev: DynamicObject =
        serde_json::from_value(revision(REVISION, PACKAGE, 1, "Active", None)).unwrap();
    assert_eq!(
        reconciler.names_of(watcher::Event::Delete(rev), parent_function),
        vec![FUNCTION.to_owned()]
    );
    assert_eq!(
        reconciler.names_of(watcher::Event::Init, parent_function),
        vec!["function-auto-ready".to_owned()]
    );
    conversation.assert_complete();
}

#[tokio::test]
async fn a_revision_event_reconciles_its_function_and_a_watch_ending_is_an_error() {
    let conversation = Conversation::new(vec![
        exchange("GET", function_path(), 404, not_found()),
        exchange("GET", service_path(), 404, not_found()),
    ]);
    let (reconciler, catalog) = reconciler(&conversation);
    let rev: DynamicObject =
        serde_json::from_value(revision(REVISION, PACKAGE, 1, "Inactive", None)).unwrap();
    let revision_events = futures::stream::iter([Ok(watcher::Event::Delete(rev))]);

    let error = drive(
        reconciler,
        futures::stream::pending(),
        revision_events,
        futures::stream::pending(),
    )
    .await
    .unwrap_err();

    assert!(
        matches!(
            error,
            ControllerError::WatchEnded {
                kind: "FunctionRevision"
            }
        ),
        "{error:?}"
    );
    conversation.assert_complete();
    assert_eq!(
        *catalog.0.lock().unwrap(),
        vec![Call::Unhost(FUNCTION.to_owned())]
    );
}

#[tokio::test]
async fn a_function_is_hosted_with_the_limits_of_the_runtime_config_its_revision_names() {
    let mut limited = function(false);
    limited["metadata"]["annotations"]["xfn.crossplane.io/pids-limit"] = json!("128");
    limited["metadata"]["annotations"]["xfn.crossplane.io/min-servers"] = json!("2");
    limited["metadata"]["annotations"]["xfn.crossplane.io/network-policy"] = json!("Runner");
    limited["spec"]["runtimeConfigRef"]["name"] = json!("small");
    let mut rev = revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT));
    rev["spec"]["runtimeConfigRef"]["name"] = json!("small");
    let conversation = Conversation::new(runtime_config_reads(
        limited,
        rev,
        "small",
        json!({"cpu": "250m", "memory": "64Mi"}),
    ));
    let (reconciler, catalog) = reconciler(&conversation);

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(conversation.writes(), Vec::<String>::new());
    assert_eq!(
        *catalog.0.lock().unwrap(),
        vec![Call::Host(HostedFunction {
            name: FUNCTION.to_owned(),
            package: PACKAGE.to_owned(),
            kind: None,
            limits: crate::runner::Limits {
                cpu_millis: Some(250),
                memory_bytes: Some(64 << 20),
                pids: Some(128),
            },
            servers: crate::host::runtime_config::ServerSettings {
                min_servers: Some(2),
                network: Some(crate::runner::NetworkPolicy::Runner),
                ..Default::default()
            },
        })]
    );
}

#[tokio::test]
async fn a_runtime_config_whose_limit_is_no_quantity_fails_the_reconcile_and_hosts_nothing() {
    let mut rev = revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT));
    rev["spec"]["runtimeConfigRef"]["name"] = json!("typo");
    let conversation = Conversation::new(runtime_config_reads(
        function(false),
        rev,
        "typo",
        json!({"memory": "64 MB"}),
    ));
    let (reconciler, catalog) = reconciler(&conversation);

    let error = reconciler.reconcile(FUNCTION).await.unwrap_err();

    conversation.assert_complete();
    assert!(
        crate::chain::Chain(&error).to_string().contains(
            "DeploymentRuntimeConfig typo: container package-runtime's resources.limits.memory"
        ),
        "{}",
        crate::chain::Chain(&error)
    );
    assert_eq!(*catalog.0.lock().unwrap(), Vec::<Call>::new());
}

#[tokio::test]
async fn a_runtime_config_changing_asks_for_every_hosted_function_and_its_relist_for_none() {
    let conversation = Conversation::new(vec![]);
    let (reconciler, _) = reconciler(&conversation);
    reconciler.set_hosted(FUNCTION, true);
    reconciler.set_hosted("function-auto-ready", true);
    let config: DynamicObject =
        serde_json::from_value(runtime_config("small", Some(json!({"memory": "64Mi"})))).unwrap();
    let mut everyone = vec!["function-auto-ready".to_owned(), FUNCTION.to_owned()];
    everyone.sort();
    assert_eq!(
        reconciler.names_using(&watcher::Event::Apply(config.clone())),
        everyone
    );
    assert_eq!(
        reconciler.names_using(&watcher::Event::Delete(config.clone())),
        everyone
    );
    assert!(reconciler
        .names_using(&watcher::Event::InitApply(config))
        .is_empty());
    conversation.assert_complete();
}

/// The Active revision at its endpoint as stored once this controller
/// wrote its `RuntimeHealthy` `status` for `reason`, saying `why`.
fn revision_health(status: &str, reason: &str, why: &str) -> Value {
    let mut r = revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT));
    for c in r["status"]["conditions"].as_array_mut().unwrap() {
        if c["type"] == "RuntimeHealthy" {
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(format!("xfn host: {why}"));
        }
    }
    r
}

const PULLING: &str = "its package is being pulled";

fn revision_pulling() -> Value {
    revision_health("Unknown", "UnknownPackageRevisionHealth", PULLING)
}

/// A reconcile of the hosted Function whose Active revision is stored as
/// `stored`, writing its status (answered with `written`) when given.
fn reconcile_of(ca: &Ca, stored: Value, written: Option<Value>) -> Vec<Exchange> {
    let mut exchanges = hosted_reads(ca, stored_server_secret(ca));
    exchanges[1] = revisions(vec![stored]);
    if let Some(written) = written {
        exchanges.push(exchange("PATCH", status_path(REVISION), 200, written));
    }
    exchanges.push(default_config());
    exchanges
}

/// The `RuntimeHealthy` condition of a status apply's body.
fn runtime_healthy(status: &Value) -> Value {
    status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RuntimeHealthy")
        .cloned()
        .unwrap()
}

#[tokio::test]
async fn a_package_whose_pull_failed_makes_its_revision_runtime_unhealthy_saying_why() {
    let why = "its package failed: manifest unknown";
    let ca = crossplane_ca();
    let failed = revision_health("False", "UnhealthyPackageRevision", why);
    let conversation = Conversation::new(reconcile_of(&ca, revision_pulling(), Some(failed)));
    let (reconciler, catalog) = reconciler(&conversation);
    *catalog.1.lock().unwrap() = Some(Readiness::Failed(why.to_owned()));

    reconciler.reconcile(FUNCTION).await.unwrap();

    conversation.assert_complete();
    assert_eq!(*catalog.0.lock().unwrap(), vec![hosted(PACKAGE)]);
    let (_, status) = conversation.body_of("PATCH", &status_path(REVISION));
    let condition = runtime_healthy(&status);
    assert_eq!(condition["status"], "False", "{condition}");
    assert_eq!(condition["reason"], "UnhealthyPackageRevision");
    assert_eq!(condition["message"], format!("xfn host: {why}"));
    assert_ne!(
        condition["lastTransitionTime"], "2026-11-28T12:00:11Z",
        "a new status, a new transition"
    );
    let active = &status["status"]["conditions"][1];
    assert_eq!(
        (
            &active["type"],
            &active["status"],
            &active["lastTransitionTime"]
        ),
        (
            &json!("RuntimeActive"),
            &json!("True"),
            &json!("2026-11-28T12:00:11Z")
        ),
        "RuntimeActive unchanged"
    );
}

#[tokio::test]
async fn a_replica_not_ready_overwrites_neither_another_replicas_health_nor_its_failure() {
    // Before, a second replica still pulling and one serving rewrote the
    // condition at each other's writes (tests/cluster.rs: the revisions'
    // resourceVersions kept changing).
    let ca = crossplane_ca();
    let healthy = revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT));
    let failed = revision_health("False", "UnhealthyPackageRevision", "its package failed: A");
    let cases = [
        (healthy.clone(), Readiness::Pending(PULLING.to_owned())),
        (
            healthy,
            Readiness::Failed("its package failed: B".to_owned()),
        ),
        (failed.clone(), Readiness::Pending(PULLING.to_owned())),
        (
            failed,
            Readiness::Failed("its package failed: B".to_owned()),
        ),
        (
            revision_pulling(),
            Readiness::Pending("not hosted yet".to_owned()),
        ),
    ];
    for (stored, readiness) in cases {
        let conversation = Conversation::new(reconcile_of(&ca, stored, None));
        let (reconciler, catalog) = reconciler(&conversation);
        *catalog.1.lock().unwrap() = Some(readiness.clone());

        reconciler.reconcile(FUNCTION).await.unwrap();

        conversation.assert_complete();
        assert_eq!(conversation.writes(), Vec::<String>::new(), "{readiness:?}");
    }
}

#[tokio::test]
async fn a_package_becoming_ready_reconciles_its_function_again_and_makes_it_healthy() {
    let ca = crossplane_ca();
    let healthy = revision(REVISION, PACKAGE, 1, "Active", Some(ENDPOINT));
    // Hosted while its package is pulled; then the resync at the start of
    // the loop: nothing to write either time.
    let mut script = reconcile_of(&ca, revision_pulling(), None);
    script.extend(reconcile_of(&ca, revision_pulling(), None));
    // Ready: healthy.
    let after_ready = reconcile_of(&ca, revision_pulling(), Some(healthy));
    let left_when_ready = after_ready.len();
    script.extend(after_ready);
    let conversation = Conversation::new(script);
    let (reconciler, catalog) = reconciler(&conversation);
    *catalog.1.lock().unwrap() = Some(Readiness::Pending(PULLING.to_owned()));
    reconciler.reconcile(FUNCTION).await.unwrap();
    assert_eq!(conversation.writes(), Vec::<String>::new());
    // The package becomes ready once the loop's first reconcile is done;
    // the loop ends once the ready reconcile is (its last watch ending).
    let left = {
        let conversation = Arc::clone(&conversation);
        move || conversation.script.lock().unwrap().len()
    };
    let hosting = Arc::clone(&catalog);
    let ready_then_end = futures::stream::once(async move {
        while left() > left_when_ready {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        *hosting.1.lock().unwrap() = None;
        hosting.2.send_replace(());
        while left() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .filter_map(|()| async { None });
    let ended = tokio::time::timeout(
        Duration::from_secs(60),
        drive(
            reconciler,
            futures::stream::pending(),
            futures::stream::pending(),
            ready_then_end,
        ),
    )
    .await
    .expect("the readiness change never reconciled the function (a bound, not a timing)");

    assert!(
        matches!(
            ended,
            Err(ControllerError::WatchEnded {
                kind: "DeploymentRuntimeConfig"
            })
        ),
        "{ended:?}"
    );
    conversation.assert_complete();
    let (_, status) = conversation.body_of("PATCH", &status_path(REVISION));
    let condition = runtime_healthy(&status);
    assert_eq!(condition["status"], "True", "{condition}");
    assert_eq!(condition["reason"], "HealthyPackageRevision");
    assert_eq!(condition.get("message"), None);
}
