//! The deployment files (deploy/) validated offline against the Kubernetes
//! schemas by `tests/deploy/validate.py` (kubernetes-validate, strict),
//! which says what it validates as what, and what it cannot (Crossplane's
//! own kinds; no cluster is involved).
//!
//! Needs: python3 with kubernetes-validate and PyYAML (scripts/setup.sh).

#[test]
fn every_deployment_manifest_validates_against_the_kubernetes_schemas() {
    let repo = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("python3")
        .arg(format!("{repo}/tests/deploy/validate.py"))
        .arg(repo)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'kubernetes_validate'"),
        "kubernetes-validate is not installed: run scripts/setup.sh"
    );
    assert!(
        out.status.success() && stdout.contains("deploy-valid"),
        "{stdout}\n{stderr}"
    );
}

/// The sidecar's cache is an emptyDir with a `sizeLimit`, past which the
/// kubelet evicts the pod: its budget (`--cache-max-size`) plus one pull
/// in flight (unpacked and its blobs kept: at most twice
/// `--max-image-size`) must stay below it. Both flags must be given, as
/// xfn's defaults (10Gi, 4Gi) are for a node's disk, not a small emptyDir.
#[test]
fn the_sidecars_cache_budget_and_a_pull_in_flight_fit_its_empty_dir_size_limit() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/crossplane-v1.13/values.yaml"
    );
    let text = std::fs::read_to_string(path).expect("read values.yaml");
    let values: yaml_serde::Value = yaml_serde::from_str(&text).expect("values.yaml is YAML");
    let xfn = &values["xfn"];
    let bytes = |quantity: &str| {
        xfn::quantity::Quantity::parse(quantity)
            .and_then(|q| q.bytes())
            .unwrap_or_else(|e| panic!("{quantity}: {e}"))
    };
    let flag = |name: &str| {
        let prefix = format!("--{name}=");
        let args = xfn["args"].as_sequence().expect("xfn.args is a list");
        let value = args
            .iter()
            .filter_map(|arg| arg.as_str()?.strip_prefix(prefix.as_str()))
            .next()
            .unwrap_or_else(|| panic!("xfn.args gives no {prefix}"));
        bytes(value)
    };
    let size_limit = bytes(
        xfn["cache"]["sizeLimit"]
            .as_str()
            .expect("xfn.cache.sizeLimit"),
    );
    let budget = flag("cache-max-size");
    let image = flag("max-image-size");
    assert!(
        budget + 2 * image < size_limit,
        "--cache-max-size ({budget}) + 2 x --max-image-size ({image}) must stay below the emptyDir sizeLimit ({size_limit})"
    );
}

