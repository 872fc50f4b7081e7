//! Operations (`ops.crossplane.io/v1alpha1`), rendered as `crossplane
//! operation render` renders them: an `Operation` as given; a
//! `CronOperation` or `WatchOperation` as the Operation its template makes
//! (named after it, with the template's labels and annotations); for a
//! `WatchOperation`, the watched resource (`-w`) is required by every step
//! under `ops.crossplane.io/watched-resource`, as Crossplane's controller
//! does, and is added to the required resources.
//!
//! Its output is printed by `crate::compose::print` (operation.rs).
use std::path::Path;

use serde_json::{json, Value};

use crate::compose::read::model::{
    pipeline_steps, PipelineStep, RequiredResourceSelector, StepRequirements,
};
use crate::compose::ComposeError;
use crate::value::{get, get_str, object_at};

/// The requirement name a WatchOperation's watched resource is given under.
pub(crate) const WATCHED_RESOURCE: &str = "ops.crossplane.io/watched-resource";

/// An Operation to render.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    /// The Operation object (from a CronOperation or WatchOperation: the
    /// one its template makes).
    pub(crate) object: Value,
    /// Its pipeline.
    pub(crate) steps: Vec<PipelineStep>,
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
        let mut steps = pipeline_steps(&operation, path, "the Operation has no spec.pipeline")?;
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
}
