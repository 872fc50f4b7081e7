//! Operations (`ops.crossplane.io/v1alpha1`), rendered as `crossplane
//! operation render` renders them: an `Operation` as given; a
//! `CronOperation` or `WatchOperation` as the Operation its template makes
//! (named after it, with the template's labels and annotations); for a
//! `WatchOperation`, the watched resource (`-w`) is required by every step
//! under `ops.crossplane.io/watched-resource`, as Crossplane's controller
//! does, and is added to the required resources.
//!
//! The output is the Operation with the status Crossplane's reconciler
//! writes (`Succeeded`, `ValidPipeline`, `Synced`; each step's output;
//! `appliedResourceRefs`), the resources it applies, and its events.
use std::path::Path;

use serde_json::{json, Map, Value};

use super::model::{PipelineStep, RequiredResourceSelector, StepRequirements};
use super::output::{condition, context_object, Event, OutputOptions};
use super::value::{get, get_str, merge, object_at};
use super::{ComposeError, Outcome};

/// The requirement name a WatchOperation's watched resource is given under.
pub(crate) const WATCHED_RESOURCE: &str = "ops.crossplane.io/watched-resource";

/// An Operation to render.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    /// The Operation object (from a CronOperation or WatchOperation: the
    /// one its template makes).
    pub object: Value,
    /// Its pipeline.
    pub steps: Vec<PipelineStep>,
}

/// Whether `object` is an Operation, CronOperation or WatchOperation.
pub(crate) fn is_operation(object: &Value) -> bool {
    get_str(object, &["apiVersion"]).is_some_and(|v| v.starts_with("ops.crossplane.io/"))
}

impl Operation {
    /// The Operation `object` (read from `path`) is or makes; `watched` is
    /// the resource a WatchOperation watches.
    pub(crate) fn from_object(
        path: &Path,
        object: Value,
        watched: Option<&Value>,
    ) -> Result<Self, ComposeError> {
        let invalid = |message: String| ComposeError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let api_version = get_str(&object, &["apiVersion"])
            .unwrap_or_default()
            .to_string();
        let kind = get_str(&object, &["kind"]).unwrap_or_default().to_string();
        let name = get_str(&object, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            return Err(invalid(format!("the {kind} has no metadata.name")));
        }
        let mut operation = match kind.as_str() {
            "Operation" => object,
            "CronOperation" | "WatchOperation" => {
                let template = get(&object, &["spec", "operationTemplate"])
                    .ok_or_else(|| invalid(format!("the {kind} has no spec.operationTemplate")))?;
                let mut metadata = get(template, &["metadata"])
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                // Crossplane's controller generates a name; the parent's
                // is clearer, as `crossplane operation render` does.
                metadata.insert("name".into(), json!(name));
                json!({
                    "apiVersion": api_version,
                    "kind": "Operation",
                    "metadata": metadata,
                    "spec": get(template, &["spec"]).cloned().unwrap_or_else(|| json!({})),
                })
            }
            other => {
                return Err(ComposeError::WrongKind {
                    path: path.to_path_buf(),
                    expected: "ops.crossplane.io Operation, CronOperation or WatchOperation".into(),
                    found: format!("{api_version} {other}"),
                })
            }
        };
        match (kind.as_str(), watched) {
            ("WatchOperation", None) => {
                return Err(invalid(
                    "a WatchOperation needs the watched resource (-w/--watched-resource FILE)"
                        .into(),
                ))
            }
            (k, Some(_)) if k != "WatchOperation" => {
                return Err(invalid(format!(
                    "--watched-resource is for WatchOperations; this is a {k}"
                )))
            }
            _ => {}
        }
        let steps = get(&operation, &["spec", "pipeline"])
            .cloned()
            .ok_or_else(|| invalid("the Operation has no spec.pipeline".into()))?;
        let mut steps: Vec<PipelineStep> =
            serde_json::from_value(steps).map_err(|source| ComposeError::Field {
                path: path.to_path_buf(),
                field: "spec.pipeline",
                source,
            })?;
        if steps.is_empty() {
            return Err(invalid("spec.pipeline is empty".into()));
        }
        if let Some(watched) = watched {
            let selector = RequiredResourceSelector {
                requirement_name: WATCHED_RESOURCE.into(),
                api_version: get_str(watched, &["apiVersion"]).unwrap_or_default().into(),
                kind: get_str(watched, &["kind"]).unwrap_or_default().into(),
                name: get_str(watched, &["metadata", "name"]).map(str::to_string),
                match_labels: None,
                namespace: get_str(watched, &["metadata", "namespace"]).map(str::to_string),
            };
            for step in &mut steps {
                step.requirements
                    .get_or_insert_with(StepRequirements::default)
                    .required_resources
                    .push(selector.clone());
            }
            // Shown in the output's spec (-o) as Crossplane's controller
            // writes it into the Operation it creates.
            if let Some(Value::Array(pipeline)) = operation
                .get_mut("spec")
                .and_then(|s| s.get_mut("pipeline"))
            {
                for step in pipeline {
                    let requirements = object_at(step, &["requirements"]);
                    let list = requirements
                        .entry("requiredResources")
                        .or_insert_with(|| json!([]));
                    if let Value::Array(list) = list {
                        let mut entry = json!({
                            "requirementName": WATCHED_RESOURCE,
                            "apiVersion": selector.api_version,
                            "kind": selector.kind,
                            "name": selector.name,
                        });
                        if let Some(ns) = &selector.namespace {
                            entry["namespace"] = json!(ns);
                        }
                        list.push(entry);
                    }
                }
            }
        }
        Ok(Self {
            object: operation,
            steps,
        })
    }

