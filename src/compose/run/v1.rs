//! The v1 pipeline (`mode: Pipeline`): one `RunFunctionRequest` per step,
//! the desired state and context flowing from step to step, requirements
//! answered from the given resources, as Crossplane's function composer does.
use std::collections::{BTreeMap, HashMap};

use prost::Message;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::compose::read::model::{PipelineStep, StepCredentials};
use crate::compose::run::runtimes::{self, Runtime, RuntimeMap};
use crate::compose::{
    ComposeError, ComposedResource, Observed, Outcome, Readiness, StepResult, XrCondition,
};
use crate::proto::v1 as pb;
use crate::value::{from_struct, get, get_str, to_struct};

/// How many times a step is re-called to satisfy its requirements: core's
/// `MaxRequirementsIterations` (so at most 6 calls, iterations 0 to 5).
pub(crate) const MAX_REQUIREMENT_ITERATIONS: usize = 5;

/// What a request says the caller supports: core's `SupportedCapabilities`.
const CAPABILITIES: [pb::Capability; 5] = [
    pb::Capability::Capabilities,
    pb::Capability::RequiredResources,
    pb::Capability::Credentials,
    pb::Capability::Conditions,
    pb::Capability::RequiredSchemas,
];

/// Everything a v1 pipeline run needs.
pub(crate) struct V1Pipeline<'a> {
    /// The Composition's steps.
    pub(crate) steps: &'a [PipelineStep],
    /// A started runtime per Function name.
    pub(crate) runtimes: &'a RuntimeMap,
    /// The XR and observed composed resources; none for an Operation.
    pub(crate) observed: Option<&'a Observed>,
    /// Resources a step may require (`-e`).
    pub(crate) required: &'a [Value],
    /// OpenAPI v3 documents schema requirements are answered from (`-s`).
    pub(crate) schemas: &'a [Value],
    /// Secrets steps may take credentials from.
    pub(crate) credentials: &'a [Value],
    /// The context the first step sees.
    pub(crate) context: Option<Value>,
}

/// Adds what a step's last call asked for to the pipeline's requirements
/// (once each, in the order of their names), as Crossplane's renderer's output has
/// them: protobuf JSON `ResourceSelector`s and `SchemaSelector`s.
fn record_requirements(
    outcome: &mut Outcome,
    requirements: &pb::Requirements,
) -> Result<(), ComposeError> {
    let resources: BTreeMap<_, _> = requirements
        .extra_resources
        .iter()
        .chain(&requirements.resources)
        .collect();
    for selector in resources.values() {
        let json = crate::proto_json::to_json("ResourceSelector", *selector)?;
        if !outcome.required_resources.contains(&json) {
            outcome.required_resources.push(json);
        }
    }
    let schemas: BTreeMap<_, _> = requirements.schemas.iter().collect();
    for selector in schemas.values() {
        let json = crate::proto_json::to_json("SchemaSelector", *selector)?;
        if !outcome.required_schemas.contains(&json) {
            outcome.required_schemas.push(json);
        }
    }
    Ok(())
}

