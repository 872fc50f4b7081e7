//! The YAML stream `crossplane composition render` prints (Crossplane
//! v2.3+, whose render runs the real XR reconciler): the XR with
//! Crossplane's conditions (`Responsive`, the functions' own, `Synced`,
//! `Ready`) and its `resourceRefs`, the composed resources sorted by
//! composition resource name with the metadata Crossplane gives them, then
//! the events of the reconcile as `Result`s and the Context.
//!
//! After a Fatal result the output is partial, as Crossplane's renderer's: the XR with
//! `Synced: False` and the results before the fatal one, no composed
//! resources.
use serde_json::{json, Map, Value};

use crate::compose::names::COMPOSITE_LABEL;
use crate::compose::names::{child_name, valid_object_name};
use crate::compose::read::model::RESOURCE_NAME_ANNOTATION;
use crate::compose::read::xrd::XrSchema;
use crate::compose::{
    ComposeError, Observed, Outcome, OutputOptions, Readiness, StepResult, XrCondition,
};
use crate::proto::v1::Severity;
use crate::value::{get_str, merge, object_at};

/// `lastTransitionTime` of every condition, fixed (as `crossplane render`
/// does) so output is reproducible.
pub(crate) const TRANSITION_TIME: &str = "2024-01-01T00:00:00Z";
/// apiVersion of Result and Context objects.
pub(crate) const RENDER_API_VERSION: &str = "render.crossplane.io/v1beta1";

/// An event of the reconcile: what `-r` prints as a Result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    /// `Normal` or `Warning`.
    pub(crate) warning: bool,
    /// Why.
    pub(crate) reason: String,
    /// What.
    pub(crate) message: String,
}

impl Event {
    fn normal(reason: &str, message: String) -> Self {
        Self {
            warning: false,
            reason: reason.into(),
            message,
        }
    }
    fn warning(reason: &str, message: String) -> Self {
        Self {
            warning: true,
            reason: reason.into(),
            message,
        }
    }

    /// The event of a function's result: its own reason or `default_reason`,
    /// the message prefixed with the step, as Crossplane records them.
    pub(crate) fn of_result(result: &StepResult, default_reason: &str, own_reason: bool) -> Self {
        let reason = result
            .reason
            .as_deref()
            .filter(|_| own_reason)
            .unwrap_or(default_reason);
        let step = &result.step;
        match result.severity {
            Severity::Normal => Self::normal(
                reason,
                format!("Pipeline step {step:?}: {}", result.message),
            ),
            Severity::Warning => Self::warning(
                reason,
                format!("Pipeline step {step:?}: {}", result.message),
            ),
            _ => Self::warning(
                reason,
                format!(
                    "Pipeline step {step:?} returned a result of unknown severity (assuming \
                     warning): {}",
                    result.message
                ),
            ),
        }
    }

    /// As a `Result` object.
    pub(crate) fn to_object(&self) -> Value {
        json!({
            "apiVersion": RENDER_API_VERSION,
            "kind": "Result",
            "severity": if self.warning { "Warning" } else { "Normal" },
            "reason": self.reason,
            "message": self.message,
        })
    }
}

/// A condition as Crossplane writes it.
pub(crate) fn condition(kind: &str, status: &str, reason: &str, message: Option<&str>) -> Value {
    let mut c = json!({
        "type": kind,
        "status": status,
        "reason": reason,
        "lastTransitionTime": TRANSITION_TIME,
    });
    if let Some(message) = message.filter(|m| !m.is_empty()) {
        c["message"] = json!(message);
    }
    c
}

/// The XR's own `status.conditions` as Crossplane reads them into its
/// `Condition` type (crossplane-runtime v2.3.3
/// `pkg/resource/unstructured/composite/composite.go:345`, `GetValueInto`):
/// the fields it has, a field of another JSON type left empty, the time the
/// fixed one (the CLI's `SetConditionTimestamps` sets every condition's).
fn input_conditions(xr: &Value) -> Vec<Value> {
    let Some(given) = xr
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    given
        .iter()
        .map(|c| {
            let field = |k: &str| get_str(c, &[k]).unwrap_or_default();
            let mut out = condition(
                field("type"),
                field("status"),
                field("reason"),
                Some(field("message")),
            );
            if let Some(g) = c.get("observedGeneration").and_then(Value::as_i64) {
                if g != 0 {
                    out["observedGeneration"] = json!(g);
                }
            }
            out
        })
        .collect()
}

