use super::*;
use crate::compose::{ComposedResource, StepResult};

fn xr(namespace: Option<&str>) -> Value {
    let mut xr = json!({"apiVersion": "example.org/v1", "kind": "XBucket",
        "metadata": {"name": "xr", "uid": "u1", "labels": {COMPOSITE_LABEL: "xr"}},
        "spec": {"count": 2}});
    if let Some(ns) = namespace {
        xr["metadata"]["namespace"] = json!(ns);
    }
    xr
}

fn observed(xr: &Value) -> Observed {
    Observed {
        composite: xr.clone(),
        resources: vec![(
            "b".into(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "xr-obs"}}),
        )],
    }
}

fn resource(ready: Readiness, extra: Value) -> ComposedResource {
    let mut object = json!({"apiVersion": "v1", "kind": "ConfigMap"});
    merge(&mut object, &extra);
    ComposedResource { object, ready }
}

fn render(
    xr: &Value,
    outcome: &Outcome,
    options: OutputOptions,
) -> Result<Vec<Value>, ComposeError> {
    CompositeOutput {
        xr,
        input_xr: xr,
        schema: XrSchema::Modern,
        composition: ("buckets", None),
        observed: &observed(xr),
        outcome,
        options,
    }
    .objects()
}

#[test]
fn names_refs_and_conditions_are_crossplanes() {
    let xr = xr(None);
    let mut outcome = Outcome::default();
    outcome
        .resources
        .insert("a".into(), resource(Readiness::True, json!({})));
    outcome
        .resources
        .insert("b".into(), resource(Readiness::Unspecified, json!({})));
    let objects = render(&xr, &outcome, OutputOptions::default()).unwrap();
    assert_eq!(objects.len(), 3);
    assert_eq!(
        objects[1]["metadata"]["name"],
        json!(child_name("xr-", "u1", "a"))
    );
    assert_eq!(
        objects[2]["metadata"]["name"],
        json!("xr-obs"),
        "observed names are kept"
    );
    assert_eq!(
        objects[0]["spec"]["crossplane"]["resourceRefs"],
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": objects[1]["metadata"]["name"]},
               {"apiVersion": "v1", "kind": "ConfigMap", "name": "xr-obs"}])
    );
    let types: Vec<_> = objects[0]["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    // An unspecified readiness is not ready, as in Crossplane v2.
    assert_eq!(
        types,
        [
            ("Responsive", "True"),
            ("Synced", "True"),
            ("Ready", "False")
        ]
    );
    assert_eq!(
        objects[0]["status"]["conditions"][2]["message"],
        json!("Unready resources: b")
    );
}

#[test]
fn a_namespaced_xr_composes_in_its_namespace_and_says_when_it_overrides_one() {
    let xr = xr(Some("team"));
    let mut outcome = Outcome::default();
    outcome.resources.insert(
        "a".into(),
        resource(Readiness::True, json!({"metadata": {"namespace": "other"}})),
    );
    let options = OutputOptions {
        include_results: true,
        ..Default::default()
    };
    let objects = render(&xr, &outcome, options).unwrap();
    assert_eq!(objects[1]["metadata"]["namespace"], json!("team"));
    assert!(objects[0]["spec"]["crossplane"]["resourceRefs"][0]
        .get("namespace")
        .is_none());
    let warning = objects
        .iter()
        .find(|o| o["reason"] == json!("NamespaceOverridden"))
        .unwrap();
    assert_eq!(warning["severity"], json!("Warning"));
}

#[test]
fn an_invalid_composed_name_fails_the_render() {
    let xr = xr(None);
    let mut outcome = Outcome::default();
    outcome.resources.insert(
        "a".into(),
        resource(Readiness::True, json!({"metadata": {"name": "Not_Valid"}})),
    );
    let err = render(&xr, &outcome, OutputOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid name \"Not_Valid\"") && err.contains("RFC 1123"),
        "{err}"
    );
}

