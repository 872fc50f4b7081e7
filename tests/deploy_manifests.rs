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