    /// The output objects: the Operation with its status (all of it with
    /// `include_full`), the applied resources, the events (`-r`) and the
    /// context (`-c`).
    pub(crate) fn objects(&self, outcome: &Outcome, options: OutputOptions) -> Vec<Value> {
        let mut events: Vec<Event> = outcome
            .results
            .iter()
            .map(|r| Event::of_result(r, "RunPipelineStep", false))
            .collect();
        let mut status = Map::new();
        let pipeline: Vec<Value> = outcome
            .outputs
            .iter()
            .map(|(step, output)| json!({"step": step, "output": output}))
            .collect();
        if !pipeline.is_empty() {
            status.insert("pipeline".into(), Value::Array(pipeline));
        }
        let valid = condition("ValidPipeline", "True", "ValidPipeline", None);
        let mut applied = Vec::new();
        if let Some(fatal) = &outcome.fatal {
            let error = format!(
                "pipeline step {:?} returned a fatal result: {}",
                fatal.step, fatal.message
            );
            events.push(Event {
                warning: true,
                reason: "FunctionInvocation".into(),
                message: error.clone(),
            });
            status.insert("failures".into(), json!(1));
            status.insert(
                "conditions".into(),
                json!([
                    condition("Succeeded", "Unknown", "PipelineRunning", None),
                    valid,
                    condition("Synced", "False", "ReconcileError", Some(&error)),
                ]),
            );
        } else {
            let mut refs = Vec::new();
            for resource in outcome.resources.values() {
                let object = &resource.object;
                let mut r = json!({
                    "apiVersion": get_str(object, &["apiVersion"]).unwrap_or_default(),
                    "kind": get_str(object, &["kind"]).unwrap_or_default(),
                    "name": get_str(object, &["metadata", "name"]).unwrap_or_default(),
                });
                if let Some(ns) = get_str(object, &["metadata", "namespace"]) {
                    r["namespace"] = json!(ns);
                }
                if !refs.contains(&r) {
                    refs.push(r);
                }
                applied.push(object.clone());
            }
            refs.sort_by_key(|r| {
                ["apiVersion", "kind", "namespace", "name"]
                    .iter()
                    .map(|k| get_str(r, &[k]).unwrap_or_default())
                    .collect::<String>()
            });
            if !refs.is_empty() {
                status.insert("appliedResourceRefs".into(), Value::Array(refs));
            }
            status.insert(
                "conditions".into(),
                json!([
                    condition("Succeeded", "True", "PipelineSuccess", None),
                    valid,
                    condition("Synced", "True", "ReconcileSuccess", None),
                ]),
            );
        }
        let mut operation = if options.include_full {
            self.object.clone()
        } else {
            let mut metadata = Map::new();
            for key in ["name", "namespace"] {
                if let Some(v) = get_str(&self.object, &["metadata", key]) {
                    metadata.insert(key.into(), json!(v));
                }
            }
            json!({
                "apiVersion": get_str(&self.object, &["apiVersion"]).unwrap_or_default(),
                "kind": "Operation",
                "metadata": metadata,
            })
        };
        merge(&mut operation, &json!({ "status": Value::Object(status) }));
        let mut out = vec![operation];
        out.extend(applied);
        if options.include_results {
            out.extend(events.iter().map(Event::to_object));
        }
        if options.include_context {
            out.push(context_object(outcome));
        }
        out
    }
}
