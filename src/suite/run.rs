//! One run of suites: each test through xprin's phases, in a directory of
//! its own (`inputs/` copies that hooks may change, `outputs/`): setup and
//! pre-test hooks (a failure stops the test), patches, render (a failure
//! stops it), validation, assertions (all run), post-test hooks. A test with
//! an `id` keeps its directory until its suite ends, for later tests'
//! `{{ .Tests.ID.Outputs.* }}`; tests of a suite that reaches them run in
//! order, others concurrently, at most `-p N` at a time across suites.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::assert::{self, Check, Golden, Status};
use super::hooks::{self, HookEnd};
use super::servers::Servers;
use super::spec::{Hook, Suite, TestCase};
use super::template::{Outputs, Vars};
use super::Validator;
use crate::compose::plan::RenderPlan;
use crate::compose::read::RenderInputs;
use crate::compose::OutputOptions;

/// How tests run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Rewrite golden files with what rendered.
    pub(crate) update: bool,
    /// Bound of each hook.
    pub(crate) hook_timeout: Duration,
    /// Bound of each render.
    pub(crate) render_timeout: Duration,
    /// `{{ .Repositories.NAME }}`.
    pub(crate) repositories: BTreeMap<String, String>,
    /// Keep every test's directory (`--debug`).
    pub(crate) keep: bool,
    /// Only tests whose name this matches (`--run`).
    pub(crate) run: Option<regex::Regex>,
    /// Print the whole XR (so that `.Outputs.XR` feeds a next loop).
    pub(crate) full_xr: bool,
}

/// What every test shares.
pub(crate) struct Env<'a> {
    pub(crate) options: &'a Options,
    pub(crate) servers: &'a Servers,
    pub(crate) validator: &'a dyn Validator,
    pub(crate) limit: &'a tokio::sync::Semaphore,
    /// The progress line on a terminal (or nothing).
    pub(crate) line: &'a super::progress::Line,
    /// Golden files opened before the namespace was entered (`--update`).
    pub(crate) writes: &'a super::writes::Opened,
}

/// How one test ended.
#[derive(Debug, Clone)]
pub(crate) struct TestOutcome {
    pub(crate) name: String,
    pub(crate) duration: Duration,
    /// Each phase's and assertion's check, in order.
    pub(crate) checks: Vec<Check>,
    /// Its directory, when kept.
    pub(crate) dir: Option<PathBuf>,
}

impl TestOutcome {
    pub(crate) fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status == Status::Pass)
    }
}

/// Runs the tests of `suite` that `--run` selects.
pub(crate) async fn run_suite(suite: &Suite, env: &Env<'_>) -> Result<Vec<TestOutcome>, String> {
    let selected: Vec<(usize, &TestCase)> = suite
        .tests
        .iter()
        .enumerate()
        .filter(|(_, t)| env.options.run.as_ref().is_none_or(|r| r.is_match(&t.name)))
        .collect();
    // A directory only when a test has files to keep or to show (none of
    // a plain test's: it renders from the suite's own files, writes nothing).
    let root = if selected.iter().any(|(_, t)| needs_dir(t, env.options)) {
        Some(
            tempfile::Builder::new()
                .prefix("xfn-test-")
                .tempdir()
                .map_err(|e| format!("cannot make a temporary directory: {e}"))?,
        )
    } else {
        None
    };
    let dir = |index: usize, test: &TestCase| {
        root.as_ref()
            .filter(|_| needs_dir(test, env.options))
            .map(|r| r.path().join(index.to_string()))
    };
    let mut outcomes = Vec::new();
    if suite.is_chained() {
        let mut done: HashMap<String, Outputs> = HashMap::new();
        for (index, test) in selected {
            let _permit = env.limit.acquire().await;
            let (outcome, outputs) = run_test(suite, test, dir(index, test), &done, env).await;
            if let (Some(id), Some(outputs)) = (&test.id, outputs) {
                done.insert(id.clone(), outputs);
            }
            env.line.test_done(outcome.passed());
            outcomes.push(outcome);
        }
    } else {
        let done = HashMap::new();
        let runs = selected.into_iter().map(|(index, test)| {
            let done = &done;
            let dir = dir(index, test);
            async move {
                let _permit = env.limit.acquire().await;
                let outcome = run_test(suite, test, dir, done, env).await.0;
                env.line.test_done(outcome.passed());
                outcome
            }
        });
        outcomes = futures::future::join_all(runs).await;
    }
    if let (true, Some(root)) = (env.options.keep, root) {
        let _ = root.keep();
    }
    Ok(outcomes)
}

