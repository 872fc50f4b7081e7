//! The schemas of the CRDs Crossplane makes from an XRD: per version, the
//! XRD's own `openAPIV3Schema` with Crossplane's fields added to `spec` and
//! `status` (under `spec.crossplane` for Modern XRs, directly in `spec` for
//! LegacyCluster ones; `status.conditions` always), and the claim's when
//! the XRD offers claims. Mirrors Crossplane's `internal/xcrd` (schemas.go).
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
                with_crossplane_fields(&own, claim_spec_props(delete_policy), claim_status_props()),
                served,
            ));
        }
    }
    out
}

/// Crossplane's base (`apiVersion`, `kind`, `metadata`, a required `spec`)
/// around the XRD's own schema, `spec` and `status` given Crossplane's
/// fields besides the XRD's.
fn with_crossplane_fields(
    own: &Value,
    spec: Map<String, Value>,
    status: Map<String, Value>,
) -> Value {
    let mut root = own.as_object().cloned().unwrap_or_default();
    root.insert("type".into(), json!("object"));
    let mut required: Vec<Value> = root
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !required.contains(&json!("spec")) {
        required.push(json!("spec"));
    }
    root.insert("required".into(), Value::Array(required));
    let properties = root
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut();
    let Some(properties) = properties else {
        return Value::Object(root);
    };
    properties.insert("apiVersion".into(), json!({"type": "string"}));
    properties.insert("kind".into(), json!({"type": "string"}));
    properties.insert("metadata".into(), json!({"type": "object"}));
    for (field, added) in [("spec", spec), ("status", status)] {
        let part = properties
            .entry(field)
            .or_insert_with(|| json!({"type": "object"}));
        if let Some(part) = part.as_object_mut() {
            part.insert("type".into(), json!("object"));
            if let Some(props) = part
                .entry("properties")
                .or_insert_with(|| json!({}))
                .as_object_mut()
            {
                for (key, value) in added {
                    props.insert(key, value);
                }
            }
        }
    }
    Value::Object(root)
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

fn xr_status_props(scope: &str) -> Map<String, Value> {
    let mut props = Map::new();
    props.insert("conditions".into(), conditions());
    if scope == "LegacyCluster" {
        props.insert("connectionDetails".into(), connection_details());
        props.insert(
            "claimConditionTypes".into(),
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}),
        );
    } else {
        props.insert(
            "crossplane".into(),
            json!({"type": "object", "properties": {"connectionDetails": connection_details()}}),
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

fn claim_status_props() -> Map<String, Value> {
    let mut props = Map::new();
    props.insert("conditions".into(), conditions());
    props.insert("connectionDetails".into(), connection_details());
    props
}