/// Sets `c` among `conditions` as Crossplane's `SetConditions` does
/// (crossplane/apis v2.3.4 `core/v2/condition.go:193`): every condition of
/// its type is replaced in its place, unless `Equal` to it (type, status,
/// reason, message, and the observed generation when both have one); a new
/// type is appended.
fn set_condition(conditions: &mut Vec<Value>, c: Value) {
    let equal = |a: &Value, b: &Value| {
        let generation = |v: &Value| v.get("observedGeneration").and_then(Value::as_i64);
        let text = |v: &Value, k: &str| get_str(v, &[k]).unwrap_or_default().to_string();
        ["type", "status", "reason", "message"]
            .iter()
            .all(|k| text(a, k) == text(b, k))
            && match (generation(a), generation(b)) {
                (Some(x), Some(y)) if x != 0 && y != 0 => x == y,
                _ => true,
            }
    };
    let mut exists = false;
    for existing in conditions.iter_mut() {
        if existing.get("type") != c.get("type") {
            continue;
        }
        exists = true;
        if !equal(existing, &c) {
            *existing = c.clone();
        }
    }
    if !exists {
        conditions.push(c);
    }
}

fn xr_condition(c: &XrCondition) -> Value {
    condition(&c.kind, &c.status, &c.reason, c.message.as_deref())
}

/// Condition types only Crossplane may set; a function's are dropped.
const SYSTEM_CONDITIONS: &[&str] = &["Ready", "Synced", "Healthy", "Responsive"];

/// Crossplane's event reasons and condition messages.
const REASON_SELECT: &str = "SelectComposition";
const REASON_COMPOSE: &str = "ComposeResources";
const REASON_NAMESPACE: &str = "NamespaceOverridden";

/// Everything a composition render's output is made of.
pub(crate) struct CompositeOutput<'a> {
    /// The XR as the pipeline saw it (uid, composite label, defaults).
    pub(crate) xr: &'a Value,
    /// The XR as given (for `-x`).
    pub(crate) input_xr: &'a Value,
    /// Where its Crossplane fields live.
    pub(crate) schema: XrSchema,
    /// The Composition's name, and the revision's if one was given.
    pub(crate) composition: (&'a str, Option<&'a str>),
    /// The observed composed resources.
    pub(crate) observed: &'a Observed,
    /// What the pipeline produced.
    pub(crate) outcome: &'a Outcome,
    /// What to print.
    pub(crate) options: OutputOptions,
}