/// Whether `test` needs a directory of its own: its hooks read or change
/// its files, the connection-secret patch changes its XR's copy, a later
/// test reaches its outputs (`id`), or `--debug` keeps it.
fn needs_dir(test: &TestCase, options: &Options) -> bool {
    options.keep
        || test.id.is_some()
        || !test.hooks.pre_test.is_empty()
        || !test.hooks.post_test.is_empty()
        || test.patches.connection_secret == Some(true)
}

/// A test's run so far.
struct Progress {
    checks: Vec<Check>,
}

impl Progress {
    fn push(&mut self, status: Status, name: &str, message: impl Into<String>) {
        self.checks.push(Check::new(status, name, message));
    }
}

async fn run_test(
    suite: &Suite,
    test: &TestCase,
    dir: Option<PathBuf>,
    done: &HashMap<String, Outputs>,
    env: &Env<'_>,
) -> (TestOutcome, Option<Outputs>) {
    let started = Instant::now();
    let mut progress = Progress { checks: Vec::new() };
    let outputs = phases(suite, test, dir.as_deref(), done, env, &mut progress).await;
    if let (false, None, Some(dir)) = (env.options.keep, &test.id, &dir) {
        let _ = std::fs::remove_dir_all(dir);
    }
    let outcome = TestOutcome {
        name: test.name.clone(),
        duration: started.elapsed(),
        checks: progress.checks,
        dir: dir.filter(|_| env.options.keep),
    };
    (outcome, outputs)
}

/// An input path: templates expanded, relative to the suite file, there.
fn resolve(suite: &Path, vars: &Vars<'_>, label: &str, raw: &str) -> Result<PathBuf, String> {
    let expanded = vars.expand(raw).map_err(|e| format!("{label}: {e}"))?;
    let path = Path::new(&expanded);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        suite.parent().unwrap_or(Path::new(".")).join(path)
    };
    if !path.exists() {
        return Err(format!(
            "{label} {}: no such file or directory",
            path.display()
        ));
    }
    Ok(path)
}

/// Whether the Composition at `path` is an alpha one (`spec.functions`);
/// false when it cannot be read (the render then says why).
fn is_alpha(path: &Path) -> bool {
    crate::compose::read::files::read_one(path)
        .is_ok_and(|c| crate::compose::read::model::Composition::alpha_functions(&c).is_some())
}

/// Copies `from` (a file or a directory) under `inputs/LABEL/`.
fn copy_input(from: &Path, inputs: &Path, label: &str) -> Result<PathBuf, String> {
    let fail = |e: std::io::Error| {
        format!(
            "cannot copy {} into the test's directory: {e}",
            from.display()
        )
    };
    let dest_dir = inputs.join(label);
    std::fs::create_dir_all(&dest_dir).map_err(fail)?;
    let name = from
        .file_name()
        .map_or_else(|| label.into(), |n| n.to_os_string());
    let dest = dest_dir.join(name);
    if from.is_dir() {
        for entry in walkdir::WalkDir::new(from) {
            let entry = entry.map_err(|e| fail(e.into()))?;
            let relative = entry.path().strip_prefix(from).unwrap_or(entry.path());
            let target = dest.join(relative);
            if entry.file_type().is_dir() {
                std::fs::create_dir_all(&target).map_err(fail)?;
            } else if entry.file_type().is_file() {
                std::fs::copy(entry.path(), &target).map_err(fail)?;
            }
        }
    } else {
        std::fs::copy(from, &dest).map_err(fail)?;
    }
    Ok(dest)
}

/// Runs `hooks` (`pre-test` or `post-test`); false when one did not pass.
async fn run_hooks(
    which: &str,
    hooks: &[Hook],
    vars: &Vars<'_>,
    dir: &Path,
    env: &Env<'_>,
    progress: &mut Progress,
) -> bool {
    let mut all = true;
    for (i, hook) in hooks.iter().enumerate() {
        let name = format!(
            "{which} hook {}",
            hook.name.clone().unwrap_or_else(|| format!("#{}", i + 1))
        );
        let command = match vars.expand(&hook.run) {
            Ok(command) => command,
            Err(e) => {
                progress.push(Status::Error, &name, e);
                all = false;
                continue;
            }
        };
        match hooks::run(&command, dir, env.options.hook_timeout).await {
            HookEnd::Passed => progress.push(Status::Pass, &name, "passed"),
            HookEnd::Failed(output) => {
                progress.push(Status::Fail, &name, output);
                all = false;
            }
            HookEnd::Error(message) => {
                progress.push(Status::Error, &name, message);
                all = false;
            }
        }
        if !all && which == "pre-test" {
            return false;
        }
    }
    all
}