#[test]
fn a_fatal_result_leaves_a_partial_xr_and_the_results_before_it() {
    let xr = xr(None);
    let result = |severity, message: &str| StepResult {
        step: "s".into(),
        severity,
        message: message.into(),
        reason: None,
    };
    let outcome = Outcome {
        results: vec![result(Severity::Warning, "careful")],
        fatal: Some(result(Severity::Fatal, "broken")),
        ..Default::default()
    };
    let options = OutputOptions {
        include_results: true,
        ..Default::default()
    };
    let objects = render(&xr, &outcome, options).unwrap();
    let synced = &objects[0]["status"]["conditions"][1];
    assert_eq!(synced["status"], json!("False"));
    assert_eq!(
        synced["message"],
        json!("cannot compose resources: pipeline step \"s\" returned a fatal result: broken")
    );
    let messages: Vec<_> = objects[1..]
        .iter()
        .map(|o| o["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "Successfully selected composition: buckets",
            "Pipeline step \"s\": careful",
            "cannot compose resources: pipeline step \"s\" returned a fatal result: broken"
        ]
    );
}

#[test]
fn unready_resources_are_worded_as_crossplanes_first_n_and_some_more() {
    let message = |names: &[&str]| readiness_of(names)["message"].clone();
    assert_eq!(message(&["a"]), json!("Unready resources: a"));
    assert_eq!(message(&["a", "b"]), json!("Unready resources: a, b"));
    assert_eq!(
        message(&["a", "b", "c"]),
        json!("Unready resources: a, b, and c")
    );
    assert_eq!(
        message(&["a", "b", "c", "d", "e"]),
        json!("Unready resources: a, b, c, and 2 more")
    );
    assert_eq!(readiness_of(&[])["status"], json!("True"));
}

#[test]
fn conditions_are_set_over_the_xrs_own_in_their_places_as_crossplanes_set_conditions() {
    let mut xr = xr(None);
    xr["status"] = json!({"conditions": [
        {"type": "Ready", "status": "True", "reason": "old",
         "lastTransitionTime": "2023-11-03T09:07:31Z", "extra": "dropped"},
        {"type": "Custom", "status": "False", "reason": 7, "message": "kept",
         "observedGeneration": 3},
    ]});
    let mut outcome = Outcome::default();
    for message in ["first", "second"] {
        outcome.conditions.push(XrCondition {
            kind: "ResourcesComposed".into(),
            status: "True".into(),
            reason: "AllComposed".into(),
            message: Some(message.into()),
        });
    }
    let objects = render(&xr, &outcome, OutputOptions::default()).unwrap();
    let at = |reason: &str, message: Option<&str>, kind: &str, status: &str| {
        let mut c = json!({"type": kind, "status": status, "reason": reason,
            "lastTransitionTime": TRANSITION_TIME});
        if let Some(m) = message {
            c["message"] = json!(m);
        }
        c
    };
    let mut custom = at("", Some("kept"), "Custom", "False");
    custom["observedGeneration"] = json!(3);
    assert_eq!(
        objects[0]["status"]["conditions"],
        json!([
            // Replaced in its place, not moved after Synced.
            at("Available", None, "Ready", "True"),
            // Nobody sets it: kept, read as Crossplane's Condition type.
            custom,
            at("WatchCircuitClosed", None, "Responsive", "True"),
            // A type set twice is there once, the last one set.
            at("AllComposed", Some("second"), "ResourcesComposed", "True"),
            at("ReconcileSuccess", None, "Synced", "True"),
        ])
    );
}

#[test]
fn only_responsive_and_a_failed_pipelines_synced_carry_the_xrs_generation() {
    let mut xr = xr(None);
    xr["metadata"]["generation"] = json!(3);
    let generations = |objects: Vec<Value>| -> Vec<(String, Value)> {
        objects[0]["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["type"].as_str().unwrap().to_string(),
                    c["observedGeneration"].clone(),
                )
            })
            .collect()
    };
    let ok = render(&xr, &Outcome::default(), OutputOptions::default()).unwrap();
    let named = |v: &[(&str, Value)]| -> Vec<(String, Value)> {
        v.iter().map(|(k, g)| (k.to_string(), g.clone())).collect()
    };
    assert_eq!(
        generations(ok),
        named(&[
            ("Responsive", json!(3)),
            ("Synced", Value::Null),
            ("Ready", Value::Null)
        ])
    );
    let failed = Outcome {
        fatal: Some(StepResult {
            step: "s".into(),
            severity: Severity::Fatal,
            message: "no".into(),
            reason: None,
        }),
        ..Outcome::default()
    };
    let failed = render(&xr, &failed, OutputOptions::default()).unwrap();
    assert_eq!(
        generations(failed),
        named(&[("Responsive", json!(3)), ("Synced", json!(3))])
    );
}
