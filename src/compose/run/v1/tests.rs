//! Pipeline semantics with fake runtimes.
use std::sync::Mutex;

use serde_json::json;

use std::sync::Arc;

use super::*;
use crate::call::{self, FunctionRunner};
use crate::compose::read::model::{
    FunctionRef, RequiredResourceSelector, SecretRef, StepRequirements,
};

type Handler = dyn Fn(&pb::RunFunctionRequest) -> pb::RunFunctionResponse + Send + Sync;

/// A runtime that answers with `handler` and records every request.
struct Fake {
    handler: Box<Handler>,
    calls: Mutex<Vec<pb::RunFunctionRequest>>,
}

impl Fake {
    fn new(
        handler: impl Fn(&pb::RunFunctionRequest) -> pb::RunFunctionResponse + Send + Sync + 'static,
    ) -> Arc<Fake> {
        Arc::new(Fake {
            handler: Box::new(handler),
            calls: Mutex::new(Vec::new()),
        })
    }
    fn calls(&self) -> Vec<pb::RunFunctionRequest> {
        self.calls.lock().unwrap().clone()
    }
}

/// What every fake is to the seam.
static FAKE: std::sync::LazyLock<call::Function> = std::sync::LazyLock::new(|| call::Function {
    name: Some("fake".into()),
    image: "fake".into(),
    config: Default::default(),
});

#[async_trait::async_trait]
impl Runtime for Fake {
    fn function(&self) -> &call::Function {
        &FAKE
    }
}

#[async_trait::async_trait]
impl FunctionRunner for Fake {
    async fn run_function(
        &self,
        _function: &call::Function,
        request: call::Request,
    ) -> Result<call::Response, tonic::Status> {
        let request = pb::RunFunctionRequest::decode(request.input).unwrap();
        self.calls.lock().unwrap().push(request.clone());
        let response = (self.handler)(&request);
        Ok(call::Response::ran(response.encode_to_vec().into()))
    }
}

fn step(name: &str, function: &str) -> PipelineStep {
    PipelineStep {
        step: name.into(),
        function_ref: FunctionRef {
            name: function.into(),
        },
        input: None,
        credentials: Vec::new(),
        requirements: None,
    }
}

fn observed() -> Observed {
    Observed {
        composite: json!({"apiVersion": "example.org/v1", "kind": "XBucket", "metadata": {"name": "xr"}}),
        resources: vec![(
            "old".into(),
            json!({"kind": "ConfigMap", "metadata": {"name": "xr-old"}}),
        )],
    }
}

fn resource(value: Value) -> pb::Resource {
    pb::Resource {
        resource: to_struct(&value),
        ..Default::default()
    }
}

fn runtimes(list: &[(&str, Arc<Fake>)]) -> RuntimeMap {
    list.iter()
        .map(|(name, fake)| (name.to_string(), Arc::clone(fake) as Arc<dyn Runtime>))
        .collect()
}

async fn run_pipeline(
    steps: &[PipelineStep],
    runtimes: &RuntimeMap,
    required: &[Value],
    credentials: &[Value],
    context: Option<Value>,
) -> Result<Outcome, ComposeError> {
    V1Pipeline {
        steps,
        runtimes,
        observed: Some(&observed()),
        required,
        schemas: &[],
        credentials,
        context,
    }
    .run_steps()
    .await
}