/// The phases of one test; its outputs when it rendered.
async fn phases(
    suite: &Suite,
    test: &TestCase,
    dir: Option<&Path>,
    done: &HashMap<String, Outputs>,
    env: &Env<'_>,
    progress: &mut Progress,
) -> Option<Outputs> {
    let setup = "setup";
    // Without a directory (see `needs_dir`) nothing is copied or written.
    let dirs = dir.map(|dir| (dir, dir.join("inputs"), dir.join("outputs")));
    if let Some((dir, inputs_dir, outputs_dir)) = &dirs {
        if let Err(e) = std::fs::create_dir_all(inputs_dir)
            .and_then(|()| std::fs::create_dir_all(outputs_dir.join("rendered")))
        {
            progress.push(
                Status::Error,
                setup,
                format!("cannot make the test's directory {}: {e}", dir.display()),
            );
            return None;
        }
    }
    let base_vars = Vars {
        repositories: Some(&env.options.repositories),
        tests: Some(done),
        ..Default::default()
    };
    // Setup: inputs expanded, checked, copied.
    let i = &test.inputs;
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut setup_errors = Vec::new();
    let mut input =
        |label: &str, key: &str, raw: Option<&String>, required: bool| -> Option<PathBuf> {
            let Some(raw) = raw else {
                if required {
                    setup_errors.push(format!(
                        "inputs.{label} is required (in the test or in common)"
                    ));
                }
                return None;
            };
            let resolved = resolve(&suite.path, &base_vars, &format!("inputs.{label}"), raw);
            match match &dirs {
                Some((_, inputs_dir, _)) => {
                    resolved.and_then(|p| copy_input(&p, inputs_dir, label))
                }
                None => resolved,
            } {
                Ok(path) => {
                    names.insert(key.to_string(), path.display().to_string());
                    Some(path)
                }
                Err(e) => {
                    setup_errors.push(e);
                    None
                }
            }
        };
    let (xr, claim) = match (&i.xr, &i.claim) {
        (Some(_), Some(_)) => (None, None),
        (xr, claim) => (
            input("xr", "XR", xr.as_ref(), false),
            input("claim", "Claim", claim.as_ref(), false),
        ),
    };
    let composition = input("composition", "Composition", i.composition.as_ref(), true);
    // An alpha Composition names its steps' images itself: no Functions.
    let alpha = composition.as_deref().is_some_and(is_alpha);
    let functions = input("functions", "Functions", i.functions.as_ref(), !alpha);
    let observed = input(
        "observed-resources",
        "ObservedResources",
        i.observed_resources.as_ref(),
        false,
    );
    let extra = input(
        "extra-resources",
        "ExtraResources",
        i.extra_resources.as_ref(),
        false,
    );
    let credentials = input(
        "function-credentials",
        "FunctionCredentials",
        i.function_credentials.as_ref(),
        false,
    );
    let xrd = input("xrd", "XRD", test.patches.xrd.as_ref(), false);
    let mut context_files = Vec::new();
    for (key, raw) in &i.context_files {
        if let Some(path) = input(
            &format!("context-files/{key}"),
            &format!("ContextFiles.{key}"),
            Some(raw),
            false,
        ) {
            context_files.push((key.clone(), path));
        }
    }
    if i.xr.is_some() && i.claim.is_some() {
        setup_errors.push("inputs.xr and inputs.claim are both set: give one".into());
    } else if i.xr.is_none() && i.claim.is_none() {
        setup_errors
            .push("inputs.xr or inputs.claim is required (in the test or in common)".into());
    }
    let mut crds = Vec::new();
    for raw in i.crds.iter().flatten() {
        match resolve(&suite.path, &base_vars, "inputs.crds", raw) {
            Ok(path) => crds.push(path),
            Err(e) => setup_errors.push(e),
        }
    }
    if !setup_errors.is_empty() {
        for e in setup_errors {
            progress.push(Status::Error, setup, e);
        }
        return None;
    }
    let (Some(subject), Some(composition)) = (xr.clone().or(claim.clone()), composition) else {
        progress.push(Status::Error, setup, "the inputs are incomplete");
        return None;
    };
    let vars = Vars {
        inputs: Some(&names),
        ..base_vars
    };
    if let Some(dir) = dir {
        if !run_hooks("pre-test", &test.hooks.pre_test, &vars, dir, env, progress).await {
            return None;
        }
    }
    // Patches: XRD defaults are applied by the render (its --xrd).
    if test.patches.connection_secret == Some(true) {
        if let Err(e) = patch_connection_secret(&subject, test, claim.is_some()) {
            progress.push(Status::Error, "patch", e);
            return None;
        }
    }
    // Render, in-process, over the run's shared servers.
    let render_inputs = RenderInputs {
        xr_or_operation: subject.clone(),
        composition_or_functions: Some(composition),
        functions,
        observed_resources: observed,
        required_resources: extra.into_iter().collect(),
        xrd,
        // xprin's `claim:` input is a claim whether or not an XRD says so.
        claim: claim.is_some(),
        function_credentials: credentials,
        context_files,
        context_values: i
            .context_values
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        output: OutputOptions {
            include_full: env.options.full_xr,
            ..OutputOptions::default()
        },
        iterations: 1,
        ..Default::default()
    };
    let rendered = async {
        let plan =
            RenderPlan::read(&render_inputs).map_err(|e| crate::chain::Chain(&e).to_string())?;
        let callers = env.servers.callers(plan.functions()).await?;
        let alpha = env.servers.alpha_steps();
        let rendered = tokio::time::timeout(
            env.options.render_timeout,
            plan.render_over(&callers, &alpha),
        )
        .await
        .map_err(|_| {
            format!(
                "did not finish within {:?} (--timeout)",
                env.options.render_timeout
            )
        })?
        .map_err(|e| crate::chain::Chain(&e).to_string())?;
        if let Some(fatal) = &rendered.fatal {
            return Err(fatal.clone());
        }
        let text = rendered
            .to_yaml()
            .map_err(|e| crate::chain::Chain(&e).to_string())?;
        Ok::<_, String>((rendered.renders.concat(), text))
    }
    .await;
    let (objects, full) = match rendered {
        Ok(r) => r,
        Err(e) => {
            progress.push(Status::Error, "render", e);
            return None;
        }
    };
    let outputs_dir = dirs.as_ref().map(|(_, _, outputs)| outputs.as_path());
    let written = match outputs_dir {
        Some(outputs_dir) => write_outputs(outputs_dir, &objects, &full),
        None => Ok(Outputs {
            render_count: objects.len(),
            ..Default::default()
        }),
    };
    let mut outputs = match written {
        Ok(outputs) => outputs,
        Err(e) => {
            progress.push(Status::Error, "render", e);
            return None;
        }
    };
    progress.push(
        Status::Pass,
        "render",
        format!("{} resources", objects.len()),
    );
    // Validation, when CRDs are given.
    if !crds.is_empty() {
        let lines = validate(env.validator, &crds, &objects);
        if let Some(outputs_dir) = outputs_dir {
            let path = outputs_dir.join("validate.txt");
            let text: String = lines
                .iter()
                .map(|c| format!("{} {}\n", c.status.symbol(), c.message))
                .collect();
            let _ = std::fs::write(&path, text);
            outputs.validate = Some(path);
        }
        progress.checks.extend(lines);
    }
    // Assertions: every one, whatever the others gave.
    let resources: Vec<assert::Resource> = objects
        .iter()
        .map(|o| (assert::identifier(o), o.clone()))
        .collect();
    let mut results = Vec::new();
    for a in &test.assertions.xprin {
        results.extend(assert::xprin(a, &resources));
    }
    for (engine, list) in [
        (Golden::Diff, &test.assertions.diff),
        (Golden::Dyff, &test.assertions.dyff),
    ] {
        for a in list {
            results.push(golden(
                engine,
                a,
                suite,
                &base_vars,
                &full,
                &resources,
                env.options.update.then_some(env.writes),
            ));
        }
    }
    if let (false, Some(outputs_dir)) = (results.is_empty(), outputs_dir) {
        let path = outputs_dir.join("assertions.txt");
        let text: String = results
            .iter()
            .map(|c| format!("{} {}: {}\n", c.status.symbol(), c.name, c.message))
            .collect();
        let _ = std::fs::write(&path, text);
        outputs.assertions = Some(path);
    }
    progress.checks.extend(results);
    let vars = Vars {
        outputs: Some(&outputs),
        ..vars
    };
    if let Some(dir) = dir {
        run_hooks(
            "post-test",
            &test.hooks.post_test,
            &vars,
            dir,
            env,
            progress,
        )
        .await;
    }
    Some(outputs)
}