impl V1Pipeline<'_> {
    /// Fails on a step whose `functionRef` names no known Function.
    pub(crate) fn check_function_refs(&self) -> Result<(), ComposeError> {
        for step in self.steps {
            if !self.runtimes.contains_key(&step.function_ref.name) {
                let mut known: Vec<_> = self.runtimes.keys().cloned().collect();
                known.sort();
                return Err(ComposeError::UnknownFunction {
                    step: step.step.clone(),
                    function: step.function_ref.name.clone(),
                    known: known.join(", "),
                });
            }
        }
        Ok(())
    }

    /// Runs every step in order.
    pub(crate) async fn run_steps(&self) -> Result<Outcome, ComposeError> {
        // Fail on a wrong functionRef before running anything.
        self.check_function_refs()?;
        let observed = self.observed.map(|o| self.observed_state(o));
        // Core starts the pipeline with an empty desired state and an empty
        // (present) context; each step then gets exactly what the previous
        // one returned, absent when it returned none.
        let mut desired = Some(pb::State::default());
        let mut context = Some(
            self.context
                .as_ref()
                .and_then(to_struct)
                .unwrap_or_default(),
        );
        let mut outcome = Outcome::default();
        for step in self.steps {
            let runtime = self.runtimes[&step.function_ref.name].as_ref();
            let (required_resources, required_schemas) = self.bootstrap(step);
            let mut request = pb::RunFunctionRequest {
                meta: None,
                observed: observed.clone(),
                desired: desired.clone(),
                input: step.input.as_ref().and_then(to_struct),
                context: context.clone(),
                credentials: self.step_credentials(step)?,
                required_resources,
                required_schemas,
                ..Default::default()
            };
            // Tagged once per step, from what the first call carries, as core.
            request.meta = Some(pb::RequestMeta {
                tag: tag(&request),
                capabilities: CAPABILITIES.iter().map(|c| *c as i32).collect(),
            });
            let response = self.call_with_requirements(step, runtime, request).await?;
            if let Some(requirements) = &response.requirements {
                record_requirements(&mut outcome, requirements)?;
            }
            outcome
                .conditions
                .extend(response.conditions.iter().map(xr_condition));
            for result in &response.results {
                let severity =
                    pb::Severity::try_from(result.severity).unwrap_or(pb::Severity::Unspecified);
                let result = StepResult {
                    step: step.step.clone(),
                    severity,
                    message: result.message.clone(),
                    reason: result.reason.clone().filter(|r| !r.is_empty()),
                };
                // A fatal result ends the pipeline; what came before it is
                // kept, for the partial output Crossplane's renderer returns.
                if severity == pb::Severity::Fatal {
                    outcome.fatal = Some(result);
                    outcome.context = context.as_ref().map(from_struct);
                    return Ok(outcome);
                }
                outcome.results.push(result);
            }
            if let Some(output) = &response.output {
                outcome
                    .outputs
                    .push((step.step.clone(), from_struct(output)));
            }
            // A step returns the whole desired state: what it drops is gone.
            desired = response.desired;
            context = response.context;
        }
        let desired = desired.unwrap_or_default();
        outcome.desired_composite = desired
            .composite
            .as_ref()
            .and_then(|c| c.resource.as_ref())
            .map(from_struct);
        outcome.composite_ready = match desired.composite.as_ref().map(|c| c.ready) {
            Some(r) if r == pb::Ready::True as i32 => Some(true),
            Some(r) if r == pb::Ready::False as i32 => Some(false),
            _ => None,
        };
        outcome.resources = desired
            .resources
            .iter()
            .map(|(name, r)| {
                let object = r.resource.as_ref().map(from_struct).unwrap_or_default();
                let ready = match pb::Ready::try_from(r.ready) {
                    Ok(pb::Ready::True) => Readiness::True,
                    Ok(pb::Ready::False) => Readiness::False,
                    _ => Readiness::Unspecified,
                };
                (name.clone(), ComposedResource { object, ready })
            })
            .collect::<BTreeMap<_, _>>();
        outcome.context = context.as_ref().map(from_struct);
        Ok(outcome)
    }

    /// Calls the step as core's `FetchingFunctionRunner` does
    /// (crossplane/crossplane `internal/xfn/required_resources.go`), rule by
    /// rule as docs/render.md lists them: at most
    /// [`MAX_REQUIREMENT_ITERATIONS`] + 1 calls; a Fatal result ends the
    /// loop; requirements equal to the previous call's end it; on the first
    /// call only, requirements that resolve to exactly what was sent end it
    /// (the bootstrap short-cut); otherwise the next call gets the bootstrap
    /// resources and schemas plus what the requirements select, and the
    /// context this call returned. The request's meta (its tag) is the
    /// first call's on every call: core computes it once per step, and
    /// tells a function its iteration nowhere else.
    async fn call_with_requirements(
        &self,
        step: &PipelineStep,
        runtime: &dyn Runtime,
        mut request: pb::RunFunctionRequest,
    ) -> Result<pb::RunFunctionResponse, ComposeError> {
        let bootstrap_resources = request.required_resources.clone();
        let bootstrap_schemas = request.required_schemas.clone();
        // What the previous call asked for; none before the first (core's
        // nil, which only an absent `requirements` equals).
        let mut requirements: Option<pb::Requirements> = None;
        for iteration in 0..=MAX_REQUIREMENT_ITERATIONS {
            let response =
                runtimes::answer(runtime, &request)
                    .await
                    .map_err(|e| ComposeError::Step {
                        step: step.step.clone(),
                        source: Box::new(e),
                    })?;
            if response
                .results
                .iter()
                .any(|r| r.severity == pb::Severity::Fatal as i32)
            {
                return Ok(response);
            }
            if response.requirements == requirements {
                return Ok(response);
            }
            let asked = response.requirements.clone().unwrap_or_default();
            let extra = self.select_all(&asked.extra_resources);
            let mut resources = bootstrap_resources.clone();
            resources.extend(self.select_all(&asked.resources));
            let mut schemas = bootstrap_schemas.clone();
            schemas.extend(asked.schemas.iter().map(|(key, selector)| {
                (
                    key.clone(),
                    self.schema(&selector.api_version, &selector.kind),
                )
            }));
            if iteration == 0
                && request.required_resources == resources
                && request.extra_resources == extra
                && request.required_schemas == schemas
            {
                return Ok(response);
            }
            requirements = response.requirements;
            request.required_resources = resources;
            request.extra_resources = extra;
            request.required_schemas = schemas;
            request.context = response.context;
        }
        Err(ComposeError::RequirementsUnstable {
            what: if self.observed.is_some() {
                "cannot run Composition pipeline step"
            } else {
                "failed to invoke pipeline step"
            },
            step: step.step.clone(),
            max: MAX_REQUIREMENT_ITERATIONS,
        })
    }

    /// The observed state every step sees: the XR and each composed resource
    /// with the connection details of the Secret its
    /// `spec.writeConnectionSecretToRef` names, found among the resources
    /// render was given (`-e`, `--function-credentials`), as core's
    /// `SecretConnectionDetailsFetcher` reads them from the cluster (a
    /// namespaced object's Secret is in its own namespace).
    fn observed_state(&self, observed: &Observed) -> pb::State {
        let resource = |object: &Value| pb::Resource {
            resource: to_struct(object),
            connection_details: self.connection_details(object),
            ..Default::default()
        };
        pb::State {
            composite: Some(resource(&observed.composite)),
            resources: observed
                .resources
                .iter()
                .map(|(name, object)| (name.clone(), resource(object)))
                .collect(),
        }
    }

    /// The data of the connection Secret of `object`, none when it names
    /// none or it is not given; a value that is not base64 is left out.
    fn connection_details(&self, object: &Value) -> HashMap<String, Vec<u8>> {
        use base64::Engine;
        let Some(name) = get_str(object, &["spec", "writeConnectionSecretToRef", "name"]) else {
            return HashMap::new();
        };
        let namespace = get_str(object, &["metadata", "namespace"])
            .filter(|n| !n.is_empty())
            .or_else(|| get_str(object, &["spec", "writeConnectionSecretToRef", "namespace"]))
            .unwrap_or_default();
        let secret = self.required.iter().chain(self.credentials).find(|s| {
            get_str(s, &["apiVersion"]) == Some("v1")
                && get_str(s, &["kind"]) == Some("Secret")
                && get_str(s, &["metadata", "name"]) == Some(name)
                && get_str(s, &["metadata", "namespace"]).unwrap_or_default() == namespace
        });
        let Some(Value::Object(data)) = secret.and_then(|s| get(s, &["data"])) else {
            return HashMap::new();
        };
        data.iter()
            .filter_map(|(key, value)| {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(value.as_str()?)
                    .ok()?;
                Some((key.clone(), decoded))
            })
            .collect()
    }

    /// The resources and schemas of the step's `requirements` (bootstrap
    /// requirements, given on the first call).
    fn bootstrap(
        &self,
        step: &PipelineStep,
    ) -> (HashMap<String, pb::Resources>, HashMap<String, pb::Schema>) {
        let Some(requirements) = &step.requirements else {
            return Default::default();
        };
        let resources = requirements
            .required_resources
            .iter()
            .map(|r| {
                let selector = pb::ResourceSelector {
                    api_version: r.api_version.clone(),
                    kind: r.kind.clone(),
                    namespace: r.namespace.clone(),
                    r#match: match (&r.name, &r.match_labels) {
                        (Some(name), _) => {
                            Some(pb::resource_selector::Match::MatchName(name.clone()))
                        }
                        (None, Some(labels)) => {
                            Some(pb::resource_selector::Match::MatchLabels(pb::MatchLabels {
                                labels: labels.clone().into_iter().collect(),
                            }))
                        }
                        (None, None) => None,
                    },
                };
                (r.requirement_name.clone(), self.select(&selector))
            })
            .collect();
        let schemas = requirements
            .required_schemas
            .iter()
            .map(|s| {
                (
                    s.requirement_name.clone(),
                    self.schema(&s.api_version, &s.kind),
                )
            })
            .collect();
        (resources, schemas)
    }

    /// The schema of `api_version` `kind` from `-s`, empty when unknown.
    fn schema(&self, api_version: &str, kind: &str) -> pb::Schema {
        pb::Schema {
            openapi_v3: crate::compose::read::schemas::find_schema(self.schemas, api_version, kind)
                .as_ref()
                .and_then(to_struct),
        }
    }

    /// What core's `ExistingRequiredResourcesFetcher` returns from a
    /// cluster holding the `-e` resources: sorted by namespace/name.
    fn select(&self, selector: &pb::ResourceSelector) -> pb::Resources {
        let mut found: Vec<&Value> = self
            .required
            .iter()
            .filter(|object| matches_selector(object, selector))
            .collect();
        let key = |object: &Value| {
            format!(
                "{}/{}",
                get_str(object, &["metadata", "namespace"]).unwrap_or_default(),
                get_str(object, &["metadata", "name"]).unwrap_or_default()
            )
        };
        found.sort_by_cached_key(|object| key(object));
        let items = found
            .into_iter()
            .map(|object| pb::Resource {
                resource: to_struct(object),
                ..Default::default()
            })
            .collect();
        pb::Resources { items }
    }

    fn select_all(
        &self,
        selectors: &HashMap<String, pb::ResourceSelector>,
    ) -> HashMap<String, pb::Resources> {
        selectors
            .iter()
            .map(|(key, selector)| (key.clone(), self.select(selector)))
            .collect()
    }

    fn step_credentials(
        &self,
        step: &PipelineStep,
    ) -> Result<HashMap<String, pb::Credentials>, ComposeError> {
        step.credentials
            .iter()
            .map(|c| Ok((c.name.clone(), self.secret_credentials(step, c)?)))
            .collect()
    }

    fn secret_credentials(
        &self,
        step: &PipelineStep,
        credentials: &StepCredentials,
    ) -> Result<pb::Credentials, ComposeError> {
        use base64::Engine;
        let failed = |message: String| ComposeError::StepFailed {
            step: step.step.clone(),
            message,
        };
        if credentials.source != "Secret" {
            return Err(failed(format!(
                "credentials {:?} have source {:?}; only Secret is supported",
                credentials.name, credentials.source
            )));
        }
        let Some(secret_ref) = &credentials.secret_ref else {
            return Err(failed(format!(
                "credentials {:?} have no secretRef",
                credentials.name
            )));
        };
        let secret = self
            .credentials
            .iter()
            .find(|s| {
                get_str(s, &["kind"]) == Some("Secret")
                    && get_str(s, &["metadata", "name"]) == Some(secret_ref.name.as_str())
                    && get_str(s, &["metadata", "namespace"]).unwrap_or_default()
                        == secret_ref.namespace
            })
            .ok_or_else(|| {
                failed(format!(
                    "credentials {:?}: Secret {}/{} not found in --function-credentials",
                    credentials.name, secret_ref.namespace, secret_ref.name
                ))
            })?;
        let mut data = HashMap::new();
        if let Some(Value::Object(map)) = get(secret, &["data"]) {
            for (k, v) in map {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap_or_default())
                    .map_err(|e| {
                        failed(format!(
                            "Secret {}: data.{k} is not base64: {e}",
                            secret_ref.name
                        ))
                    })?;
                data.insert(k.clone(), decoded);
            }
        }
        if let Some(Value::Object(map)) = get(secret, &["stringData"]) {
            for (k, v) in map {
                data.insert(
                    k.clone(),
                    v.as_str().unwrap_or_default().as_bytes().to_vec(),
                );
            }
        }
        Ok(pb::Credentials {
            source: Some(pb::credentials::Source::CredentialData(
                pb::CredentialData { data },
            )),
        })
    }
}

