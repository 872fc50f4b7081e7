//! The alpha pipeline (`spec.functions[]`, Crossplane v1.11–v1.13): one
//! FunctionIO YAML document per step. Every step sees the same `observed`;
//! `desired` and `results` flow from one step to the next (each step passes
//! them on); after the last step the first Fatal result fails the render.
//!
//! Files: [`function_io`] (the document), [`container`] (how a step's
//! container runs).
use std::collections::BTreeMap;

use serde_json::Value;

use crate::compose::read::model::AlphaFunction;
use crate::compose::{ComposeError, ComposedResource, Observed, Outcome, Readiness, StepResult};
use crate::proto_json::ProtocolError;
use crate::value::get;

pub(crate) mod container;
pub(crate) mod function_io;
pub(crate) mod output;

pub(crate) use container::ContainerConfig;
pub(crate) use function_io::*;

/// Runs one alpha step's container: FunctionIO YAML in, FunctionIO YAML out.
#[async_trait::async_trait]
pub(crate) trait AlphaStep: Send + Sync {
    /// Gets ready to run a step's container (pulls its image, makes its
    /// container ahead), so that every step's is prepared at once before
    /// the first runs. Running without it works too.
    async fn prepare(&self, _config: &ContainerConfig) -> Result<(), ComposeError> {
        Ok(())
    }

    /// Runs the container once.
    async fn run(&self, input: &[u8], config: &ContainerConfig) -> Result<Vec<u8>, ComposeError>;
}

/// Runs an alpha pipeline.
pub(crate) async fn run_alpha(
    functions: &[AlphaFunction],
    executor: &dyn AlphaStep,
    observed: &Observed,
) -> Result<Outcome, ComposeError> {
    let mut io = FunctionIo {
        api_version: FUNCTION_IO_API_VERSION.into(),
        kind: "FunctionIO".into(),
        observed: ObservedState {
            composite: ObservedComposite {
                resource: observed.composite.clone(),
                connection_details: Vec::new(),
            },
            resources: observed
                .resources
                .iter()
                .map(|(name, object)| ObservedResource {
                    name: name.clone(),
                    resource: object.clone(),
                    connection_details: Vec::new(),
                })
                .collect(),
        },
        ..Default::default()
    };
    // Every step's container prepared at once, before the first runs.
    let prepared = functions.iter().map(|function| async move {
        let spec = function.container.clone().unwrap_or_default();
        match ContainerConfig::from_spec(&spec) {
            Ok(config) => executor.prepare(&config).await,
            // Said by the step itself when it runs.
            Err(_) => Ok(()),
        }
    });
    futures::future::try_join_all(prepared).await?;
    // Which step first returned each result (results carry no step).
    let mut result_steps: Vec<String> = Vec::new();
    for function in functions {
        let failed = |message: String| ComposeError::StepFailed {
            step: function.name.clone(),
            message,
        };
        let spec = function.container.clone().unwrap_or_default();
        let config = ContainerConfig::from_spec(&spec).map_err(failed)?;
        io.config = function.config.clone();
        let step_failed = |source: ComposeError| match source {
            ComposeError::StepFailed { .. } | ComposeError::Step { .. } => source,
            other => ComposeError::Step {
                step: function.name.clone(),
                source: Box::new(other),
            },
        };
        let what = "FunctionIO";
        let input = yaml_serde::to_string(&io)
            .map_err(|source| step_failed(ProtocolError::ToYaml { what, source }.into()))?;
        let output = executor
            .run(input.as_bytes(), &config)
            .await
            .map_err(step_failed)?;
        crate::nesting::check(&output)
            .map_err(|source| step_failed(ProtocolError::OutOfBounds { what, source }.into()))?;
        let out: FunctionIo = yaml_serde::from_slice(&output)
            .map_err(|source| step_failed(ProtocolError::NotYaml { what, source }.into()))?;
        // Only desired and results flow on; observed stays what was observed.
        io.desired = out.desired;
        io.results = out.results;
        while result_steps.len() < io.results.len() {
            result_steps.push(function.name.clone());
        }
    }
    let mut outcome = Outcome::default();
    for (result, step) in io.results.iter().zip(&result_steps) {
        if result.severity == "Fatal" {
            return Err(ComposeError::Fatal {
                step: step.clone(),
                message: result.message.clone(),
            });
        }
        outcome.results.push(StepResult {
            step: step.clone(),
            severity: match result.severity.as_str() {
                "Normal" => crate::proto::v1::Severity::Normal,
                "Warning" => crate::proto::v1::Severity::Warning,
                _ => crate::proto::v1::Severity::Unspecified,
            },
            message: result.message.clone(),
            reason: None,
        });
    }
    outcome.desired_composite = io.desired.composite.map(|c| c.resource);
    outcome.resources = io
        .desired
        .resources
        .into_iter()
        // `resource: null` asks for deletion: it is not composed.
        .filter(|r| !r.resource.is_null())
        .map(|r| {
            let ready = readiness(&r, observed.resource(&r.name));
            (
                r.name,
                ComposedResource {
                    object: r.resource,
                    ready,
                },
            )
        })
        .collect::<BTreeMap<_, _>>();
    Ok(outcome)
}

/// Readiness by the resource's checks against its observed state (default:
/// its `Ready` condition is True), as Crossplane's PTF composer.
fn readiness(resource: &DesiredResource, observed: Option<&Value>) -> Readiness {
    if resource.readiness_checks.iter().any(|c| c.kind == "None") {
        return Readiness::True;
    }
    let Some(observed) = observed else {
        return Readiness::False;
    };
    if resource.readiness_checks.is_empty() {
        return Readiness::Unspecified;
    }
    let all = resource.readiness_checks.iter().all(|check| {
        let field = check
            .field_path
            .as_deref()
            .and_then(|p| field_path(observed, p));
        match check.kind.as_str() {
            "NonEmpty" => field.is_some_and(|v| !v.is_null() && v != ""),
            "MatchString" => field.and_then(Value::as_str) == check.match_string.as_deref(),
            "MatchInteger" => {
                field.and_then(Value::as_i64).is_some()
                    && field.and_then(Value::as_i64) == check.match_integer
            }
            "MatchCondition" => {
                let (kind, status) = check
                    .match_condition
                    .as_ref()
                    .map_or(("Ready", "True"), |m| (m.kind.as_str(), m.status.as_str()));
                condition_is(observed, kind, status)
            }
            _ => false,
        }
    });
    if all {
        Readiness::True
    } else {
        Readiness::False
    }
}

/// `a.b[0].c` in `value`.
fn field_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = value;
    for part in path.split('.') {
        let (key, indexes) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            current = current.get(key)?;
        }
        for index in indexes.split('[').filter(|s| !s.is_empty()) {
            let index: usize = index.trim_end_matches(']').parse().ok()?;
            current = current.get(index)?;
        }
    }
    Some(current)
}

/// Whether `object` has condition `kind` with `status`.
pub(crate) fn condition_is(object: &Value, kind: &str, status: &str) -> bool {
    get(object, &["status", "conditions"])
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(kind)
                    && c.get("status").and_then(Value::as_str) == Some(status)
            })
        })
}

#[cfg(test)]
mod tests;