fn golden(
    engine: Golden,
    a: &super::spec::GoldenAssertion,
    suite: &Suite,
    vars: &Vars<'_>,
    full: &str,
    resources: &[assert::Resource],
    update: Option<&super::writes::Opened>,
) -> Check {
    let expected = match suite.golden(a, vars) {
        Ok(e) => e,
        Err(e) => return Check::new(Status::Error, &a.name, e),
    };
    let actual = match &a.resource {
        None => full.to_string(),
        Some(id) => match resources.iter().find(|(key, _)| key == id) {
            Some((_, object)) => {
                match crate::compose::print::output::to_yaml_stream(std::slice::from_ref(object)) {
                    Ok(text) => text,
                    Err(e) => {
                        return Check::new(
                            Status::Error,
                            &a.name,
                            crate::chain::Chain(&e).to_string(),
                        )
                    }
                }
            }
            None => {
                return Check::new(Status::Error, &a.name, format!("no rendered resource {id}"))
            }
        },
    };
    assert::golden(engine, a, &expected, &actual, update)
}

fn validate(validator: &dyn Validator, crds: &[PathBuf], objects: &[Value]) -> Vec<Check> {
    let name = "validate";
    let mut schemas = Vec::new();
    for path in crds {
        match crate::compose::read::files::read_objects(path) {
            Ok(objects) => schemas.extend(objects),
            Err(e) => {
                return vec![Check::new(
                    Status::Error,
                    name,
                    crate::chain::Chain(&e).to_string(),
                )]
            }
        }
    }
    let errors = validator.validate(&schemas, objects);
    if errors.is_empty() {
        return vec![Check::new(
            Status::Pass,
            name,
            format!("{} resources valid", objects.len()),
        )];
    }
    errors
        .into_iter()
        .map(|e| Check::new(Status::Fail, name, e))
        .collect()
}