/// A hash of the request (without its meta), so a function can cache by it.
/// Protobuf encodes maps in iteration order, which is random for the
/// generated `HashMap`s, so the hash walks every map in key order instead:
/// the same request always gets the same tag.
fn tag(request: &pb::RunFunctionRequest) -> String {
    let mut h = Sha256::new();
    for state in [&request.observed, &request.desired] {
        match state {
            Some(state) => {
                h.update([1]);
                hash_resource(&mut h, state.composite.as_ref());
                hash_map(&mut h, &state.resources, |h, r| hash_resource(h, Some(r)));
            }
            None => h.update([0]),
        }
    }
    for s in [&request.input, &request.context] {
        hash_bytes(
            &mut h,
            &s.as_ref().map(Message::encode_to_vec).unwrap_or_default(),
        );
    }
    for resources in [&request.extra_resources, &request.required_resources] {
        hash_map(&mut h, resources, |h, r| {
            h.update((r.items.len() as u64).to_le_bytes());
            for item in &r.items {
                hash_resource(h, Some(item));
            }
        });
    }
    hash_map(&mut h, &request.credentials, |h, c| match &c.source {
        Some(pb::credentials::Source::CredentialData(d)) => {
            hash_map(h, &d.data, |h, v| hash_bytes(h, v));
        }
        None => h.update([0]),
    });
    hash_map(&mut h, &request.required_schemas, |h, s| {
        hash_bytes(h, &s.encode_to_vec());
    });
    hex::encode(h.finalize())
}

