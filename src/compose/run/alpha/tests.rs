//! Alpha pipeline semantics with a fake step executor.
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::container::{parse_go_duration, DEFAULT_RUNNER_ENDPOINT};
use super::*;

/// Answers each call with the next canned FunctionIO and records inputs.
struct Script {
    outputs: Mutex<Vec<&'static str>>,
    inputs: Mutex<Vec<(FunctionIo, ContainerConfig)>>,
}

impl Script {
    fn new(outputs: &[&'static str]) -> Script {
        Script {
            outputs: Mutex::new(outputs.iter().rev().copied().collect()),
            inputs: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait::async_trait]
impl AlphaStep for Script {
    async fn run(&self, input: &[u8], config: &ContainerConfig) -> Result<Vec<u8>, ComposeError> {
        let io: FunctionIo = yaml_serde::from_slice(input).unwrap();
        self.inputs.lock().unwrap().push((io, config.clone()));
        Ok(self
            .outputs
            .lock()
            .unwrap()
            .pop()
            .unwrap()
            .as_bytes()
            .to_vec())
    }
}

fn function(name: &str, config: Value) -> AlphaFunction {
    serde_json::from_value(json!({
        "name": name, "type": "Container", "config": config,
        "container": {"image": format!("example.org/{name}:v1"), "timeout": "5s",
            "network": {"policy": "Runner"}, "resources": {"limits": {"memory": "64Mi"}}}
    }))
    .unwrap()
}

fn observed() -> Observed {
    Observed {
        composite: json!({"apiVersion": "example.org/v1", "kind": "XBucket", "metadata": {"name": "xr"}}),
        resources: vec![
            (
                "ready".into(),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Up"}}),
            ),
            ("down".into(), json!({"status": {"phase": "Down"}})),
        ],
    }
}

const FIRST: &str = "
desired:
  resources:
  - name: ready
    resource: {kind: A}
  - name: down
    resource: {kind: B}
    readinessChecks:
    - {type: MatchString, fieldPath: status.phase, matchString: Up}
  - name: gone
    resource: {kind: C}
results:
- {severity: Normal, message: one}
";

const SECOND: &str = "
desired:
  composite:
    resource: {status: {phase: composed}}
  resources:
  - name: ready
    resource: {kind: A}
  - name: down
    resource: {kind: B}
    readinessChecks:
    - {type: MatchString, fieldPath: status.phase, matchString: Up}
  - name: gone
    resource: null
  - name: new
    resource: {kind: D}
    readinessChecks:
    - {type: None}
results:
- {severity: Normal, message: one}
- {severity: Warning, message: two}
";

#[tokio::test]
async fn desired_and_results_flow_and_null_resources_are_deleted() {
    let script = Script::new(&[FIRST, SECOND]);
    let functions = [
        function("first", json!({"a": 1})),
        function("second", json!({"b": 2})),
    ];
    let outcome = run_alpha(&functions, &script, &observed()).await.unwrap();

    let inputs = script.inputs.lock().unwrap();
    assert_eq!(inputs[0].0.config, Some(json!({"a": 1})));
    assert_eq!(inputs[1].0.config, Some(json!({"b": 2})));
    assert_eq!(
        inputs[1].0.desired.resources.len(),
        3,
        "step two sees step one's output"
    );
    assert_eq!(inputs[1].0.results.len(), 1);
    assert_eq!(inputs[0].0.observed, inputs[1].0.observed);
    assert_eq!(inputs[0].0.observed.resources.len(), 2);
    assert_eq!(inputs[0].0.api_version, FUNCTION_IO_API_VERSION);
    let config = &inputs[0].1;
    assert_eq!(config.timeout, Duration::from_secs(5));
    assert_eq!(
        (
            config.network.as_str(),
            config.cpu.as_str(),
            config.memory.as_str()
        ),
        ("Runner", "100m", "64Mi")
    );
    assert_eq!(config.endpoint, DEFAULT_RUNNER_ENDPOINT);

    assert_eq!(
        outcome.resources.keys().collect::<Vec<_>>(),
        ["down", "new", "ready"]
    );
    assert_eq!(outcome.resources["ready"].ready, Readiness::Unspecified);
    assert_eq!(outcome.resources["down"].ready, Readiness::False);
    assert_eq!(outcome.resources["new"].ready, Readiness::True);
    assert_eq!(
        outcome.desired_composite,
        Some(json!({"status": {"phase": "composed"}}))
    );
    let steps: Vec<_> = outcome
        .results
        .iter()
        .map(|r| (r.step.as_str(), r.severity.as_str_name()))
        .collect();
    assert_eq!(
        steps,
        [("first", "SEVERITY_NORMAL"), ("second", "SEVERITY_WARNING")]
    );
}

#[tokio::test]
async fn a_fatal_result_fails_after_the_last_step_naming_its_step() {
    let script = Script::new(&[
        "results: [{severity: Fatal, message: broken}]",
        "results: [{severity: Fatal, message: broken}, {severity: Normal, message: later}]",
    ]);
    let functions = [function("breaks", json!({})), function("after", json!({}))];
    let err = run_alpha(&functions, &script, &observed())
        .await
        .unwrap_err();
    assert_eq!(script.inputs.lock().unwrap().len(), 2, "every step runs");
    assert_eq!(
        err.to_string(),
        "pipeline step \"breaks\" returned a fatal result: broken"
    );
}

#[tokio::test]
async fn output_that_is_not_a_function_io_names_the_step() {
    let script = Script::new(&["desired: [1, 2]"]);
    let err = run_alpha(&[function("bad", json!({}))], &script, &observed())
        .await
        .unwrap_err();
    let text = crate::chain::one_line(&err);
    assert!(
        text.starts_with("pipeline step \"bad\" failed: the output is not a FunctionIO: "),
        "{text}"
    );
}

#[tokio::test]
async fn an_alias_bomb_in_a_function_s_output_is_refused_naming_the_step() {
    use crate::nesting::bombs;
    for bomb in [bombs::wide(), bombs::listed(), bombs::laughs()] {
        let output: &'static str = Box::leak(format!("config: {bomb}\n").into_boxed_str());
        let script = Script::new(&[output]);
        let err = run_alpha(&[function("bomb", json!({}))], &script, &observed())
            .await
            .unwrap_err();
        let text = crate::chain::one_line(&err);
        assert!(
            text.starts_with(
                "pipeline step \"bomb\" failed: the output is not a FunctionIO: its aliases expand too far"
            ),
            "{text}"
        );
    }
}

#[test]
fn go_durations() {
    assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
    assert!(parse_go_duration("5").is_err());
    assert!(parse_go_duration("").is_err());
}
