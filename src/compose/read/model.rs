//! Crossplane's objects as a render reads them: the XR, the Composition
//! (its pipeline steps, or an alpha Composition's functions), the
//! Functions and how each is run, observed composed resources. Each is
//! checked as it is built from an object; reading the files they come
//! from is [`crate::compose::read::files`]'s. Every error names the file.
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::compose::ComposeError;
use crate::value::{get, get_str};

/// Annotation naming a composed resource within its Composition.
pub(crate) const RESOURCE_NAME_ANNOTATION: &str = "crossplane.io/composition-resource-name";

/// `apiVersion` without the version: `example.org/v1` → `example.org`.
pub(crate) fn group(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map_or("", |(group, _version)| group)
}

/// A composite resource (XR) read from a file.
#[derive(Debug, Clone)]
pub(crate) struct Composite {
    /// The object.
    pub(crate) object: Value,
}

impl Composite {
    /// Checks the XR `object` read from `path`.
    pub(crate) fn from_object(path: &Path, object: Value) -> Result<Self, ComposeError> {
        for field in ["apiVersion", "kind"] {
            if get_str(&object, &[field]).is_none_or(str::is_empty) {
                return Err(ComposeError::Invalid {
                    path: path.to_path_buf(),
                    message: format!("the composite resource has no {field}"),
                });
            }
        }
        if get_str(&object, &["metadata", "name"]).is_none_or(str::is_empty) {
            return Err(ComposeError::Invalid {
                path: path.to_path_buf(),
                message: "the composite resource has no metadata.name".into(),
            });
        }
        Ok(Self { object })
    }

    /// `apiVersion`.
    pub(crate) fn api_version(&self) -> &str {
        get_str(&self.object, &["apiVersion"]).unwrap_or_default()
    }
    /// `kind`.
    pub(crate) fn kind(&self) -> &str {
        get_str(&self.object, &["kind"]).unwrap_or_default()
    }
}

/// One step of a v1 (`mode: Pipeline`) Composition.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PipelineStep {
    /// The step's name.
    pub(crate) step: String,
    /// Which Function runs it.
    #[serde(rename = "functionRef")]
    pub(crate) function_ref: FunctionRef,
    /// The step's input object.
    #[serde(default)]
    pub(crate) input: Option<Value>,
    /// Credentials the step is given.
    #[serde(default)]
    pub(crate) credentials: Vec<StepCredentials>,
    /// Resources and schemas the step gets on its first call (bootstrap
    /// requirements), besides those it asks for.
    #[serde(default)]
    pub(crate) requirements: Option<StepRequirements>,
}

/// `requirements` of a pipeline step.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StepRequirements {
    /// Resources, by requirement name.
    #[serde(default)]
    pub(crate) required_resources: Vec<RequiredResourceSelector>,
    /// Schemas, by requirement name.
    #[serde(default)]
    pub(crate) required_schemas: Vec<RequiredSchemaSelector>,
}

/// One `requirements.requiredResources[]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequiredResourceSelector {
    /// The name the function sees them under.
    pub(crate) requirement_name: String,
    /// apiVersion of the resources.
    pub(crate) api_version: String,
    /// kind of the resources.
    pub(crate) kind: String,
    /// One resource by name...
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// ...or all with these labels.
    #[serde(default)]
    pub(crate) match_labels: Option<std::collections::BTreeMap<String, String>>,
    /// In this namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
}

/// One `requirements.requiredSchemas[]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequiredSchemaSelector {
    /// The name the function sees it under.
    pub(crate) requirement_name: String,
    /// apiVersion of the kind.
    pub(crate) api_version: String,
    /// The kind.
    pub(crate) kind: String,
}

/// `functionRef`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct FunctionRef {
    /// The Function's `metadata.name`.
    pub(crate) name: String,
}

/// One `credentials[]` entry of a step.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct StepCredentials {
    /// The name the function sees them under.
    pub(crate) name: String,
    /// Only `Secret` exists.
    #[serde(default)]
    pub(crate) source: String,
    /// The Secret.
    #[serde(rename = "secretRef", default)]
    pub(crate) secret_ref: Option<SecretRef>,
}