impl CompositeOutput<'_> {
    /// The output objects, in order. Fails as Crossplane's reconcile does
    /// on a composed resource it cannot create (an invalid name).
    pub(crate) fn objects(&self) -> Result<Vec<Value>, ComposeError> {
        let outcome = self.outcome;
        let mut events = vec![Event::normal(
            REASON_SELECT,
            format!("Successfully selected composition: {}", self.composition.0),
        )];
        if let Some(revision) = self.composition.1 {
            events.push(Event::normal(
                REASON_SELECT,
                format!("Successfully selected composition revision: {revision}"),
            ));
        }
        events.extend(
            outcome
                .results
                .iter()
                .map(|r| Event::of_result(r, REASON_COMPOSE, true)),
        );
        // The reconciler marks conditions with the XR's generation
        // (crossplane-runtime v2.3.3 pkg/conditions/manager.go:70): the
        // input's, until the desired XR replaces it, generation and all
        // (Crossplane v2.3.4 composition_functions.go:673), so only
        // `Responsive` (reconciler.go:597) and a failed pipeline's `Synced`
        // carry it.
        let generation = self.xr["metadata"]["generation"]
            .as_i64()
            .filter(|g| *g != 0);
        let with_generation = |mut c: Value| {
            if let Some(g) = generation {
                c["observedGeneration"] = json!(g);
            }
            c
        };
        let mut conditions = input_conditions(self.xr);
        set_condition(
            &mut conditions,
            with_generation(condition("Responsive", "True", "WatchCircuitClosed", None)),
        );
        for c in outcome
            .conditions
            .iter()
            .filter(|c| !SYSTEM_CONDITIONS.contains(&c.kind.as_str()))
        {
            set_condition(&mut conditions, xr_condition(c));
        }

        if let Some(fatal) = &outcome.fatal {
            let error = format!(
                "cannot compose resources: pipeline step {:?} returned a fatal result: {}",
                fatal.step, fatal.message
            );
            events.push(Event::warning(REASON_COMPOSE, error.clone()));
            set_condition(
                &mut conditions,
                with_generation(condition("Synced", "False", "ReconcileError", Some(&error))),
            );
            let mut xr = self.identity();
            object_at(&mut xr, &["status"]).insert("conditions".into(), Value::Array(conditions));
            // Nothing is garbage collected after a failed pipeline.
            return Ok(self.assemble(xr, Vec::new(), Vec::new(), &events));
        }

        let mut composed = Vec::new();
        let mut unready = Vec::new();
        for (name, resource) in &outcome.resources {
            let (object, namespace_event) = self.composed_object(name, &resource.object)?;
            events.extend(namespace_event);
            if resource.ready != Readiness::True {
                unready.push(name.as_str());
            }
            composed.push(object);
        }
        let mut refs: Vec<Value> = composed.iter().map(|o| self.reference(o)).collect();
        refs.sort_by_key(|r| {
            ["apiVersion", "kind", "name", "namespace"]
                .iter()
                .map(|k| get_str(r, &[k]).unwrap_or_default())
                .collect::<String>()
        });
        for name in &unready {
            events.push(Event::normal(
                REASON_COMPOSE,
                format!("Composed resource {name:?} is not yet ready"),
            ));
        }
        set_condition(
            &mut conditions,
            condition("Synced", "True", "ReconcileSuccess", None),
        );
        set_condition(
            &mut conditions,
            ready_condition(&unready, outcome.composite_ready),
        );

        let mut xr = self.identity();
        let refs_path = self.schema.spec_path("resourceRefs");
        object_at(&mut xr, &refs_path[..refs_path.len() - 1])
            .insert("resourceRefs".into(), Value::Array(refs));
        if let Some(revision) = self.composition.1 {
            // Not in Crossplane's output; xfn names the revision it used.
            let path = self.schema.spec_path("compositionRevisionRef");
            object_at(&mut xr, &path[..path.len() - 1])
                .insert("compositionRevisionRef".into(), json!({"name": revision}));
        }
        if let Some(status) = outcome
            .desired_composite
            .as_ref()
            .and_then(|d| d.get("status"))
        {
            merge(&mut xr, &json!({ "status": status }));
        }
        object_at(&mut xr, &["status"]).insert("conditions".into(), Value::Array(conditions));
        Ok(self.assemble(xr, composed, self.deleted(), &events))
    }

    /// The observed composed resources Crossplane's garbage collector
    /// deletes: those the pipeline no longer desires and the XR controls
    /// (one it does not control is left alone, as Crossplane leaves it).
    fn deleted(&self) -> Vec<Value> {
        let uid = self.xr_str(&["metadata", "uid"]);
        self.observed
            .resources
            .iter()
            .filter(|(name, _)| !self.outcome.resources.contains_key(name))
            .filter(|(_, object)| {
                object
                    .get("metadata")
                    .and_then(|m| m.get("ownerReferences"))
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r.get("controller") == Some(&json!(true))
                                && get_str(r, &["uid"]) == Some(uid)
                        })
                    })
            })
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// The XR (merged over the input with `-x`), the composed resources,
    /// the deleted ones (`--include-deleted-resources`), the results (`-r`),
    /// the requirements (`--include-requirements`) and the context (`-c`).
    fn assemble(
        &self,
        xr: Value,
        composed: Vec<Value>,
        deleted: Vec<Value>,
        events: &[Event],
    ) -> Vec<Value> {
        let xr = if self.options.include_full {
            let mut full = self.input_xr.clone();
            merge(&mut full, &xr);
            full
        } else {
            xr
        };
        let mut out = vec![xr];
        out.extend(composed);
        if self.options.include_deleted {
            out.extend(deleted.into_iter().map(|resource| {
                json!({
                    "apiVersion": RENDER_API_VERSION,
                    "kind": "DeletedResource",
                    "resource": resource,
                })
            }));
        }
        if self.options.include_results {
            out.extend(events.iter().map(Event::to_object));
        }
        if self.options.include_requirements {
            out.push(requirements_object(self.outcome));
        }
        if self.options.include_context {
            out.push(context_object(self.outcome));
        }
        out
    }

    /// apiVersion, kind, name and namespace of the XR.
    fn identity(&self) -> Value {
        let mut metadata = Map::new();
        metadata.insert("name".into(), json!(self.xr_str(&["metadata", "name"])));
        if let Some(ns) = self.namespace() {
            metadata.insert("namespace".into(), json!(ns));
        }
        json!({
            "apiVersion": self.xr_str(&["apiVersion"]),
            "kind": self.xr_str(&["kind"]),
            "metadata": metadata,
        })
    }

    fn xr_str(&self, path: &[&str]) -> &str {
        get_str(self.xr, path).unwrap_or_default()
    }

    fn namespace(&self) -> Option<&str> {
        get_str(self.xr, &["metadata", "namespace"]).filter(|ns| !ns.is_empty())
    }

    /// A composed resource with the metadata Crossplane sets: an observed
    /// resource's name, namespace and generateName; the XR's namespace for a
    /// namespaced XR (a warning event if the function asked for another);
    /// generateName from the composite label; the resource-name annotation;
    /// the composite (and claim) labels; the XR as controller; a name
    /// derived from the XR's uid, checked against RFC 1123.
    fn composed_object(
        &self,
        name: &str,
        desired: &Value,
    ) -> Result<(Value, Option<Event>), ComposeError> {
        let mut object = if desired.is_object() {
            desired.clone()
        } else {
            json!({})
        };
        let xr_labels = |key: &str| get_str(self.xr, &["metadata", "labels", key]);
        let prefix = xr_labels(COMPOSITE_LABEL).unwrap_or_default().to_string();
        let meta = object_at(&mut object, &["metadata"]);
        if let Some(observed) = self.observed.resource(name) {
            for field in ["namespace", "name", "generateName"] {
                match get_str(observed, &["metadata", field]).filter(|v| !v.is_empty()) {
                    Some(v) => meta.insert(field.into(), json!(v)),
                    None => meta.remove(field),
                };
            }
        }
        let mut event = None;
        if let Some(xr_ns) = self.namespace() {
            let own = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
            if !own.is_empty() && own != xr_ns {
                event = Some(Event::warning(
                    REASON_NAMESPACE,
                    format!(
                        "cannot create composed resource {name:?} in namespace {own:?}, using XR \
                         namespace {xr_ns:?} instead"
                    ),
                ));
            }
            meta.insert("namespace".into(), json!(xr_ns));
        }
        let has = |m: &Map<String, Value>, k: &str| {
            m.get(k)
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty())
        };
        if !has(meta, "name") && !has(meta, "generateName") {
            meta.insert("generateName".into(), json!(format!("{prefix}-")));
        }
        object_at(&mut object, &["metadata", "annotations"])
            .insert(RESOURCE_NAME_ANNOTATION.into(), json!(name));
        let labels = object_at(&mut object, &["metadata", "labels"]);
        labels.insert(COMPOSITE_LABEL.into(), json!(prefix));
        if let (Some(claim), Some(claim_ns)) = (
            xr_labels("crossplane.io/claim-name"),
            xr_labels("crossplane.io/claim-namespace"),
        ) {
            labels.insert("crossplane.io/claim-name".into(), json!(claim));
            labels.insert("crossplane.io/claim-namespace".into(), json!(claim_ns));
        }
        let uid = self.xr_str(&["metadata", "uid"]);
        let meta = object_at(&mut object, &["metadata"]);
        let mut owners: Vec<Value> = meta
            .get("ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        owners.retain(|o| get_str(o, &["uid"]) != Some(uid));
        owners.push(json!({
            "apiVersion": self.xr_str(&["apiVersion"]),
            "kind": self.xr_str(&["kind"]),
            "name": self.xr_str(&["metadata", "name"]),
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }));
        meta.insert("ownerReferences".into(), Value::Array(owners));
        if !has(meta, "name") {
            let generate = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let generated = child_name(generate, uid, name);
            meta.insert("name".into(), json!(generated));
        }
        let object_name = get_str(&object, &["metadata", "name"]).unwrap_or_default();
        let api_version = get_str(&object, &["apiVersion"]).unwrap_or_default();
        let kind = get_str(&object, &["kind"]).unwrap_or_default();
        if !valid_object_name(object_name, api_version, kind) {
            return Err(ComposeError::Compose(format!(
                "cannot apply composed resource {name:?} because it has an invalid name \
                 {object_name:?}. Must be a valid RFC 1123 subdomain name."
            )));
        }
        Ok((object, event))
    }

    /// The XR's reference to a composed resource (no namespace for a
    /// namespaced XR: it can only compose in its own).
    fn reference(&self, object: &Value) -> Value {
        let mut r = Map::new();
        for key in ["apiVersion", "kind"] {
            r.insert(
                key.into(),
                json!(get_str(object, &[key]).unwrap_or_default()),
            );
        }
        r.insert(
            "name".into(),
            json!(get_str(object, &["metadata", "name"]).unwrap_or_default()),
        );
        if self.namespace().is_none() {
            if let Some(ns) = get_str(object, &["metadata", "namespace"]).filter(|n| !n.is_empty())
            {
                r.insert("namespace".into(), json!(ns));
            }
        }
        Value::Object(r)
    }
}

