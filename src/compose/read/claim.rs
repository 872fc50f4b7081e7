//! Claims as render input: a claim (a namespaced object of an XRD's
//! `claimNames` kind) becomes the composite resource Crossplane's claim
//! reconciler would create for it, and that XR is rendered
//! (crossplane#6649: the CLI has no claim support since v2).
//!
//! What Crossplane's claim configurator does (`ConfigureComposite`), and so
//! what this does:
//! - the XR's type is the one the Composition composes (`compositeTypeRef`);
//! - labels and annotations are copied, except the reserved
//!   `*.kubernetes.io` ones, and `crossplane.io/claim-name`,
//!   `crossplane.io/claim-namespace` are added;
//! - the spec is copied without the claim's own fields (`resourceRef`,
//!   `writeConnectionSecretToRef`, `compositeDeletePolicy`, and
//!   `compositionRevisionRef` unless the update policy is `Manual`), and
//!   `spec.claimRef` names the claim;
//! - the name is the claim's `spec.resourceRef.name` when it is bound,
//!   else what `generateName: <claim>-` gives, with the random five
//!   characters derived from the claim's namespace and name so a render is
//!   reproducible.
//!
//! Claims exist only for v1 (`LegacyCluster`) XRDs, so the XR is Legacy.
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::compose::read::model::group;
use crate::value::get_str;

/// Fields of a claim's spec that stay with the claim.
const CLAIM_ONLY_FIELDS: &[&str] = &[
    "resourceRef",
    "writeConnectionSecretToRef",
    "compositeDeletePolicy",
];

/// The characters Kubernetes' `generateName` suffixes are made of.
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Whether `object` is a claim of XRs of `composite` (`apiVersion`, `kind`):
/// a namespaced object of the same API group and another kind.
pub(crate) fn is_claim_of(object: &Value, composite: (&str, &str)) -> bool {
    let api_version = get_str(object, &["apiVersion"]).unwrap_or_default();
    let kind = get_str(object, &["kind"]).unwrap_or_default();
    let namespaced = get_str(object, &["metadata", "namespace"]).is_some_and(|n| !n.is_empty());
    namespaced && group(api_version) == group(composite.0) && kind != composite.1
}

/// The XR of type `composite` Crossplane creates for `claim`.
pub(crate) fn composite_of(claim: &Value, composite: (&str, &str)) -> Value {
    let text = |path: &[&str]| get_str(claim, path).unwrap_or_default().to_string();
    let (name, namespace) = (
        text(&["metadata", "name"]),
        text(&["metadata", "namespace"]),
    );
    let unreserved = |path: &[&str]| -> Map<String, Value> {
        let mut entries = Map::new();
        if let Some(Value::Object(map)) = crate::value::get(claim, path) {
            for (key, value) in map {
                let domain = key.split_once('/').map_or("", |(d, _)| d);
                if !domain.ends_with("kubernetes.io") {
                    entries.insert(key.clone(), value.clone());
                }
            }
        }
        entries
    };
    let mut labels = unreserved(&["metadata", "labels"]);
    labels.insert("crossplane.io/claim-name".into(), json!(name));
    labels.insert("crossplane.io/claim-namespace".into(), json!(namespace));
    let annotations = unreserved(&["metadata", "annotations"]);

    let mut spec = claim
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for field in CLAIM_ONLY_FIELDS {
        spec.remove(*field);
    }
    if spec.get("compositionUpdatePolicy") != Some(&json!("Manual")) {
        spec.remove("compositionRevisionRef");
    }
    spec.insert(
        "claimRef".into(),
        json!({
            "apiVersion": text(&["apiVersion"]),
            "kind": text(&["kind"]),
            "namespace": namespace,
            "name": name,
        }),
    );
    let xr_name = get_str(claim, &["spec", "resourceRef", "name"])
        .filter(|n| !n.is_empty())
        .map_or_else(|| generated_name(&name, &namespace), str::to_string);

    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(xr_name));
    metadata.insert("generateName".into(), json!(format!("{name}-")));
    metadata.insert("labels".into(), Value::Object(labels));
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    json!({
        "apiVersion": composite.0,
        "kind": composite.1,
        "metadata": metadata,
        "spec": spec,
    })
}