fn hash_bytes(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn hash_map<V>(h: &mut Sha256, map: &HashMap<String, V>, mut value: impl FnMut(&mut Sha256, &V)) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    h.update((keys.len() as u64).to_le_bytes());
    for key in keys {
        hash_bytes(h, key.as_bytes());
        value(h, &map[key]);
    }
}

/// `Struct` fields are a `BTreeMap`, so encoding them is deterministic.
fn hash_resource(h: &mut Sha256, resource: Option<&pb::Resource>) {
    let Some(r) = resource else {
        h.update([0]);
        return;
    };
    h.update([1]);
    hash_bytes(
        h,
        &r.resource
            .as_ref()
            .map(Message::encode_to_vec)
            .unwrap_or_default(),
    );
    hash_map(h, &r.connection_details, |h, v| hash_bytes(h, v));
    h.update(r.ready.to_le_bytes());
}

/// Whether `object` is what `selector` asks for, as core's fetcher reads a
/// selector: a name is a `Get` of exactly that namespace and name (no
/// namespace: a cluster-scoped object); labels or nothing are a `List` in
/// the namespace, or across every namespace when it is empty or absent.
fn matches_selector(object: &Value, selector: &pb::ResourceSelector) -> bool {
    if get_str(object, &["apiVersion"]) != Some(selector.api_version.as_str())
        || get_str(object, &["kind"]) != Some(selector.kind.as_str())
    {
        return false;
    }
    let namespace = selector.namespace.as_deref().unwrap_or_default();
    let object_namespace = get_str(object, &["metadata", "namespace"]).unwrap_or_default();
    let in_namespace = namespace.is_empty() || object_namespace == namespace;
    match &selector.r#match {
        Some(pb::resource_selector::Match::MatchName(name)) => {
            object_namespace == namespace
                && get_str(object, &["metadata", "name"]) == Some(name.as_str())
        }
        Some(pb::resource_selector::Match::MatchLabels(labels)) => {
            in_namespace
                && labels.labels.iter().all(|(k, v)| {
                    get_str(object, &["metadata", "labels", k.as_str()]) == Some(v.as_str())
                })
        }
        // No name and no labels: every resource of the kind, as Crossplane.
        None => in_namespace,
    }
}

fn xr_condition(c: &pb::Condition) -> XrCondition {
    let status = match pb::Status::try_from(c.status) {
        Ok(pb::Status::ConditionTrue) => "True",
        Ok(pb::Status::ConditionFalse) => "False",
        _ => "Unknown",
    };
    XrCondition {
        kind: c.r#type.clone(),
        status: status.to_string(),
        reason: c.reason.clone(),
        message: c.message.clone(),
    }
}

#[cfg(test)]
mod tests;