fn manifest(path: &str) -> String {
    let path = format!("{}/deploy/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The capabilities xfn maps its pod's ids with, and no other: SETUID and
/// SETGID for the ids, SETFCAP because the map holds the pod's uid 0 (xfn),
/// which Linux 5.12+ allows only with it (`src/sandbox/userns.rs`). All
/// three are the pod's user namespace's, not the node's.
const POD_ROOT_CAPABILITIES: [&str; 3] = ["SETFCAP", "SETGID", "SETUID"];

/// Asserts that a container's `securityContext` (with its pod's, where
/// given, under it) is the shipped shape: the pod's root (uid and gid 0),
/// no privilege escalation, every capability dropped but
/// [`POD_ROOT_CAPABILITIES`].
fn assert_pod_root(what: &str, container: &yaml_serde::Value) {
    let int = |key: &str| container[key].as_u64();
    assert_eq!(int("runAsUser"), Some(0), "{what}: runAsUser");
    assert_eq!(int("runAsGroup"), Some(0), "{what}: runAsGroup");
    assert_ne!(container["runAsNonRoot"].as_bool(), Some(true), "{what}");
    assert_eq!(
        container["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_ne!(container["privileged"].as_bool(), Some(true), "{what}");
    let names = |key: &str| -> Vec<&str> {
        let mut names: Vec<&str> = container["capabilities"][key]
            .as_sequence()
            .unwrap_or_else(|| panic!("{what}: capabilities.{key} is a list"))
            .iter()
            .map(|c| c.as_str().expect("a capability name"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(names("drop"), ["ALL"], "{what}");
    assert_eq!(names("add"), POD_ROOT_CAPABILITIES, "{what}");
}

/// The shipped xfn containers run as the root of their pod's own user
/// namespace with only the capabilities that map the pod's ids, so that
/// functions get host ids that are not xfn's (issue 22: a function's epoll
/// watches are then not the gatekeeper's); the fallbacks for clusters that
/// refuse that shape go back to uid 65532 without capabilities.
#[test]
fn the_shipped_xfn_containers_are_their_pods_root_with_only_the_id_mapping_capabilities() {
    // Crossplane v1.11–v1.13: the chart's values, and the post-renderer's
    // patch for the pod.
    let values: yaml_serde::Value = yaml_serde::from_str(&manifest("crossplane-v1.13/values.yaml"))
        .expect("values.yaml is YAML");
    assert_pod_root(
        "values.yaml xfn.securityContext",
        &values["xfn"]["securityContext"],
    );
    let patch: yaml_serde::Value =
        yaml_serde::from_str(&manifest("crossplane-v1.13/hostusers-patch.yaml")).expect("YAML");
    assert_eq!(
        patch["spec"]["template"]["spec"]["hostUsers"].as_bool(),
        Some(false)
    );
    // Crossplane's own container runs as the chart's 65532, not as xfn's 0.
    let args = values["xfn"]["args"].as_sequence().expect("xfn.args");
    assert!(
        args.iter().any(|a| a.as_str() == Some("--allow-uid=65532")),
        "{args:?}"
    );
    // v1.14+/v2: the Function's DeploymentRuntimeConfig.
    let text = manifest("function/function.yaml");
    let drc = yaml_serde::Deserializer::from_str(&text)
        .map(|doc| <yaml_serde::Value as serde::Deserialize>::deserialize(doc).expect("YAML"))
        .find(|doc| doc["kind"].as_str() == Some("DeploymentRuntimeConfig"))
        .expect("a DeploymentRuntimeConfig");
    let pod = &drc["spec"]["deploymentTemplate"]["spec"]["template"]["spec"];
    assert_eq!(pod["hostUsers"].as_bool(), Some(false));
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(0));
    let container = &pod["containers"][0];
    assert_eq!(container["name"].as_str(), Some("package-runtime"));
    assert_pod_root(
        "function.yaml package-runtime",
        &container["securityContext"],
    );

    // The fallbacks: 65532, nothing added.
    let shared: yaml_serde::Value =
        yaml_serde::from_str(&manifest("crossplane-v1.13/values-shared-uid.yaml")).expect("YAML");
    let sc = &shared["xfn"]["securityContext"];
    assert_eq!(sc["runAsUser"].as_u64(), Some(65532));
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        sc["capabilities"]["add"].as_sequence().map(Vec::len),
        Some(0)
    );
    // Helm replaces the args list: the fallback keeps values.yaml's,
    // accepts the shared uid, which `xfn start` refuses otherwise, and
    // keeps its cache in a dir of its own (below).
    let values: yaml_serde::Value =
        yaml_serde::from_str(&manifest("crossplane-v1.13/values.yaml")).expect("YAML");
    let args = |values: &yaml_serde::Value| -> Vec<String> {
        values["xfn"]["args"]
            .as_sequence()
            .expect("xfn.args")
            .iter()
            .map(|arg| arg.as_str().expect("a string").to_string())
            .collect()
    };
    let mut expected = args(&values);
    expected.push("--allow-shared-uid".to_string());
    expected.push("--cache-dir=/var/cache/xfn".to_string());
    assert_eq!(args(&shared), expected);
    let ops: yaml_serde::Value =
        yaml_serde::from_str(&manifest("function/shared-uid-patch.yaml")).expect("YAML");
    let replaced = |suffix: &str| {
        ops.as_sequence()
            .expect("a JSON patch is a list")
            .iter()
            .find(|op| op["path"].as_str().is_some_and(|p| p.ends_with(suffix)))
            .map(|op| op["value"].clone())
            .unwrap_or_else(|| panic!("the patch replaces no {suffix}"))
    };
    assert_eq!(
        replaced("containers/0/securityContext/runAsUser").as_u64(),
        Some(65532)
    );
    assert!(replaced("containers/0/securityContext/capabilities")["add"].is_null());

    // As 65532 xfn refuses the /xfn emptyDir (root's, 0777: issue 31), so
    // both fallbacks keep the cache in the image's dir of 65532's own.
    assert_eq!(
        replaced("containers/0/env")[0]["value"].as_str(),
        Some("/var/cache/xfn")
    );
    assert!(shared["xfn"]["args"]
        .as_sequence()
        .expect("xfn.args")
        .iter()
        .any(|a| a.as_str() == Some("--cache-dir=/var/cache/xfn")));
    assert!(manifest("../Dockerfile").contains(
        "mkdir -p /var/cache/xfn && chown 65532:65532 /var/cache/xfn && chmod 0700 /var/cache/xfn"
    ));
}

/// The documents of a multi-document manifest, by kind.
fn documents(path: &str) -> Vec<yaml_serde::Value> {
    let text = manifest(path);
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| <yaml_serde::Value as serde::Deserialize>::deserialize(doc).expect("YAML"))
        .collect()
}

fn of_kind<'a>(docs: &'a [yaml_serde::Value], kind: &str) -> &'a yaml_serde::Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// `xfn host` runs in the shipped shape: the pod's root in a user
/// namespace of its own, with only the capabilities that map its ids.
#[test]
fn the_host_deployment_is_its_pods_root_with_only_the_id_mapping_capabilities() {
    let docs = documents("host/xfn-host.yaml");
    let pod = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["hostUsers"].as_bool(), Some(false));
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(0));
    let container = &pod["containers"][0];
    assert_pod_root("xfn-host.yaml xfn-host", &container["securityContext"]);
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
}

/// The host Deployment's command line is one `xfn host` takes: every flag
/// it gives exists (clap refuses an unknown one before it reads `--help`).
#[test]
fn the_host_deployments_args_are_flags_xfn_host_knows() {
    let docs = documents("host/xfn-host.yaml");
    let pod = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string arg"))
        .collect();
    assert_eq!(args.first(), Some(&"host"), "{args:?}");
    let out = xfn_testkit::xfn_command()
        .args(&args)
        .arg("--help")
        .output()
        .expect("run xfn");
    assert!(
        out.status.success(),
        "xfn {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host's cache, like the sidecar's, is an emptyDir whose `sizeLimit`
/// must hold the budget plus one pull in flight.
#[test]
fn the_hosts_cache_budget_and_a_pull_in_flight_fit_its_empty_dir_size_limit() {
    let docs = documents("host/xfn-host.yaml");
    let pod = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    let bytes = |quantity: &str| {
        xfn::quantity::Quantity::parse(quantity)
            .and_then(|q| q.bytes())
            .unwrap_or_else(|e| panic!("{quantity}: {e}"))
    };
    let args = pod["containers"][0]["args"].as_sequence().expect("args");
    let flag = |name: &str| {
        let prefix = format!("--{name}=");
        args.iter()
            .find_map(|arg| arg.as_str()?.strip_prefix(prefix.as_str()))
            .map(bytes)
            .unwrap_or_else(|| panic!("the host's args give no {prefix}"))
    };
    let cache = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some("xfn-cache"))
        .expect("the xfn-cache volume");
    let size_limit = bytes(
        cache["emptyDir"]["sizeLimit"]
            .as_str()
            .expect("a sizeLimit"),
    );
    let (budget, image) = (flag("cache-max-size"), flag("max-image-size"));
    assert!(
        budget + 2 * image < size_limit,
        "--cache-max-size ({budget}) + 2 x --max-image-size ({image}) must stay below the emptyDir sizeLimit ({size_limit})"
    );
}

/// The host's RBAC is exactly the controller's needs (each rule's comment
/// says why; the controller's unit tests check every request of their
/// recorded conversations against these rules): read Functions,
/// revisions and DeploymentRuntimeConfigs (limits), patch only the revisions' status, and in Crossplane's
/// namespace only Services and Secrets, never list or watch a Secret, and
/// nothing cluster-wide of the core group.
#[test]
fn the_host_rbac_grants_only_what_the_controller_calls() {
    let docs = documents("host/xfn-host.yaml");
    let rules = |kind: &str| -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for rule in of_kind(&docs, kind)["rules"].as_sequence().expect("rules") {
            let list = |key: &str| -> Vec<String> {
                rule[key]
                    .as_sequence()
                    .unwrap_or_else(|| panic!("{kind}: {key} is a list"))
                    .iter()
                    .map(|v| v.as_str().expect("a string").to_string())
                    .collect()
            };
            assert!(rule["resourceNames"].is_null(), "{kind}: no rule by name");
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        out.push((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
        out.sort();
        out
    };
    let triples = |list: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
        let mut out: Vec<_> = list
            .iter()
            .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
            .collect();
        out.sort();
        out
    };
    let pkg = "pkg.crossplane.io";
    assert_eq!(
        rules("ClusterRole"),
        triples(&[
            (pkg, "functions", "get"),
            (pkg, "functions", "list"),
            (pkg, "functions", "watch"),
            (pkg, "functionrevisions", "list"),
            (pkg, "functionrevisions", "watch"),
            (pkg, "functionrevisions/status", "patch"),
            (pkg, "deploymentruntimeconfigs", "get"),
            (pkg, "deploymentruntimeconfigs", "list"),
            (pkg, "deploymentruntimeconfigs", "watch"),
        ])
    );
    assert_eq!(
        rules("Role"),
        triples(&[
            ("", "services", "get"),
            ("", "services", "create"),
            ("", "services", "patch"),
            ("", "services", "delete"),
            ("", "secrets", "get"),
            ("", "secrets", "create"),
            ("", "secrets", "patch"),
        ])
    );
}

/// Crossplane v2 beside `xfn host` runs no Function itself.
#[test]
fn the_crossplane_values_set_every_function_external() {
    let values: yaml_serde::Value =
        yaml_serde::from_str(&manifest("host/crossplane-values.yaml")).expect("YAML");
    let args: Vec<&str> = values["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(args, ["--package-runtime=Function=External"]);
}
