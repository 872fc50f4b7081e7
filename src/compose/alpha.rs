//! The alpha pipeline (`spec.functions[]`, Crossplane v1.11–v1.13): one
//! FunctionIO YAML document per step. Every step sees the same `observed`;
//! `desired` and `results` flow from one step to the next (each step passes
//! them on); after the last step the first Fatal result fails the render.
use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::inputs::{AlphaFunction, ContainerSpec};
use super::value::get;
use super::{ComposeError, ComposedResource, Observed, Outcome, Readiness, StepResult};

/// `apiVersion` of FunctionIO documents xfn writes.
pub const FUNCTION_IO_API_VERSION: &str = "fn.apiextensions.crossplane.io/v1alpha1";
/// The runner endpoint alpha functions use unless they name another.
pub const DEFAULT_RUNNER_ENDPOINT: &str = "unix-abstract:crossplane/fn/default.sock";

/// `key:` with nothing after it is YAML null; treat it as absent, since
/// functions written in shell print exactly that for an empty list.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The FunctionIO document.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FunctionIo {
    /// Written as [`FUNCTION_IO_API_VERSION`]; accepted absent.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub api_version: String,
    /// `FunctionIO`; accepted absent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The step's config object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// The observed state.
    #[serde(default, deserialize_with = "nullable")]
    pub observed: ObservedState,
    /// The desired state so far.
    #[serde(default, deserialize_with = "nullable")]
    pub desired: DesiredState,
    /// The results so far.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub results: Vec<AlphaResult>,
}

/// `observed`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ObservedState {
    /// The XR.
    #[serde(default)]
    pub composite: ObservedComposite,
    /// Composed resources.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub resources: Vec<ObservedResource>,
}

/// `observed.composite`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObservedComposite {
    /// The object.
    #[serde(default)]
    pub resource: Value,
    /// Its connection details.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub connection_details: Vec<Value>,
}

/// `observed.resources[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObservedResource {
    /// Composition resource name.
    pub name: String,
    /// The object.
    #[serde(default)]
    pub resource: Value,
    /// Its connection details.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub connection_details: Vec<Value>,
}

/// `desired`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DesiredState {
    /// The desired XR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composite: Option<ObservedComposite>,
    /// Desired composed resources.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub resources: Vec<DesiredResource>,
}

/// `desired.resources[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DesiredResource {
    /// Composition resource name.
    pub name: String,
    /// The object; `null` means delete.
    #[serde(default)]
    pub resource: Value,
    /// Connection details to publish.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub connection_details: Vec<Value>,
    /// How to tell it is ready.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub readiness_checks: Vec<ReadinessCheck>,
}

/// `readinessChecks[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessCheck {
    /// MatchString, MatchInteger, NonEmpty, None or MatchCondition.
    #[serde(rename = "type")]
    pub kind: String,
    /// Dotted path into the observed resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
    /// For MatchString.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_string: Option<String>,
    /// For MatchInteger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_integer: Option<i64>,
    /// For MatchCondition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_condition: Option<MatchCondition>,
}

/// `matchCondition`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MatchCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Wanted status.
    pub status: String,
}

/// `results[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AlphaResult {
    /// Fatal, Warning or Normal.
    pub severity: String,
    /// The message.
    #[serde(default)]
    pub message: String,
}

/// How to run one alpha step's container, from its `container` spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerConfig {
    /// OCI reference.
    pub image: String,
    /// IfNotPresent, Always or Never.
    pub pull_policy: String,
    /// Kill it after this long.
    pub timeout: Duration,
    /// Isolated or Runner.
    pub network: String,
    /// CPU limit quantity.
    pub cpu: String,
    /// Memory limit quantity.
    pub memory: String,
    /// The runner daemon's endpoint.
    pub endpoint: String,
}

impl ContainerConfig {
    /// The config of `spec`, with Crossplane's defaults (20s, 100m, 128Mi).
    pub fn from_spec(spec: &ContainerSpec) -> Result<Self, String> {
        let timeout = match &spec.timeout {
            Some(t) => parse_go_duration(t)?,
            None => Duration::from_secs(20),
        };
        let limits = spec.resources.as_ref().and_then(|r| r.limits.clone());
        Ok(Self {
            image: spec.image.clone(),
            pull_policy: spec
                .image_pull_policy
                .clone()
                .unwrap_or_else(|| "IfNotPresent".into()),
            timeout,
            network: spec
                .network
                .as_ref()
                .and_then(|n| n.policy.clone())
                .unwrap_or_else(|| "Isolated".into()),
            cpu: limits
                .as_ref()
                .and_then(|l| l.cpu.clone())
                .unwrap_or_else(|| "100m".into()),
            memory: limits
                .as_ref()
                .and_then(|l| l.memory.clone())
                .unwrap_or_else(|| "128Mi".into()),
            endpoint: spec
                .runner
                .as_ref()
                .and_then(|r| r.endpoint.clone())
                .unwrap_or_else(|| DEFAULT_RUNNER_ENDPOINT.into()),
        })
    }
}

/// Parses a Go duration (`20s`, `1m30s`, `500ms`).
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 20s, 1m30s, 500ms)");
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..end].parse().map_err(|_| bad())?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * unit;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Runs one alpha step's container: FunctionIO YAML in, FunctionIO YAML out.
// `?Send`: the runner's future is not provably `Send` (a higher-ranked
// lifetime limit of rustc inside the image store); render runs the pipeline
// on one task, so it need not be.
#[async_trait::async_trait(?Send)]
pub trait AlphaStep: Send + Sync {
    /// Runs the container once.
    async fn run(&self, input: &[u8], config: &ContainerConfig) -> Result<Vec<u8>, ComposeError>;
}

/// Runs an alpha pipeline.
pub async fn run_alpha(
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
        let input = serde_yaml::to_string(&io).map_err(|e| failed(e.to_string()))?;
        let output = executor
            .run(input.as_bytes(), &config)
            .await
            .map_err(|e| match e {
                ComposeError::StepFailed { .. } => e,
                other => failed(other.to_string()),
            })?;
        let out: FunctionIo = serde_yaml::from_slice(&output)
            .map_err(|e| failed(format!("its output is not a FunctionIO: {e}")))?;
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
            severity: format!("SEVERITY_{}", result.severity.to_uppercase()),
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
pub fn condition_is(object: &Value, kind: &str, status: &str) -> bool {
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
#[path = "alpha_tests.rs"]
mod tests;
