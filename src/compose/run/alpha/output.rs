//! The output of alpha (`spec.functions`) Compositions, as `crossplane
//! render` of Crossplane v1.11–v1.13 printed it: the XR with its desired
//! status and Ready condition (a resource is ready when its function says so
//! or, when it does not, when its observed `Ready` condition is True), the
//! composed resources with generated names, then Results (with their step)
//! and the Context.
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::condition_is;
use crate::compose::names::COMPOSITE_LABEL;
use crate::compose::print::output::{readiness_of, TRANSITION_TIME};
use crate::compose::read::model::RESOURCE_NAME_ANNOTATION;
use crate::compose::OutputOptions;
use crate::compose::{Observed, Outcome, Readiness};
use crate::value::{get_str, merge, object_at};

/// The output objects, in order.
pub(crate) fn alpha_objects(
    observed: &Observed,
    outcome: &Outcome,
    options: OutputOptions,
) -> Vec<Value> {
    let xr = &observed.composite;
    let xr_name = get_str(xr, &["metadata", "name"]).unwrap_or_default();
    let mut out = Vec::new();

    // The XR: desired status (or all of it with -x) and conditions.
    let mut xr_out = if options.include_full {
        xr.clone()
    } else {
        let mut metadata = Map::new();
        metadata.insert("name".into(), json!(xr_name));
        if let Some(ns) = get_str(xr, &["metadata", "namespace"]) {
            metadata.insert("namespace".into(), json!(ns));
        }
        json!({
            "apiVersion": xr.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": xr.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": metadata,
        })
    };
    if let Some(desired) = &outcome.desired_composite {
        if options.include_full {
            merge(&mut xr_out, desired);
        } else if let Some(status) = desired.get("status") {
            merge(&mut xr_out, &json!({ "status": status }));
        }
    }
    let mut conditions: Vec<Value> = outcome
        .conditions
        .iter()
        .map(|c| {
            let mut condition = json!({
                "type": c.kind,
                "status": c.status,
                "reason": c.reason,
                "lastTransitionTime": TRANSITION_TIME,
            });
            if let Some(message) = &c.message {
                condition["message"] = json!(message);
            }
            condition
        })
        .collect();
    conditions.push(ready_condition(observed, outcome));
    object_at(&mut xr_out, &["status"]).insert("conditions".into(), Value::Array(conditions));
    out.push(xr_out);

    // Composed resources, sorted by their name in the Composition.
    for (name, resource) in &outcome.resources {
        out.push(composed_object(
            xr,
            name,
            &resource.object,
            observed.resource(name),
        ));
    }

    if options.include_results {
        for result in &outcome.results {
            let mut object = json!({
                "apiVersion": "render.crossplane.io/v1beta1",
                "kind": "Result",
                "step": result.step,
                "severity": result.severity.as_str_name(),
                "message": result.message,
            });
            if let Some(reason) = &result.reason {
                object["reason"] = json!(reason);
            }
            out.push(object);
        }
    }
    if options.include_context {
        out.push(json!({
            "apiVersion": "render.crossplane.io/v1beta1",
            "kind": "Context",
            "fields": outcome.context.clone().unwrap_or_else(|| json!({})),
        }));
    }
    out
}

/// `Ready`: Available when every composed resource is ready, else Creating
/// naming the unready ones (the first three, sorted, and how many more).
fn ready_condition(observed: &Observed, outcome: &Outcome) -> Value {
    let unready: Vec<&str> = outcome
        .resources
        .iter()
        .filter(|(name, r)| match r.ready {
            Readiness::True => false,
            Readiness::False => true,
            Readiness::Unspecified => !observed
                .resource(name)
                .is_some_and(|o| condition_is(o, "Ready", "True")),
        })
        .map(|(name, _)| name.as_str())
        .collect();
    readiness_of(&unready)
}

/// A composed resource with the metadata Crossplane sets: generateName from
/// the XR, a name (the observed one, else generated), the composite label
/// (and claim labels), the resource-name annotation, the XR as controller.
fn composed_object(xr: &Value, name: &str, desired: &Value, observed: Option<&Value>) -> Value {
    let mut object = desired.clone();
    if !object.is_object() {
        object = json!({});
    }
    let xr_name = get_str(xr, &["metadata", "name"]).unwrap_or_default();
    let composite = get_str(xr, &["metadata", "labels", COMPOSITE_LABEL]).unwrap_or(xr_name);
    let prefix = format!("{composite}-");
    let metadata = object_at(&mut object, &["metadata"]);
    metadata.insert("generateName".into(), json!(prefix));
    let has_name = metadata
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !has_name {
        let generated = observed
            .and_then(|o| get_str(o, &["metadata", "name"]))
            .map(str::to_string)
            .unwrap_or_else(|| generated_name(&prefix, xr_name, name));
        metadata.insert("name".into(), json!(generated));
    }
    let labels = object_at(&mut object, &["metadata", "labels"]);
    labels.insert(COMPOSITE_LABEL.into(), json!(composite));
    for claim_label in ["crossplane.io/claim-name", "crossplane.io/claim-namespace"] {
        if let Some(v) = get_str(xr, &["metadata", "labels", claim_label]) {
            labels.insert(claim_label.into(), json!(v));
        }
    }
    object_at(&mut object, &["metadata", "annotations"])
        .insert(RESOURCE_NAME_ANNOTATION.into(), json!(name));
    object_at(&mut object, &["metadata"]).insert(
        "ownerReferences".into(),
        json!([{
            "apiVersion": xr.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": xr.get("kind").cloned().unwrap_or(Value::Null),
            "name": xr_name,
            "uid": get_str(xr, &["metadata", "uid"]).unwrap_or_default(),
            "controller": true,
            "blockOwnerDeletion": true,
        }]),
    );
    object
}

/// `prefix` plus five characters from Kubernetes' name-generator alphabet,
/// derived from the XR and resource names so a render is reproducible (the
/// API server would pick them at random).
fn generated_name(prefix: &str, xr_name: &str, resource_name: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let digest = Sha256::digest(format!("{xr_name}/{resource_name}"));
    let suffix: String = digest
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    format!("{prefix}{suffix}")
}