/// The Requirements object `--include-requirements` prints: every
/// resource and schema the pipeline's steps required in their last call.
pub(crate) fn requirements_object(outcome: &Outcome) -> Value {
    json!({
        "apiVersion": RENDER_API_VERSION,
        "kind": "Requirements",
        "requiredResources": outcome.required_resources,
        "requiredSchemas": outcome.required_schemas,
    })
}

/// The Context object `-c` prints.
pub(crate) fn context_object(outcome: &Outcome) -> Value {
    json!({
        "apiVersion": RENDER_API_VERSION,
        "kind": "Context",
        "fields": outcome.context.clone().unwrap_or_else(|| json!({})),
    })
}

/// One render's output (`objects`: the XR or Operation first, then what
/// the YAML stream prints after it) as one JSON object for
/// `--output json`: `{"xr" (or "operation"), "resources": [composed],
/// "results": [Result], "context": {fields}, "deletedResources":
/// [DeletedResource], "requirements": {…}}`, the optional keys only where
/// the flags that print them were given.
pub(crate) fn json_object(objects: &[Value]) -> Value {
    let mut out = Map::new();
    let Some((first, rest)) = objects.split_first() else {
        return Value::Object(out);
    };
    let operation =
        get_str(first, &["apiVersion"]).is_some_and(|a| a.starts_with("ops.crossplane.io/"));
    out.insert(
        if operation { "operation" } else { "xr" }.into(),
        first.clone(),
    );
    let mut resources = Vec::new();
    let mut results = Vec::new();
    let mut deleted = Vec::new();
    for object in rest {
        let ours = get_str(object, &["apiVersion"]) == Some(RENDER_API_VERSION);
        match get_str(object, &["kind"]).filter(|_| ours) {
            Some("Result") => results.push(object.clone()),
            Some("DeletedResource") => deleted.push(object.clone()),
            Some("Context") => {
                out.insert("context".into(), object["fields"].clone());
            }
            Some("Requirements") => {
                let mut requirements = object.clone();
                if let Some(fields) = requirements.as_object_mut() {
                    fields.remove("apiVersion");
                    fields.remove("kind");
                }
                out.insert("requirements".into(), requirements);
            }
            _ => resources.push(object.clone()),
        }
    }
    out.insert("resources".into(), Value::Array(resources));
    out.insert("results".into(), Value::Array(results));
    if !deleted.is_empty() {
        out.insert("deletedResources".into(), Value::Array(deleted));
    }
    Value::Object(out)
}