#[tokio::test]
async fn desired_state_and_context_flow_and_a_dropped_resource_is_gone() {
    let first = Fake::new(|req| {
        let mut desired = req.desired.clone().unwrap_or_default();
        desired
            .resources
            .insert("a".into(), resource(json!({"kind": "A"})));
        desired
            .resources
            .insert("b".into(), resource(json!({"kind": "B"})));
        let mut context = from_struct(req.context.as_ref().unwrap());
        context["first"] = json!(true);
        pb::RunFunctionResponse {
            desired: Some(desired),
            context: to_struct(&context),
            ..Default::default()
        }
    });
    let second = Fake::new(|req| {
        let mut desired = req.desired.clone().unwrap_or_default();
        desired.resources.remove("b");
        desired.composite = Some(resource(json!({"status": {"ok": true}})));
        pb::RunFunctionResponse {
            desired: Some(desired),
            context: req.context.clone(),
            results: vec![pb::Result {
                severity: pb::Severity::Warning as i32,
                message: "careful".into(),
                ..Default::default()
            }],
            conditions: vec![pb::Condition {
                r#type: "DatabaseReady".into(),
                status: pb::Status::ConditionFalse as i32,
                reason: "Waiting".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    });
    let runtimes = runtimes(&[("f1", first.clone()), ("f2", second.clone())]);
    let outcome = run_pipeline(
        &[step("one", "f1"), step("two", "f2")],
        &runtimes,
        &[],
        &[],
        Some(json!({"cli": 1})),
    )
    .await
    .unwrap();

    let seen = &second.calls()[0];
    assert_eq!(
        seen.desired.as_ref().unwrap().resources.len(),
        2,
        "step two sees step one's desired state"
    );
    assert_eq!(
        from_struct(seen.context.as_ref().unwrap()),
        json!({"cli": 1, "first": true})
    );
    // Every step sees the same observed state.
    assert_eq!(first.calls()[0].observed, seen.observed);
    assert!(seen
        .observed
        .as_ref()
        .unwrap()
        .resources
        .contains_key("old"));
    assert_eq!(outcome.resources.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(
        outcome.desired_composite,
        Some(json!({"status": {"ok": true}}))
    );
    assert_eq!(outcome.context, Some(json!({"cli": 1, "first": true})));
    assert_eq!(outcome.results[0].step, "two");
    assert_eq!(outcome.results[0].severity, pb::Severity::Warning);
    assert_eq!(outcome.conditions[0].status, "False");
    // meta: a tag that is a hash of the request, and capabilities.
    let meta = seen.meta.as_ref().unwrap();
    assert_eq!(meta.tag.len(), 64);
    assert!(meta
        .capabilities
        .contains(&(pb::Capability::RequiredResources as i32)));
}

#[tokio::test]
async fn requirements_equal_to_the_previous_calls_end_the_loop() {
    let fake = Fake::new(|req| {
        let mut requirements = pb::Requirements::default();
        requirements.resources.insert(
            "by-name".into(),
            pb::ResourceSelector {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                r#match: Some(pb::resource_selector::Match::MatchName("settings".into())),
                namespace: Some("prod".into()),
            },
        );
        requirements.resources.insert(
            "by-label".into(),
            pb::ResourceSelector {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                r#match: Some(pb::resource_selector::Match::MatchLabels(pb::MatchLabels {
                    labels: [("team".to_string(), "a".to_string())].into(),
                })),
                namespace: None,
            },
        );
        let mut desired = pb::State::default();
        for (key, found) in &req.required_resources {
            desired.resources.insert(
                key.clone(),
                resource(json!({"kind": "Found", "count": found.items.len()})),
            );
        }
        pb::RunFunctionResponse {
            desired: Some(desired),
            requirements: Some(requirements),
            ..Default::default()
        }
    });
    let required = [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "prod"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "dev"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": {"team": "a"}}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "y", "labels": {"team": "a"}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "z", "labels": {"team": "a"}}}),
    ];
    let outcome = run_pipeline(
        &[step("s", "f")],
        &runtimes(&[("f", fake.clone())]),
        &required,
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(fake.calls().len(), 2, "one call, one re-run once stable");
    assert_eq!(outcome.resources["by-name"].object["count"], json!(1));
    assert_eq!(outcome.resources["by-label"].object["count"], json!(2));
}

#[tokio::test]
async fn requirements_that_never_settle_fail_after_six_calls_worded_as_core_words_it() {
    let counter = Mutex::new(0);
    let fake = Fake::new(move |_| {
        let mut n = counter.lock().unwrap();
        *n += 1;
        let mut requirements = pb::Requirements::default();
        requirements.resources.insert(
            format!("r{n}"),
            pb::ResourceSelector {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                ..Default::default()
            },
        );
        pb::RunFunctionResponse {
            requirements: Some(requirements),
            ..Default::default()
        }
    });
    let err = run_pipeline(
        &[step("s", "f")],
        &runtimes(&[("f", fake.clone())]),
        &[],
        &[],
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(fake.calls().len(), 1 + MAX_REQUIREMENT_ITERATIONS);
    assert_eq!(
        err.to_string(),
        "cannot run Composition pipeline step \"s\": requirements didn't stabilize \
         after the maximum number of iterations (5)"
    );
}

#[tokio::test]
async fn a_fatal_result_stops_the_pipeline_keeping_what_came_before() {
    let fatal = Fake::new(|_| pb::RunFunctionResponse {
        results: vec![
            pb::Result {
                severity: pb::Severity::Normal as i32,
                message: "checked".into(),
                ..Default::default()
            },
            pb::Result {
                severity: pb::Severity::Fatal as i32,
                message: "no quota".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    let after = Fake::new(|_| pb::RunFunctionResponse::default());
    let outcome = run_pipeline(
        &[step("check", "fatal"), step("later", "after")],
        &runtimes(&[("fatal", fatal), ("after", after.clone())]),
        &[],
        &[],
        None,
    )
    .await
    .unwrap();
    let fatal = outcome.fatal.expect("a fatal result");
    assert_eq!(
        (fatal.step.as_str(), fatal.message.as_str()),
        ("check", "no quota")
    );
    assert_eq!(outcome.results.len(), 1, "the result before the fatal one");
    assert!(
        after.calls().is_empty(),
        "no step runs after a fatal result"
    );
}

#[tokio::test]
async fn an_unknown_function_fails_before_anything_runs() {
    let known = Fake::new(|_| pb::RunFunctionResponse::default());
    let err = run_pipeline(
        &[step("one", "known"), step("two", "missing")],
        &runtimes(&[("known", known.clone())]),
        &[],
        &[],
        None,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("pipeline step \"two\" references unknown Function \"missing\""),
        "{err}"
    );
    assert!(known.calls().is_empty());
}

#[tokio::test]
async fn credentials_come_from_the_named_secret() {
    let fake = Fake::new(|_| pb::RunFunctionResponse::default());
    let mut with_credentials = step("s", "f");
    with_credentials.credentials = vec![StepCredentials {
        name: "db".into(),
        source: "Secret".into(),
        secret_ref: Some(SecretRef {
            namespace: "crossplane-system".into(),
            name: "db-creds".into(),
        }),
    }];
    let secrets = [json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db-creds", "namespace": "crossplane-system"},
        "data": {"password": "aHVudGVyMg=="}, "stringData": {"user": "admin"}})];
    let runtimes = runtimes(&[("f", fake.clone())]);
    run_pipeline(&[with_credentials.clone()], &runtimes, &[], &secrets, None)
        .await
        .unwrap();
    let Some(pb::credentials::Source::CredentialData(data)) =
        &fake.calls()[0].credentials["db"].source
    else {
        panic!("no credential data");
    };
    assert_eq!(data.data["password"], b"hunter2");
    assert_eq!(data.data["user"], b"admin");

    let err = run_pipeline(&[with_credentials], &runtimes, &[], &[], None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Secret crossplane-system/db-creds not found"),
        "{err}"
    );
}

#[test]
fn the_tag_does_not_depend_on_map_order() {
    let build = |reverse: bool| {
        let mut names: Vec<String> = (0..32).map(|i| format!("r{i}")).collect();
        if reverse {
            names.reverse();
        }
        let mut state = pb::State::default();
        for name in &names {
            let mut r = resource(json!({"kind": name}));
            for key in &names {
                r.connection_details
                    .insert(key.clone(), key.as_bytes().to_vec());
            }
            state.resources.insert(name.clone(), r);
        }
        pb::RunFunctionRequest {
            desired: Some(state),
            ..Default::default()
        }
    };
    let (a, b) = (build(false), build(true));
    assert_eq!(a, b);
    // Why the tag cannot just hash the encoding: maps encode in iteration
    // order (32! orders; equal by chance with negligible probability).
    assert_ne!(a.encode_to_vec(), b.encode_to_vec());
    assert_eq!(tag(&a), tag(&b));
    let mut c = build(false);
    c.desired.as_mut().unwrap().resources.remove("r3");
    assert_ne!(tag(&a), tag(&c));
}

/// Requirements asking for a ConfigMap by name in `ns` under `key`.
fn asking(key: &str, name: &str) -> pb::Requirements {
    let mut requirements = pb::Requirements::default();
    requirements.resources.insert(
        key.into(),
        pb::ResourceSelector {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            r#match: Some(pb::resource_selector::Match::MatchName(name.into())),
            namespace: Some("ns".into()),
        },
    );
    requirements
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"}})
}

/// The number in the request's context under `seen`, 0 when absent.
fn seen(req: &pb::RunFunctionRequest) -> f64 {
    req.context
        .as_ref()
        .map(from_struct)
        .and_then(|c| c["seen"].as_f64())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_context_a_call_returns_is_what_the_next_iteration_of_the_step_sees() {
    // function-pythonic's way: remember in the context what was asked for,
    // and ask for something more until the memory says it is done.
    let fake = Fake::new(|req| {
        let n = seen(req) + 1.0;
        let requirements = if n < 3.0 {
            asking(&format!("r{n}"), "cm")
        } else {
            asking("r2", "cm")
        };
        pb::RunFunctionResponse {
            context: to_struct(&json!({"seen": n})),
            requirements: Some(requirements),
            ..Default::default()
        }
    });
    let outcome = run_pipeline(
        &[step("s", "f")],
        &runtimes(&[("f", fake.clone())]),
        &[config_map("cm")],
        &[],
        None,
    )
    .await
    .unwrap();
    let calls: Vec<f64> = fake.calls().iter().map(seen).collect();
    // Calls 1 and 2 ask for r1 then r2; call 3 asks for r2 again: stable.
    assert_eq!(
        calls,
        [0.0, 1.0, 2.0],
        "each call sees the last one's context"
    );
    assert_eq!(outcome.context, Some(json!({"seen": 3})));
}

#[tokio::test]
async fn a_first_call_given_all_it_asks_for_by_bootstrap_requirements_is_final() {
    let fake = Fake::new(|_| pb::RunFunctionResponse {
        requirements: Some(asking("cm", "cm")),
        ..Default::default()
    });
    let mut s = step("s", "f");
    s.requirements = Some(StepRequirements {
        required_resources: vec![RequiredResourceSelector {
            requirement_name: "cm".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: Some("cm".into()),
            match_labels: None,
            namespace: Some("ns".into()),
        }],
        required_schemas: Vec::new(),
    });
    run_pipeline(
        &[s],
        &runtimes(&[("f", fake.clone())]),
        &[config_map("cm")],
        &[],
        None,
    )
    .await
    .unwrap();
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "the bootstrap short-cut: no second call");
    assert_eq!(calls[0].required_resources["cm"].items.len(), 1);
}

#[tokio::test]
async fn bootstrap_resources_stay_on_every_iteration_beside_what_the_function_asks_for() {
    let fake = Fake::new(|_| pb::RunFunctionResponse {
        requirements: Some(asking("other", "other")),
        ..Default::default()
    });
    let mut s = step("s", "f");
    s.requirements = Some(StepRequirements {
        required_resources: vec![RequiredResourceSelector {
            requirement_name: "boot".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: Some("cm".into()),
            match_labels: None,
            namespace: Some("ns".into()),
        }],
        required_schemas: Vec::new(),
    });
    run_pipeline(
        &[s],
        &runtimes(&[("f", fake.clone())]),
        &[config_map("cm"), config_map("other")],
        &[],
        None,
    )
    .await
    .unwrap();
    let calls = fake.calls();
    assert_eq!(calls.len(), 2);
    let mut keys: Vec<_> = calls[1].required_resources.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["boot", "other"]);
}

#[tokio::test]
async fn a_fatal_result_ends_the_requirements_loop_at_once() {
    let counter = Mutex::new(0);
    let fake = Fake::new(move |_| {
        let mut n = counter.lock().unwrap();
        *n += 1;
        pb::RunFunctionResponse {
            requirements: Some(asking(&format!("r{n}"), "cm")),
            results: vec![pb::Result {
                severity: pb::Severity::Fatal as i32,
                message: "stop".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    });
    let outcome = run_pipeline(
        &[step("s", "f")],
        &runtimes(&[("f", fake.clone())]),
        &[config_map("cm")],
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(fake.calls().len(), 1, "no iteration after a fatal result");
    assert_eq!(outcome.fatal.map(|f| f.message).as_deref(), Some("stop"));
}

#[tokio::test]
async fn the_function_is_not_told_its_iteration_every_call_carries_the_first_calls_tag() {
    let fake = Fake::new(|req| pb::RunFunctionResponse {
        requirements: Some(asking(&format!("r{}", req.required_resources.len()), "cm")),
        ..Default::default()
    });
    let _ = run_pipeline(
        &[step("s", "f")],
        &runtimes(&[("f", fake.clone())]),
        &[config_map("cm")],
        &[],
        None,
    )
    .await;
    let calls = fake.calls();
    assert!(calls.len() > 2, "{} calls", calls.len());
    assert!(
        calls.iter().all(|c| c.meta == calls[0].meta),
        "core tags a step once, before its first call"
    );
    assert_ne!(calls[1].required_resources, calls[0].required_resources);
}

#[tokio::test]
async fn the_first_step_gets_an_empty_context_and_the_next_exactly_what_the_previous_returned() {
    let first = Fake::new(|_| pb::RunFunctionResponse::default());
    let second = Fake::new(|_| pb::RunFunctionResponse::default());
    run_pipeline(
        &[step("one", "first"), step("two", "second")],
        &runtimes(&[("first", first.clone()), ("second", second.clone())]),
        &[],
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(first.calls()[0].context, Some(Default::default()));
    assert_eq!(first.calls()[0].desired, Some(Default::default()));
    // The first step returned no context and no desired state: none goes on.
    assert_eq!(second.calls()[0].context, None);
    assert_eq!(second.calls()[0].desired, None);
}

#[test]
fn a_name_selector_is_a_get_of_that_namespace_and_a_list_spans_every_namespace_sorted() {
    let objects = [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": "y"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "y"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "x"}}),
    ];
    let steps = [];
    let runtimes = HashMap::new();
    let pipeline = V1Pipeline {
        steps: &steps,
        runtimes: &runtimes,
        observed: None,
        required: &objects,
        schemas: &[],
        credentials: &[],
        context: None,
    };
    let names = |selector: pb::ResourceSelector| -> Vec<String> {
        pipeline
            .select(&selector)
            .items
            .iter()
            .map(|r| {
                let o = from_struct(r.resource.as_ref().unwrap());
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let selector = |namespace: Option<&str>, name: Option<&str>| pb::ResourceSelector {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: namespace.map(Into::into),
        r#match: name.map(|n| pb::resource_selector::Match::MatchName(n.into())),
    };
    assert_eq!(names(selector(None, None)), ["x/a", "y/a", "y/b"]);
    assert_eq!(names(selector(Some(""), None)), ["x/a", "y/a", "y/b"]);
    assert_eq!(names(selector(Some("y"), None)), ["y/a", "y/b"]);
    assert_eq!(names(selector(Some("y"), Some("a"))), ["y/a"]);
    assert!(
        names(selector(None, Some("a"))).is_empty(),
        "no cluster-scoped a"
    );
}

#[tokio::test]
async fn observed_resources_carry_the_connection_details_of_the_secret_they_name() {
    let fake = Fake::new(|_| pb::RunFunctionResponse::default());
    let observed = Observed {
        composite: json!({"apiVersion": "example.org/v1", "kind": "XBucket", "metadata": {"name": "xr"}}),
        resources: vec![
            (
                "cluster".into(),
                json!({"kind": "Cluster", "metadata": {"name": "c"},
                       "spec": {"writeConnectionSecretToRef": {"name": "conn", "namespace": "ns"}}}),
            ),
            (
                "namespaced".into(),
                json!({"kind": "Db", "metadata": {"name": "d", "namespace": "team"},
                       "spec": {"writeConnectionSecretToRef": {"name": "conn", "namespace": "ns"}}}),
            ),
        ],
    };
    let secret = |namespace: &str, value: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "conn", "namespace": namespace},
               "data": {"password": value}})
    };
    let required = [secret("ns", "c2VjcmV0"), secret("team", "b3RoZXI=")];
    let steps = [step("s", "f")];
    let runtimes = runtimes(&[("f", fake.clone())]);
    V1Pipeline {
        steps: &steps,
        runtimes: &runtimes,
        observed: Some(&observed),
        required: &required,
        schemas: &[],
        credentials: &[],
        context: None,
    }
    .run_steps()
    .await
    .unwrap();
    let seen = fake.calls()[0].observed.clone().unwrap();
    assert_eq!(
        seen.resources["cluster"].connection_details["password"],
        b"secret"
    );
    // A namespaced resource's Secret is in its own namespace, as core's.
    assert_eq!(
        seen.resources["namespaced"].connection_details["password"],
        b"other"
    );
}
