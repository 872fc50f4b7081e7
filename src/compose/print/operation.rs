//! An Operation's output as `crossplane operation render` prints it: the
//! Operation with the status Crossplane's reconciler writes (`Succeeded`,
//! `ValidPipeline`, `Synced`; each step's output; `appliedResourceRefs`),
//! the resources it applies, and its events.
use serde_json::{json, Map, Value};

use crate::compose::print::output::{condition, context_object, Event};
use crate::compose::read::operation::Operation;
use crate::compose::Outcome;
use crate::compose::OutputOptions;
use crate::value::{get_str, merge};

impl Operation {
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