/// The objects as a `---` separated YAML stream, quoted as `crossplane
/// render` quotes (go-yaml v2: what a YAML 1.1 reader would not read back
/// as a string is double-quoted).
pub(crate) fn to_yaml_stream(objects: &[Value]) -> Result<String, ComposeError> {
    let mut text = String::new();
    for object in objects {
        text.push_str("---\n");
        text.push_str(
            &crate::compose::print::yaml11::to_string(object).map_err(ComposeError::OutputYaml)?,
        );
    }
    Ok(text)
}

/// `Ready`: Available when every composed resource is ready (a function
/// said `READY_TRUE`), else Creating naming the unready ones (the first
/// three, sorted, and how many more); an XR readiness the pipeline set wins.
fn ready_condition(unready: &[&str], composite_ready: Option<bool>) -> Value {
    match composite_ready {
        Some(true) => return condition("Ready", "True", "Available", None),
        Some(false) => return condition("Ready", "False", "Creating", None),
        None => {}
    }
    readiness_of(unready)
}

/// Crossplane's Ready condition for the given unready resources: Available
/// when none, else Creating naming the first three and how many more.
pub(crate) fn readiness_of(unready: &[&str]) -> Value {
    if unready.is_empty() {
        return condition("Ready", "True", "Available", None);
    }
    // crossplane-runtime's FirstNAndSomeMore with DefaultFirstN (3), as
    // Crossplane's composite reconciler words it: "a, b, and 2 more",
    // "a, b, and c", "a, b".
    const FIRST: usize = 3;
    let listed = match unready.len() {
        n if n > FIRST => format!("{}, and {} more", unready[..FIRST].join(", "), n - FIRST),
        FIRST => format!(
            "{}, and {}",
            unready[..FIRST - 1].join(", "),
            unready[FIRST - 1]
        ),
        _ => unready.join(", "),
    };
    condition(
        "Ready",
        "False",
        "Creating",
        Some(&format!("Unready resources: {listed}")),
    )
}

#[cfg(test)]
mod tests;