/// A reference to a Secret.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SecretRef {
    /// Namespace.
    #[serde(default)]
    pub(crate) namespace: String,
    /// Name.
    pub(crate) name: String,
}

/// One step of an alpha Composition (`spec.functions[]`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct AlphaFunction {
    /// The step's name.
    pub(crate) name: String,
    /// Only `Container` exists.
    #[serde(rename = "type", default)]
    pub(crate) kind: String,
    /// The config object given to the function.
    #[serde(default)]
    pub(crate) config: Option<Value>,
    /// How to run the container.
    #[serde(default)]
    pub(crate) container: Option<ContainerSpec>,
}

/// `container` of an alpha function.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContainerSpec {
    /// OCI reference.
    pub(crate) image: String,
    /// IfNotPresent (default), Always or Never.
    #[serde(default)]
    pub(crate) image_pull_policy: Option<String>,
    /// Go duration; 20s when unset.
    #[serde(default)]
    pub(crate) timeout: Option<String>,
    /// `network.policy`.
    #[serde(default)]
    pub(crate) network: Option<NetworkSpec>,
    /// `resources.limits`.
    #[serde(default)]
    pub(crate) resources: Option<ResourcesSpec>,
    /// `runner.endpoint`.
    #[serde(default)]
    pub(crate) runner: Option<RunnerSpec>,
}

/// `container.network`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct NetworkSpec {
    /// Isolated or Runner.
    #[serde(default)]
    pub(crate) policy: Option<String>,
}

/// `container.resources`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ResourcesSpec {
    /// `limits`.
    #[serde(default)]
    pub(crate) limits: Option<LimitsSpec>,
}

/// `container.resources.limits`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct LimitsSpec {
    /// CPU quantity.
    #[serde(default)]
    pub(crate) cpu: Option<String>,
    /// Memory quantity.
    #[serde(default)]
    pub(crate) memory: Option<String>,
}

/// `container.runner`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RunnerSpec {
    /// gRPC endpoint of the runner daemon.
    #[serde(default)]
    pub(crate) endpoint: Option<String>,
}

/// What a Composition asks for.
#[derive(Debug, Clone)]
pub(crate) enum Pipeline {
    /// `mode: Pipeline`.
    V1(Vec<PipelineStep>),
    /// `spec.functions[]` (Crossplane v1.11–v1.13).
    Alpha(Vec<AlphaFunction>),
}

/// A Composition (or a CompositionRevision, the revision an XR is pinned
/// to) read from a file.
#[derive(Debug, Clone)]
pub(crate) struct Composition {
    /// The Composition's name (a revision's `crossplane.io/composition-name`
    /// label, else its name without the hash suffix).
    pub(crate) name: String,
    /// The revision's name, when a CompositionRevision was given.
    pub(crate) revision: Option<String>,
    /// The steps.
    pub(crate) pipeline: Pipeline,
}

/// The label naming a CompositionRevision's Composition.
pub(crate) const COMPOSITION_NAME_LABEL: &str = "crossplane.io/composition-name";

impl Composition {
    /// The `compositeTypeRef` (`apiVersion`, `kind`) of a Composition
    /// object, empty where it has none (then [`Composition::from_object`]
    /// says so).
    pub(crate) fn composite_type(object: &Value) -> (&str, &str) {
        let field =
            |name: &str| get_str(object, &["spec", "compositeTypeRef", name]).unwrap_or_default();
        (field("apiVersion"), field("kind"))
    }

    /// The steps of `object` when it is an alpha Composition (mode not
    /// Pipeline, `spec.functions`), unchecked; None for any other (and for
    /// steps that do not parse: [`Composition::from_object`] says why).
    pub(crate) fn alpha_functions(object: &Value) -> Option<Vec<AlphaFunction>> {
        let pipeline = get_str(object, &["spec", "mode"]) == Some("Pipeline")
            || (get(object, &["spec", "mode"]).is_none()
                && get(object, &["spec", "pipeline"]).is_some());
        if pipeline {
            return None;
        }
        serde_json::from_value(get(object, &["spec", "functions"])?.clone()).ok()
    }

