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
