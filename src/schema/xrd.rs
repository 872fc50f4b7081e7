//! The schemas of the CRDs Crossplane makes from an XRD: per version, the
//! parts of the XRD's own `openAPIV3Schema` Crossplane keeps, with its
//! fields added to `spec` and `status` (under `spec.crossplane` for Modern
//! XRs, directly in `spec` for LegacyCluster ones; `status.conditions`
//! always) and `metadata.name` limited to 63 characters, and the claim's
//! when the XRD offers claims. Mirrors crossplane-runtime's `pkg/xcrd`
//! (crd.go `genCrdVersion`, schemas.go), which Crossplane and its CLI use.
use serde_json::{json, Map, Value};

use crate::compose::read::xrd::Xrd;
use crate::value::get_str;

/// `(kind, version, schema, served)` of the XR and, when offered, the claim.
pub(super) fn schemas(xrd: &Xrd) -> Vec<(String, String, Value, bool)> {
    let object = xrd.object();
    let scope = xrd.scope();
    let kind = get_str(object, &["spec", "names", "kind"]).unwrap_or_default();
    let claim_kind = xrd.claim_kind();
    // The XRD's API defaults these two (Automatic, Background).
    let policy = get_str(object, &["spec", "defaultCompositionUpdatePolicy"]).or(Some("Automatic"));
    let delete_policy =
        get_str(object, &["spec", "defaultCompositeDeletePolicy"]).or(Some("Background"));
    let versions = object
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = Vec::new();
    for version in versions {
        let name = get_str(version, &["name"]).unwrap_or_default().to_string();
        let served = version.get("served") != Some(&Value::Bool(false));
        let own = version
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        out.push((
            kind.to_string(),
            name.clone(),
            with_crossplane_fields(&own, xr_spec_props(scope, policy), xr_status_props(scope)),
            served,
        ));
        if let Some(claim_kind) = claim_kind {
            out.push((
                claim_kind.to_string(),
                name,
                with_crossplane_fields(
                    &own,
                    claim_spec_props(delete_policy),
                    xr_status_props("LegacyCluster"),
                ),
                served,
            ));
        }
    }
    out
}

/// The longest name of an XR or claim: names are used as label values
/// (crossplane-runtime `xcrd/crd.go`, `maxCompositeNameLength`,
/// `maxClaimNameLength`).
const MAX_NAME_LENGTH: u64 = 63;

/// The schema of one version of the CRD Crossplane generates, as
/// crossplane-runtime's `genCrdVersion` builds it: its base (`apiVersion`,
/// `kind`, `metadata.name` of at most 63 characters or the XRD's own
/// lower `maxLength`, a required `spec`), then of the XRD's schema only the
/// root's `description` and `x-kubernetes-validations`, `spec`'s
/// `required`, `x-kubernetes-preserve-unknown-fields`,
/// `x-kubernetes-validations`, `oneOf`, `description` and `properties`,
/// `status`'s the same but `x-kubernetes-preserve-unknown-fields`; then
/// Crossplane's fields (`spec`, `status`) over the XRD's.
fn with_crossplane_fields(
    own: &Value,
    spec: Map<String, Value>,
    status: Map<String, Value>,
) -> Value {
    let part = |name: &str| own.pointer(&format!("/properties/{name}"));
    let own_max = part("metadata")
        .and_then(|m| m.pointer("/properties/name/maxLength"))
        .and_then(Value::as_u64);
    let max_name = own_max.map_or(MAX_NAME_LENGTH, |m| m.min(MAX_NAME_LENGTH));
    let mut root = json!({"type": "object", "required": ["spec"], "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": max_name}}}}});
    copy(own, &mut root, &["description", "x-kubernetes-validations"]);
    for (field, kept, added) in [
        (
            "spec",
            &[
                "required",
                "x-kubernetes-preserve-unknown-fields",
                "x-kubernetes-validations",
                "oneOf",
                "description",
            ][..],
            spec,
        ),
        (
            "status",
            &[
                "required",
                "x-kubernetes-validations",
                "oneOf",
                "description",
            ][..],
            status,
        ),
    ] {
        let mut schema = json!({"type": "object"});
        let mut properties = Map::new();
        if let Some(own_part) = part(field) {
            copy(own_part, &mut schema, kept);
            if let Some(own_properties) = own_part.get("properties").and_then(Value::as_object) {
                properties.extend(own_properties.clone());
            }
        }
        properties.extend(added);
        schema["properties"] = Value::Object(properties);
        root["properties"][field] = schema;
    }
    root
}