    /// Checks the Composition `object` read from `path` and that it
    /// composes `xr`.
    pub(crate) fn from_object(
        path: &Path,
        object: Value,
        xr: &Composite,
    ) -> Result<Self, ComposeError> {
        let invalid = |message: String| ComposeError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let api_version = get_str(&object, &["apiVersion"]).unwrap_or_default();
        let kind = get_str(&object, &["kind"]).unwrap_or_default();
        if group(api_version) != "apiextensions.crossplane.io"
            || !matches!(kind, "Composition" | "CompositionRevision")
        {
            return Err(ComposeError::WrongKind {
                path: path.to_path_buf(),
                expected: "apiextensions.crossplane.io Composition or CompositionRevision".into(),
                found: format!("{api_version} {kind}"),
            });
        }
        let type_ref = get(&object, &["spec", "compositeTypeRef"])
            .ok_or_else(|| invalid("the Composition has no spec.compositeTypeRef".into()))?;
        let want_api = get_str(type_ref, &["apiVersion"]).unwrap_or_default();
        let want_kind = get_str(type_ref, &["kind"]).unwrap_or_default();
        if want_api != xr.api_version() || want_kind != xr.kind() {
            return Err(ComposeError::TypeMismatch {
                path: path.to_path_buf(),
                composes: format!("{want_api} {want_kind}"),
                xr: format!("{} {}", xr.api_version(), xr.kind()),
            });
        }
        let own_name = get_str(&object, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        let labels = get(&object, &["metadata", "labels"])
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let (name, revision) = if kind == "CompositionRevision" {
            let composition = labels
                .get(COMPOSITION_NAME_LABEL)
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| {
                    own_name
                        .rsplit_once('-')
                        .map_or(own_name.clone(), |(c, _)| c.to_string())
                });
            (composition, Some(own_name))
        } else {
            (own_name, None)
        };
        if let Some(Value::Object(match_labels)) = get(
            &xr.object,
            &["spec", "crossplane", "compositionSelector", "matchLabels"],
        )
        .or_else(|| get(&xr.object, &["spec", "compositionSelector", "matchLabels"]))
        {
            for (key, want) in match_labels {
                match labels.get(key) {
                    None => {
                        return Err(invalid(format!(
                            "the Composition {name:?} is missing the label {key:?} the XR's compositionSelector requires"
                        )))
                    }
                    Some(got) if got != want => {
                        return Err(invalid(format!(
                            "the Composition {name:?} has {key}={got}, the XR's compositionSelector wants {want}"
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        // Crossplane v2 has only pipelines: `mode` defaults to Pipeline.
        let mode = get_str(&object, &["spec", "mode"]).unwrap_or(
            if get(&object, &["spec", "pipeline"]).is_some() {
                "Pipeline"
            } else {
                "Resources"
            },
        );
        let pipeline =
            if mode == "Pipeline" {
                Pipeline::V1(pipeline_steps(
                    &object,
                    path,
                    "mode Pipeline but no spec.pipeline",
                )?)
            } else if let Some(functions) = get(&object, &["spec", "functions"]) {
                let functions: Vec<AlphaFunction> = serde_json::from_value(functions.clone())
                    .map_err(|source| ComposeError::Field {
                        path: path.to_path_buf(),
                        field: "spec.functions",
                        source,
                    })?;
                for f in &functions {
                    if f.kind != "Container" {
                        return Err(invalid(format!(
                            "function {:?} has type {:?}; only Container is supported",
                            f.name, f.kind
                        )));
                    }
                    if f.container.as_ref().is_none_or(|c| c.image.is_empty()) {
                        return Err(invalid(format!(
                            "function {:?} has no container.image",
                            f.name
                        )));
                    }
                }
                Pipeline::Alpha(functions)
            } else {
                return Err(invalid(format!(
                    "mode {mode} has no functions to run; use mode: Pipeline (or spec.functions)"
                )));
            };
        Ok(Self {
            name,
            revision,
            pipeline,
        })
    }
}

/// How a v1 Function is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RuntimeKind {
    /// Run the image as a long-lived gRPC server.
    Docker,
    /// One run of the image per call, JSON on stdin and stdout.
    Exec,
    /// Call a server that is already running at this address.
    Development {
        /// `host:port`.
        target: String,
    },
}

/// A `pkg.crossplane.io` Function.
#[derive(Debug, Clone)]
pub(crate) struct Function {
    /// `metadata.name`.
    pub(crate) name: String,
    /// `spec.package`.
    pub(crate) package: String,
    /// From `render.crossplane.io/runtime`.
    pub(crate) runtime: RuntimeKind,
    /// `render.crossplane.io/runtime-docker-pull-policy` (or
    /// `spec.packagePullPolicy`), if any.
    pub(crate) pull_policy: Option<String>,
    /// `render.crossplane.io/runtime-docker-image`: the image to run
    /// instead of `spec.package`, if any.
    pub(crate) image_override: Option<String>,
    /// `render.crossplane.io/runtime-docker-env`: `KEY=VALUE,...` set in
    /// the server's environment (pairs without `=` are ignored, as in
    /// Crossplane).
    pub(crate) env: Vec<String>,
    /// Egress, as upstream gives every function server (a Docker network):
    /// the server shares the host's network, listening on a loopback port
    /// xfn picks. `render.crossplane.io/runtime-docker-network: none` gives
    /// it a network namespace of its own, with no network at all.
    pub(crate) host_network: bool,
    /// `render.crossplane.io/runtime-docker-cleanup: Orphan` with
    /// `render.crossplane.io/runtime-docker-name` (default: the Function's
    /// name): the server is kept running after the render, under this name,
    /// and the next render that names it reuses it.
    pub(crate) keep: Option<String>,
}

impl Function {
    /// The image its container runs.
    pub(crate) fn image(&self) -> &str {
        self.image_override.as_deref().unwrap_or(&self.package)
    }
}

/// Annotation choosing the runtime.
pub(crate) const RUNTIME_ANNOTATION: &str = "render.crossplane.io/runtime";
/// Annotation giving the Development target.
pub(crate) const TARGET_ANNOTATION: &str = "render.crossplane.io/runtime-development-target";
/// Annotation giving the pull policy.
pub(crate) const PULL_POLICY_ANNOTATION: &str = "render.crossplane.io/runtime-docker-pull-policy";
/// Annotation giving an image to run instead of `spec.package`.
pub(crate) const IMAGE_ANNOTATION: &str = "render.crossplane.io/runtime-docker-image";
/// Annotation giving the server's environment.
pub(crate) const ENV_ANNOTATION: &str = "render.crossplane.io/runtime-docker-env";
/// Annotation naming the server's Docker network (`none`: no network).
pub(crate) const NETWORK_ANNOTATION: &str = "render.crossplane.io/runtime-docker-network";
/// Annotation saying what happens to the server after the render.
pub(crate) const CLEANUP_ANNOTATION: &str = "render.crossplane.io/runtime-docker-cleanup";
/// Annotation naming a kept server.
pub(crate) const NAME_ANNOTATION: &str = "render.crossplane.io/runtime-docker-name";

impl Function {
    /// Checks the Function `object` read from `path` (its annotations
    /// already overridden by `-a`) and reads how it is run.
    pub(crate) fn from_object(path: &Path, object: Value) -> Result<Self, ComposeError> {
        let api_version = get_str(&object, &["apiVersion"]).unwrap_or_default();
        let kind = get_str(&object, &["kind"]).unwrap_or_default();
        if group(api_version) != "pkg.crossplane.io" || kind != "Function" {
            return Err(ComposeError::WrongKind {
                path: path.to_path_buf(),
                expected: "pkg.crossplane.io Function".into(),
                found: format!("{api_version} {kind}"),
            });
        }
        let name = get_str(&object, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        let annotation = |key: &str| get_str(&object, &["metadata", "annotations", key]);
        let runtime = match annotation(RUNTIME_ANNOTATION).unwrap_or("Docker") {
            "Docker" => RuntimeKind::Docker,
            "Exec" => RuntimeKind::Exec,
            "Development" => RuntimeKind::Development {
                target: development_target(
                    annotation(TARGET_ANNOTATION).unwrap_or("localhost:9443"),
                ),
            },
            other => {
                return Err(ComposeError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                    "Function {name:?}: unknown runtime {other:?} (use Docker, Exec or Development)"
                ),
                })
            }
        };
        let package = get_str(&object, &["spec", "package"])
            .unwrap_or_default()
            .to_string();
        let pull_policy = annotation(PULL_POLICY_ANNOTATION)
            .or_else(|| get_str(&object, &["spec", "packagePullPolicy"]))
            .map(str::to_string);
        let image_override = annotation(IMAGE_ANNOTATION).map(str::to_string);
        let invalid = |message: String| ComposeError::Invalid {
            path: path.to_path_buf(),
            message: format!("Function {name:?}: {message}"),
        };
        let env = annotation(ENV_ANNOTATION)
            .unwrap_or_default()
            .split(',')
            .filter(|pair| {
                let ok = pair.contains('=');
                if !ok && !pair.is_empty() {
                    tracing::debug!(pair, "ignoring an environment variable without =");
                }
                ok
            })
            .map(str::to_string)
            .collect();
        // Upstream every function server has egress: it joins a temporary
        // bridge network, or the Docker network the annotation names (a CI
        // job's network, so that a render in a container reaches it). xfn
        // runs no Docker networks and no slirp: any name means egress
        // through the host's network, and Docker's own `none` means none.
        let host_network = annotation(NETWORK_ANNOTATION) != Some("none");
        let keep = match annotation(CLEANUP_ANNOTATION).unwrap_or("Remove") {
            "Remove" | "Stop" => None,
            "Orphan" => Some(
                annotation(NAME_ANNOTATION)
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&name)
                    .to_string(),
            ),
            other => {
                return Err(invalid(format!(
                    "{CLEANUP_ANNOTATION} {other:?}: use Remove, Stop or Orphan"
                )))
            }
        };
        if let Some(keep) = &keep {
            if !crate::compose::names::valid_object_name(keep, "", "") || keep.contains('.') {
                return Err(invalid(format!(
                    "{NAME_ANNOTATION} {keep:?}: a kept server's name must be lowercase \
                 letters, digits and '-'"
                )));
            }
        }
        Ok(Function {
            name,
            package,
            runtime,
            pull_policy,
            image_override,
            env,
            host_network,
            keep,
        })
    }
}

/// A Development target as tonic takes it: gRPC's `dns:///host:port` (and
/// `dns://authority/host:port`) names `host:port`.
fn development_target(target: &str) -> String {
    match target.strip_prefix("dns://") {
        Some(rest) => rest
            .split_once('/')
            .map_or(rest, |(_authority, host)| host)
            .to_string(),
        None => target.to_string(),
    }
}

/// Composed resources as observed, keyed by their composition resource name.
pub(crate) fn observed_by_name(
    path: &Path,
    objects: Vec<Value>,
) -> Result<Vec<(String, Value)>, ComposeError> {
    let mut named = Vec::new();
    for object in objects {
        let Some(name) = get_str(
            &object,
            &["metadata", "annotations", RESOURCE_NAME_ANNOTATION],
        ) else {
            return Err(ComposeError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "observed resource {} has no {RESOURCE_NAME_ANNOTATION} annotation",
                    get_str(&object, &["metadata", "name"]).unwrap_or("(unnamed)")
                ),
            });
        };
        named.push((name.to_string(), object));
    }
    Ok(named)
}

/// `spec.pipeline` of a Composition or an Operation at `path`: its steps,
/// at least one; `missing` says what is wrong when it has none.
pub(crate) fn pipeline_steps(
    object: &Value,
    path: &Path,
    missing: &str,
) -> Result<Vec<PipelineStep>, ComposeError> {
    let invalid = |message: &str| ComposeError::Invalid {
        path: path.to_path_buf(),
        message: message.to_string(),
    };
    let steps = get(object, &["spec", "pipeline"])
        .cloned()
        .ok_or_else(|| invalid(missing))?;
    let steps: Vec<PipelineStep> =
        serde_json::from_value(steps).map_err(|source| ComposeError::Field {
            path: path.to_path_buf(),
            field: "spec.pipeline",
            source,
        })?;
    if steps.is_empty() {
        return Err(invalid("spec.pipeline is empty"));
    }
    Ok(steps)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn development_targets_may_be_grpc_dns_names() {
        assert_eq!(
            development_target("dns:///localhost:9443"),
            "localhost:9443"
        );
        assert_eq!(
            development_target("dns://8.8.8.8/fn.example:9443"),
            "fn.example:9443"
        );
        assert_eq!(development_target("127.0.0.1:9443"), "127.0.0.1:9443");
    }
}