/// `<claim>-` and five characters of `generateName`'s alphabet, derived
/// from the claim's namespace and name.
fn generated_name(name: &str, namespace: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let suffix: String = digest
        .iter()
        .take(5)
        .map(|b| NAME_ALPHABET[usize::from(*b) % NAME_ALPHABET.len()] as char)
        .collect();
    format!("{name}-{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const XR_TYPE: (&str, &str) = ("example.org/v1", "XBucket");

    #[test]
    fn a_claim_becomes_its_xr_as_crossplane_configures_it() {
        let claim = json!({
            "apiVersion": "example.org/v1", "kind": "Bucket",
            "metadata": {"name": "mine", "namespace": "team-a",
                "labels": {"app": "web", "app.kubernetes.io/name": "x"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "note": "kept"}},
            "spec": {"region": "eu", "compositionRef": {"name": "c"},
                "compositionRevisionRef": {"name": "c-1"},
                "writeConnectionSecretToRef": {"name": "s"},
                "resourceRef": {"apiVersion": "example.org/v1", "kind": "XBucket", "name": "mine-x1"},
                "compositeDeletePolicy": "Foreground"}});
        assert!(is_claim_of(&claim, XR_TYPE));
        let xr = composite_of(&claim, XR_TYPE);
        assert_eq!(
            xr,
            json!({"apiVersion": "example.org/v1", "kind": "XBucket",
                "metadata": {"name": "mine-x1", "generateName": "mine-",
                    "labels": {"app": "web", "crossplane.io/claim-name": "mine",
                        "crossplane.io/claim-namespace": "team-a"},
                    "annotations": {"note": "kept"}},
                "spec": {"region": "eu", "compositionRef": {"name": "c"},
                    "claimRef": {"apiVersion": "example.org/v1", "kind": "Bucket",
                        "namespace": "team-a", "name": "mine"}}})
        );
    }

    #[test]
    fn an_unbound_claim_gets_a_stable_generated_name_and_a_manual_revision() {
        let claim = json!({"apiVersion": "example.org/v1", "kind": "Bucket",
            "metadata": {"name": "mine", "namespace": "team-a"},
            "spec": {"compositionUpdatePolicy": "Manual",
                "compositionRevisionRef": {"name": "c-1"}}});
        let first = composite_of(&claim, XR_TYPE);
        let name = get_str(&first, &["metadata", "name"]).unwrap();
        assert!(name.starts_with("mine-") && name.len() == 10, "{name}");
        assert_eq!(first, composite_of(&claim, XR_TYPE), "reproducible");
        assert_eq!(
            first["spec"]["compositionRevisionRef"],
            json!({"name": "c-1"})
        );
    }

    #[test]
    fn only_a_namespaced_object_of_the_group_and_another_kind_is_a_claim() {
        let object = |api: &str, kind: &str, ns: Option<&str>| {
            let mut o = json!({"apiVersion": api, "kind": kind, "metadata": {"name": "a"}});
            if let Some(ns) = ns {
                o["metadata"]["namespace"] = json!(ns);
            }
            o
        };
        assert!(!is_claim_of(
            &object("example.org/v1", "XBucket", Some("a")),
            XR_TYPE
        ));
        assert!(!is_claim_of(
            &object("example.org/v1", "Bucket", None),
            XR_TYPE
        ));
        assert!(!is_claim_of(
            &object("other.org/v1", "Bucket", Some("a")),
            XR_TYPE
        ));
        assert!(is_claim_of(
            &object("example.org/v2", "Bucket", Some("a")),
            XR_TYPE
        ));
    }
}