/// Copies `keys` of `from` (those it has) to `to`.
fn copy(from: &Value, to: &mut Value, keys: &[&str]) {
    for key in keys {
        if let (Some(value), Some(to)) = (from.get(*key), to.as_object_mut()) {
            to.insert((*key).to_string(), value.clone());
        }
    }
}

fn name_ref() -> Value {
    json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}})
}

fn label_selector() -> Value {
    json!({"type": "object", "required": ["matchLabels"], "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}})
}

fn update_policy(default: Option<&str>) -> Value {
    let mut policy = json!({"type": "string", "enum": ["Automatic", "Manual"]});
    if let (Some(default), Some(map)) = (default, policy.as_object_mut()) {
        map.insert("default".into(), json!(default));
    }
    policy
}

fn xr_spec_props(scope: &str, policy: Option<&str>) -> Map<String, Value> {
    let mut props = Map::new();
    props.insert("compositionRef".into(), name_ref());
    props.insert("compositionSelector".into(), label_selector());
    props.insert("compositionRevisionRef".into(), name_ref());
    props.insert("compositionRevisionSelector".into(), label_selector());
    props.insert("compositionUpdatePolicy".into(), update_policy(policy));
    let mut reference = json!({"apiVersion": {"type": "string"}, "name": {"type": "string"},
        "kind": {"type": "string"}});
    if scope != "Namespaced" {
        if let Some(r) = reference.as_object_mut() {
            r.insert("namespace".into(), json!({"type": "string"}));
        }
    }
    props.insert(
        "resourceRefs".into(),
        json!({"type": "array", "x-kubernetes-list-type": "atomic", "items": {
            "type": "object", "required": ["apiVersion", "kind"], "properties": reference}}),
    );
    if scope == "LegacyCluster" {
        props.insert(
            "claimRef".into(),
            json!({"type": "object", "required": ["apiVersion", "kind", "namespace", "name"],
                "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "namespace": {"type": "string"}, "name": {"type": "string"}}}),
        );
        props.insert(
            "writeConnectionSecretToRef".into(),
            json!({"type": "object", "required": ["name", "namespace"], "properties": {
                "name": {"type": "string"}, "namespace": {"type": "string"}}}),
        );
        return props;
    }
    let mut modern = Map::new();
    modern.insert(
        "crossplane".into(),
        json!({"type": "object", "properties": Value::Object(props)}),
    );
    modern
}

fn conditions() -> Value {
    json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
        "items": {"type": "object", "required": ["lastTransitionTime", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "message": {"type": "string"}, "reason": {"type": "string"},
                "status": {"type": "string"}, "type": {"type": "string"},
                "observedGeneration": {"type": "integer", "format": "int64"}}}})
}

fn connection_details() -> Value {
    json!({"type": "object", "properties": {
        "lastPublishedTime": {"type": "string", "format": "date-time"}}})
}

/// `CompositeResourceStatusProps`: conditions; for LegacyCluster XRs (and
/// claims, whose CRD Crossplane gives the same) connection details and
/// claim condition types too.
fn xr_status_props(scope: &str) -> Map<String, Value> {
    let mut props = Map::new();
    props.insert("conditions".into(), conditions());
    if scope == "LegacyCluster" {
        props.insert("connectionDetails".into(), connection_details());
        props.insert(
            "claimConditionTypes".into(),
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}),
        );
    }
    props
}

fn claim_spec_props(delete_policy: Option<&str>) -> Map<String, Value> {
    let mut props = Map::new();
    props.insert("compositionRef".into(), name_ref());
    props.insert("compositionSelector".into(), label_selector());
    props.insert("compositionRevisionRef".into(), name_ref());
    props.insert("compositionRevisionSelector".into(), label_selector());
    props.insert("compositionUpdatePolicy".into(), update_policy(None));
    let mut delete = json!({"type": "string", "enum": ["Background", "Foreground"]});
    if let (Some(default), Some(map)) = (delete_policy, delete.as_object_mut()) {
        map.insert("default".into(), json!(default));
    }
    props.insert("compositeDeletePolicy".into(), delete);
    props.insert(
        "resourceRef".into(),
        json!({"type": "object", "required": ["apiVersion", "kind", "name"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "name": {"type": "string"}}}),
    );
    props.insert(
        "writeConnectionSecretToRef".into(),
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}),
    );
    props
}