/// Writes `rendered.yaml`, `xr.yaml` and one file per object under
/// `rendered/`.
fn write_outputs(dir: &Path, objects: &[Value], full: &str) -> Result<Outputs, String> {
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    let yaml = |object: &Value| {
        crate::compose::print::output::to_yaml_stream(std::slice::from_ref(object))
            .map_err(|e| crate::chain::Chain(&e).to_string())
    };
    let render = dir.join("rendered.yaml");
    write(&render, full)?;
    let mut outputs = Outputs {
        render: Some(render),
        render_count: objects.len(),
        ..Default::default()
    };
    if let Some(xr) = objects.first() {
        let path = dir.join("xr.yaml");
        write(&path, &yaml(xr)?)?;
        outputs.xr = Some(path);
    }
    for (n, object) in objects.iter().enumerate() {
        let id = assert::identifier(object);
        let file: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join("rendered").join(format!("{n}-{file}.yaml"));
        write(&path, &yaml(object)?)?;
        outputs.rendered.insert(id, path);
    }
    Ok(outputs)
}

/// Sets `spec.writeConnectionSecretToRef` on the XR (or claim) copy, as
/// xprin's patch-xr: the name given or the XR's uid, the namespace given or
/// `default` (a claim's reference has no namespace).
fn patch_connection_secret(path: &Path, test: &TestCase, claim: bool) -> Result<(), String> {
    let chain = |e: crate::compose::ComposeError| crate::chain::Chain(&e).to_string();
    let mut object = crate::compose::read::files::read_one(path).map_err(chain)?;
    let uid = match object.pointer("/metadata/uid").and_then(Value::as_str) {
        Some(uid) => uid.to_string(),
        None => {
            let uid =
                uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, test.name.as_bytes()).to_string();
            if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                metadata.insert("uid".into(), json!(uid));
            }
            uid
        }
    };
    let name = test.patches.connection_secret_name.clone().unwrap_or(uid);
    let reference = if claim {
        json!({"name": name})
    } else {
        let namespace = test
            .patches
            .connection_secret_namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        json!({"name": name, "namespace": namespace})
    };
    let Some(root) = object.as_object_mut() else {
        return Err(format!("{}: not an object", path.display()));
    };
    let spec = root.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return Err(format!("{}: spec is not an object", path.display()));
    };
    spec.insert("writeConnectionSecretToRef".into(), reference);
    let text = crate::compose::print::output::to_yaml_stream(&[object]).map_err(chain)?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
