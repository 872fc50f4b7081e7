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
use super::servers::SharedServers;
use super::spec::{Hook, Suite, TestCase};
use super::template::{self, Outputs, Vars};
use super::Validate;
use crate::compose::{read_objects, read_one, to_yaml_stream};
use crate::compose::{OutputOptions, RenderInputs, RenderPlan};

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
    /// What passing checks show beneath them under `-v`.
    pub(crate) show: Show,
}

/// xprin's `--show-render`, `--show-validate`, `--show-hooks`: what a
/// passing check shows beneath it under `-v` (a failing one always shows
/// what failed).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Show {
    /// The rendered resources, `Kind/name` each.
    pub(crate) render: bool,
    /// Each resource validated.
    pub(crate) validate: bool,
    /// Each hook's output.
    pub(crate) hooks: bool,
}

/// What every test shares.
pub(crate) struct Env<'a> {
    pub(crate) options: &'a Options,
    pub(crate) servers: &'a SharedServers,
    pub(crate) validator: &'a dyn Validate,
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
    /// Every check ran and passed.
    pub(crate) fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status == Status::Pass)
    }

    /// A check failed or could not run. A golden file `--update` wrote is
    /// neither passed nor failed: a test with one is written.
    pub(crate) fn failed(&self) -> bool {
        self.checks
            .iter()
            .any(|c| matches!(c.status, Status::Fail | Status::Error))
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
        let mut done: HashMap<String, Option<Outputs>> = HashMap::new();
        for (index, test) in selected {
            let _permit = env.limit.acquire().await;
            let (outcome, outputs) = run_test(suite, test, dir(index, test), &done, env).await;
            if let Some(id) = &test.id {
                done.insert(id.clone(), outputs);
            }
            env.line.test_done(!outcome.failed());
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
                env.line.test_done(!outcome.failed());
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

/// Why a phase of a test stopped it, or why one of its checks could not
/// run: the variant is the phase, what failed beneath is its [`Cause`]
/// (kept typed); the report's line is the chain, made at the edge
/// ([`Progress::error`]), never here.
#[derive(Debug, thiserror::Error)]
enum PhaseError {
    /// An input missing, given twice, not expanding, not there or not
    /// copied; the test's directory not made.
    #[error(transparent)]
    Setup(Cause),
    /// The connection-secret patch of the XR's copy.
    #[error(transparent)]
    Patch(Cause),
    /// Reading the plan, the Functions' servers, the render itself, its
    /// outputs written.
    #[error(transparent)]
    Render(Cause),
    /// The CRDs read for validation.
    #[error(transparent)]
    Validate(Cause),
    /// A golden assertion's file or resource.
    #[error(transparent)]
    Assert(Cause),
    /// A hook's command not expanding, or not run.
    #[error(transparent)]
    Hook(Cause),
}

/// What failed beneath a [`PhaseError`].
#[derive(Debug, thiserror::Error)]
enum Cause {
    /// Said in words (a missing input, a template, a Function's server).
    #[error("{0}")]
    Said(String),
    /// A file or directory of the test's.
    #[error("{what}")]
    Io {
        /// What was being done, on what (`cannot write /x`).
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The composition core: reading inputs, rendering, YAML.
    #[error(transparent)]
    Compose(#[from] crate::compose::ComposeError),
}

impl PhaseError {
    /// The phase's name, as its check is named.
    fn phase(&self) -> &'static str {
        match self {
            PhaseError::Setup(_) => "setup",
            PhaseError::Patch(_) => "patch",
            PhaseError::Render(_) => "render",
            PhaseError::Validate(_) => "validate",
            PhaseError::Assert(_) => "assert",
            PhaseError::Hook(_) => "hook",
        }
    }
}

/// Words as a [`Cause`].
fn said(message: impl Into<String>) -> Cause {
    Cause::Said(message.into())
}

/// An I/O failure `what` (`cannot write /x`) as a [`Cause`].
fn io(what: String) -> impl FnOnce(std::io::Error) -> Cause {
    move |source| Cause::Io { what, source }
}

/// A test's run so far.
struct Progress {
    checks: Vec<Check>,
}

impl Progress {
    fn push(&mut self, status: Status, name: &str, message: impl Into<String>) {
        self.checks.push(Check::new(status, name, message));
    }

    /// `error` as its phase's check, in error.
    fn error(&mut self, error: &PhaseError) {
        self.push(
            Status::Error,
            error.phase(),
            crate::chain::Chain(error).to_string(),
        );
    }
}

async fn run_test(
    suite: &Suite,
    test: &TestCase,
    dir: Option<PathBuf>,
    done: &HashMap<String, Option<Outputs>>,
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

/// The phases of one test, in order; its outputs when it rendered. A
/// failed setup, pre-test hook, patch or render stops the test; every
/// validation and assertion runs.
async fn phases(
    suite: &Suite,
    test: &TestCase,
    dir: Option<&Path>,
    done: &HashMap<String, Option<Outputs>>,
    env: &Env<'_>,
    progress: &mut Progress,
) -> Option<Outputs> {
    let base_vars = Vars {
        repositories: Some(&env.options.repositories),
        tests: Some(done),
        ..Default::default()
    };
    // Without a directory (see `needs_dir`) nothing is copied or written.
    let dirs = match dir.map(TestDir::make).transpose() {
        Ok(dirs) => dirs,
        Err(e) => {
            progress.error(&e);
            return None;
        }
    };
    let setup = match setup(suite, test, dirs.as_ref(), &base_vars, env.options.full_xr) {
        Ok(setup) => setup,
        Err(errors) => {
            errors.iter().for_each(|e| progress.error(e));
            return None;
        }
    };
    let vars = Vars {
        inputs: Some(&setup.names),
        ..base_vars
    };
    // Hooks run in the suite file's directory, as xprin's runner runs them.
    let here = suite_dir(suite);
    if dir.is_some()
        && !run_hooks("pre-test", &test.hooks.pre_test, &vars, here, env, progress).await
    {
        return None;
    }
    // Patches: XRD defaults are applied by the render (its --xrd).
    let p = &test.patches;
    let named = p.connection_secret_name.is_some() || p.connection_secret_namespace.is_some();
    if named && p.connection_secret.is_none() {
        progress.error(&PhaseError::Patch(said(
            "connection-secret must be set to true when using connection-secret-name or connection-secret-namespace",
        )));
        return None;
    }
    if test.patches.connection_secret == Some(true) {
        let inputs = &setup.inputs;
        if let Err(e) = patch_connection_secret(&inputs.xr_or_operation, test, inputs.claim) {
            progress.error(&e);
            return None;
        }
    }
    let outputs_dir = dirs.as_ref().map(|d| d.outputs.as_path());
    let rendered = match render(&setup, env).await {
        Ok((objects, full)) => write_outputs(outputs_dir, &objects, &full)
            .map(|outputs| (objects, full, outputs))
            .map_err(PhaseError::Render),
        Err(e) => Err(e),
    };
    let (objects, full, mut outputs) = match rendered {
        Ok(rendered) => rendered,
        Err(e) => {
            progress.error(&e);
            return None;
        }
    };
    let mut render_check = Check::new(
        Status::Pass,
        "render",
        format!("{} resources", objects.len()),
    );
    if env.options.show.render {
        render_check.detail = Some(
            objects
                .iter()
                .map(|o| assert::identifier(o) + "\n")
                .collect(),
        );
    }
    progress.checks.push(render_check);
    if !setup.crds.is_empty() {
        let checks = validate(
            env.validator,
            &setup.crds,
            &objects,
            env.options.show.validate,
        );
        outputs.validate = record(outputs_dir, "validate.txt", &checks, |c| {
            format!("{} {}\n", c.status.symbol(), c.message)
        });
        progress.checks.extend(checks);
    }
    let checks = assertions(suite, test, &base_vars, &full, &objects, env);
    if !checks.is_empty() {
        outputs.assertions = record(outputs_dir, "assertions.txt", &checks, |c| {
            format!("{} {}: {}\n", c.status.symbol(), c.name, c.message)
        });
    }
    progress.checks.extend(checks);
    let vars = Vars {
        outputs: Some(&outputs),
        ..vars
    };
    if dir.is_some() {
        run_hooks(
            "post-test",
            &test.hooks.post_test,
            &vars,
            here,
            env,
            progress,
        )
        .await;
    }
    Some(outputs)
}

/// The directory of `suite`'s file (where its hooks run).
fn suite_dir(suite: &Suite) -> &Path {
    match suite.path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// A test's own directory: `inputs/` (copies hooks may change) and
/// `outputs/` (`rendered/` beneath).
struct TestDir {
    inputs: PathBuf,
    outputs: PathBuf,
}

impl TestDir {
    fn make(dir: &Path) -> Result<Self, PhaseError> {
        let this = Self {
            inputs: dir.join("inputs"),
            outputs: dir.join("outputs"),
        };
        std::fs::create_dir_all(&this.inputs)
            .and_then(|()| std::fs::create_dir_all(this.outputs.join("rendered")))
            .map_err(io(format!(
                "cannot make the test's directory {}",
                dir.display()
            )))
            .map_err(PhaseError::Setup)?;
        Ok(this)
    }
}

/// What setup made of a test's inputs.
struct Setup {
    /// The render's inputs (copies in the test's directory, if it has one).
    inputs: RenderInputs,
    /// Whether the test gives Functions (an alpha Composition needs none:
    /// the render says whether its Composition does).
    functions: bool,
    /// `{{ .Inputs.* }}`: every input's path.
    names: BTreeMap<String, String>,
    /// `crds:`, for validation.
    crds: Vec<PathBuf>,
}

/// Setup: every input expanded, checked and (with a directory) copied;
/// every problem found, not only the first.
fn setup(
    suite: &Suite,
    test: &TestCase,
    dirs: Option<&TestDir>,
    vars: &Vars<'_>,
    full_xr: bool,
) -> Result<Setup, Vec<PhaseError>> {
    let i = &test.inputs;
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut input = |label: &str, key: &str, raw: Option<&String>, required: bool| {
        let Some(raw) = raw else {
            if required {
                errors.push(PhaseError::Setup(said(format!(
                    "inputs.{label} is required (in the test or in common)"
                ))));
            }
            return None;
        };
        let resolved = resolve(&suite.path, vars, &format!("inputs.{label}"), raw);
        let copied = match dirs {
            Some(dirs) => resolved.and_then(|p| copy_input(&p, &dirs.inputs, label)),
            None => resolved,
        };
        match copied {
            Ok(path) => {
                names.insert(key.to_string(), path.display().to_string());
                Some(path)
            }
            Err(e) => {
                errors.push(PhaseError::Setup(e));
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
    // Required unless the Composition is an alpha one (the render reads it).
    let functions = input("functions", "Functions", i.functions.as_ref(), false);
    let optional = [
        (
            "observed-resources",
            "ObservedResources",
            &i.observed_resources,
        ),
        ("extra-resources", "ExtraResources", &i.extra_resources),
        (
            "function-credentials",
            "FunctionCredentials",
            &i.function_credentials,
        ),
        ("xrd", "XRD", &test.patches.xrd),
    ];
    let [observed, extra, credentials, xrd] =
        optional.map(|(label, key, raw)| input(label, key, raw.as_ref(), false));
    let mut context_files = Vec::new();
    for (key, raw) in &i.context_files {
        let label = format!("context-files/{key}");
        if let Some(path) = input(&label, &format!("ContextFiles.{key}"), Some(raw), false) {
            context_files.push((key.clone(), path));
        }
    }
    if i.xr.is_some() && i.claim.is_some() {
        errors.push(PhaseError::Setup(said(
            "inputs.xr and inputs.claim are both set: give one",
        )));
    } else if i.xr.is_none() && i.claim.is_none() {
        errors.push(PhaseError::Setup(said(
            "inputs.xr or inputs.claim is required (in the test or in common)",
        )));
    }
    let mut crds = Vec::new();
    for (n, raw) in i.crds.iter().flatten().enumerate() {
        match resolve(&suite.path, vars, "inputs.crds", raw) {
            Ok(path) => {
                names.insert(format!("CRDs.{n}"), path.display().to_string());
                crds.push(path);
            }
            Err(e) => errors.push(PhaseError::Setup(e)),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let (Some(subject), Some(composition)) = (xr.or(claim.clone()), composition) else {
        return Err(vec![PhaseError::Setup(said("the inputs are incomplete"))]);
    };
    let inputs = RenderInputs {
        xr_or_operation: subject,
        composition_or_functions: Some(composition),
        functions: functions.clone(),
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
            include_full: full_xr,
            ..OutputOptions::default()
        },
        iterations: 1,
        ..Default::default()
    };
    Ok(Setup {
        inputs,
        functions: functions.is_some(),
        names,
        crds,
    })
}

/// An input path: templates expanded, relative to the suite file, there.
fn resolve(suite: &Path, vars: &Vars<'_>, label: &str, raw: &str) -> Result<PathBuf, Cause> {
    let expanded = vars
        .expand(raw)
        .map_err(|e| said(format!("{label}: {e}")))?;
    let path = Path::new(&expanded);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        suite.parent().unwrap_or(Path::new(".")).join(path)
    };
    if !path.exists() {
        return Err(said(format!(
            "{label} {}: no such file or directory",
            path.display()
        )));
    }
    Ok(path)
}

/// Copies `from` (a file or a directory) under `inputs/LABEL/`.
fn copy_input(from: &Path, inputs: &Path, label: &str) -> Result<PathBuf, Cause> {
    let fail = |e: std::io::Error| {
        io(format!(
            "cannot copy {} into the test's directory",
            from.display()
        ))(e)
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

/// Render: the plan read (each input file once), over the run's shared
/// servers, in-process; the objects and the YAML stream printed.
async fn render(setup: &Setup, env: &Env<'_>) -> Result<(Vec<Value>, String), PhaseError> {
    let render = |e: crate::compose::ComposeError| PhaseError::Render(e.into());
    let plan = RenderPlan::read(&setup.inputs).map_err(|e| match e {
        // A mode Pipeline Composition and no Functions: the input is missing.
        crate::compose::ComposeError::NoFunctions { .. } if !setup.functions => PhaseError::Setup(
            said("inputs.functions is required (in the test or in common)"),
        ),
        e => render(e),
    })?;
    let runtimes = env
        .servers
        .runtimes(plan.functions())
        .await
        .map_err(|e| PhaseError::Render(said(e)))?;
    let alpha = env.servers.alpha_steps();
    let timeout = env.options.render_timeout;
    let rendered = tokio::time::timeout(timeout, plan.render_over(&runtimes, &alpha))
        .await
        .map_err(|_| {
            PhaseError::Render(said(format!(
                "did not finish within {timeout:?} (--timeout)"
            )))
        })?
        .map_err(render)?;
    if let Some(fatal) = &rendered.fatal {
        return Err(PhaseError::Render(said(fatal.clone())));
    }
    let text = rendered.to_yaml().map_err(render)?;
    Ok((rendered.renders.concat(), text))
}

/// Runs `hooks` (`pre-test` or `post-test`) in `dir`, in order; false
/// when one did not pass, and the rest do not run (xprin's order).
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
            hook.name
                .as_deref()
                .map_or_else(|| format!("#{}", i + 1), template::as_written)
        );
        let end = match vars.expand(&hook.run) {
            Ok(command) => hooks::run(&command, dir, env.options.hook_timeout).await,
            Err(e) => HookEnd::Error(e),
        };
        match end {
            HookEnd::Passed(output) => {
                let mut check = Check::new(Status::Pass, &name, "passed");
                let output = output.trim_end();
                if env.options.show.hooks && !output.is_empty() {
                    check.detail = Some(output.to_string());
                }
                progress.checks.push(check);
            }
            HookEnd::Failed(output) => {
                progress.push(Status::Fail, &name, output);
                all = false;
            }
            HookEnd::Error(message) => {
                let e = PhaseError::Hook(said(message));
                progress.push(Status::Error, &name, crate::chain::Chain(&e).to_string());
                all = false;
            }
        }
        if !all {
            return false;
        }
    }
    all
}

/// Writes `checks` to `outputs/NAME`, a line each, when the test has a
/// directory; the file's path.
fn record(
    outputs: Option<&Path>,
    name: &str,
    checks: &[Check],
    line: impl Fn(&Check) -> String,
) -> Option<PathBuf> {
    let path = outputs?.join(name);
    let text: String = checks.iter().map(line).collect();
    let _ = std::fs::write(&path, text);
    Some(path)
}

/// Assertions: every one, whatever the others gave.
fn assertions(
    suite: &Suite,
    test: &TestCase,
    vars: &Vars<'_>,
    full: &str,
    objects: &[Value],
    env: &Env<'_>,
) -> Vec<Check> {
    let resources: Vec<assert::Resource> = objects
        .iter()
        .map(|o| (assert::identifier(o), o.clone()))
        .collect();
    let mut checks = Vec::new();
    for a in &test.assertions.xprin {
        match expand_assertion(a, vars) {
            Ok(a) => checks.extend(assert::xprin(&a, &resources)),
            Err(e) => checks.push(Check::new(Status::Error, &template::as_written(&a.name), e)),
        }
    }
    for (checker, list) in [
        (Golden::Diff, &test.assertions.diff),
        (Golden::Dyff, &test.assertions.dyff),
    ] {
        for a in list {
            let update = env.options.update.then_some(env.writes);
            let check = suite
                .golden(a, vars)
                .map_err(|e| PhaseError::Assert(said(e)))
                .and_then(|expected| {
                    let actual = actual(a, full, &resources)?;
                    Ok(assert::golden(checker, a, &expected, &actual, update))
                });
            checks.push(check.unwrap_or_else(|e| {
                Check::new(
                    Status::Error,
                    &template::as_written(&a.name),
                    crate::chain::Chain(&e).to_string(),
                )
            }));
        }
    }
    checks
}

/// An `xprin` assertion with its templates expanded, as xprin renders a
/// test before it runs: every text, and `value` read again as YAML
/// ([`Vars::expand_value`]).
fn expand_assertion(
    a: &super::spec::XprinAssertion,
    vars: &Vars<'_>,
) -> Result<super::spec::XprinAssertion, String> {
    let text = |t: &Option<String>| t.as_deref().map(|t| vars.expand(t)).transpose();
    Ok(super::spec::XprinAssertion {
        name: vars.expand(&a.name)?,
        kind: vars.expand(&a.kind)?,
        resource: text(&a.resource)?,
        field: text(&a.field)?,
        operator: text(&a.operator)?,
        value: a.value.as_ref().map(|v| vars.expand_value(v)).transpose()?,
    })
}

/// What a golden assertion compares: the whole render, or one resource.
fn actual(
    a: &super::spec::GoldenAssertion,
    full: &str,
    resources: &[assert::Resource],
) -> Result<String, PhaseError> {
    let Some(id) = &a.resource else {
        return Ok(full.to_string());
    };
    let Some((_, object)) = resources.iter().find(|(key, _)| key == id) else {
        return Err(PhaseError::Assert(said(format!(
            "no rendered resource {id}"
        ))));
    };
    one_document(object).map_err(|e| PhaseError::Assert(e.into()))
}

/// Validation against `crds`: a pass, a failure per error, or an error
/// when a CRD file cannot be read; `each` lists every resource beneath the
/// pass (`--show-validate`).
fn validate(
    validator: &dyn Validate,
    crds: &[PathBuf],
    objects: &[Value],
    each: bool,
) -> Vec<Check> {
    let name = "validate";
    let mut schemas = Vec::new();
    for path in crds {
        match read_objects(path) {
            Ok(objects) => schemas.extend(objects),
            Err(e) => {
                let e = PhaseError::Validate(e.into());
                return vec![Check::new(
                    Status::Error,
                    name,
                    crate::chain::Chain(&e).to_string(),
                )];
            }
        }
    }
    let errors = validator.validate(&schemas, objects);
    if errors.is_empty() {
        let mut check = Check::new(
            Status::Pass,
            name,
            format!("{} resources valid", objects.len()),
        );
        if each {
            let line =
                |o: &Value| format!("[✓] {} validated successfully\n", assert::identifier(o));
            check.detail = Some(objects.iter().map(line).collect());
        }
        return vec![check];
    }
    errors
        .into_iter()
        .map(|e| Check::new(Status::Fail, name, e))
        .collect()
}

/// One object as YAML, as xprin writes each rendered resource's file (and
/// a golden file of one resource compares): no `---` before it.
fn one_document(object: &Value) -> Result<String, crate::compose::ComposeError> {
    let text = to_yaml_stream(std::slice::from_ref(object))?;
    Ok(match text.strip_prefix("---\n") {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

/// Writes `rendered.yaml`, `xr.yaml` and one file per object under
/// `rendered/` in `dir`, when the test has one.
fn write_outputs(dir: Option<&Path>, objects: &[Value], full: &str) -> Result<Outputs, Cause> {
    let Some(dir) = dir else {
        return Ok(Outputs {
            render_count: objects.len(),
            ..Default::default()
        });
    };
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(io(format!("cannot write {}", path.display())))
    };
    let yaml = one_document;
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
fn patch_connection_secret(path: &Path, test: &TestCase, claim: bool) -> Result<(), PhaseError> {
    let patch = |cause: Cause| PhaseError::Patch(cause);
    let mut object = read_one(path).map_err(|e| patch(e.into()))?;
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
        return Err(patch(said(format!("{}: not an object", path.display()))));
    };
    let spec = root.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return Err(patch(said(format!(
            "{}: spec is not an object",
            path.display()
        ))));
    };
    spec.insert("writeConnectionSecretToRef".into(), reference);
    let text = to_yaml_stream(&[object]).map_err(|e| patch(e.into()))?;
    std::fs::write(path, text)
        .map_err(io(format!("cannot write {}", path.display())))
        .map_err(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `render` says of a mode Pipeline Composition given no
    /// Functions: `functions` whether the test gave them.
    async fn no_functions(functions: bool) -> PhaseError {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let xr = write(
            "xr.yaml",
            "apiVersion: example.org/v1\nkind: XBucket\nmetadata: {name: b}\n",
        );
        let composition = write(
            "composition.yaml",
            "apiVersion: apiextensions.crossplane.io/v1\nkind: Composition\n\
             metadata: {name: c}\nspec:\n  compositeTypeRef: {apiVersion: example.org/v1, \
             kind: XBucket}\n  mode: Pipeline\n  pipeline:\n  - step: s\n    functionRef: \
             {name: f}\n",
        );
        let setup = Setup {
            inputs: RenderInputs {
                xr_or_operation: xr,
                composition_or_functions: Some(composition),
                ..Default::default()
            },
            functions,
            names: BTreeMap::new(),
            crds: Vec::new(),
        };
        let options = Options {
            update: false,
            hook_timeout: Duration::from_secs(1),
            render_timeout: Duration::from_secs(1),
            repositories: BTreeMap::new(),
            keep: false,
            run: None,
            full_xr: true,
            show: Show::default(),
        };
        let servers = SharedServers::new(
            None,
            crate::compose::ContainerDefaults {
                default_registry: "index.docker.io".into(),
                timeout: Duration::from_secs(1),
                pull_policy: crate::image::PullPolicy::Never,
                keeper: None,
                development_wait: Duration::from_secs(1),
            },
        );
        let env = Env {
            options: &options,
            servers: &servers,
            validator: &crate::schema::Validator::default(),
            limit: &tokio::sync::Semaphore::new(1),
            line: &super::super::progress::Line::new(false, 1, 1),
            writes: &super::super::writes::Opened::default(),
        };
        match render(&setup, &env).await {
            Ok(_) => panic!("rendered without Functions"),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn a_pipeline_composition_and_no_functions_input_is_setup_s_missing_input() {
        let missing = no_functions(false).await;
        assert_eq!(missing.phase(), "setup");
        assert_eq!(
            crate::chain::Chain(&missing).to_string(),
            "inputs.functions is required (in the test or in common)"
        );
        // Given (and still not read as Functions): the render's own error.
        let given = no_functions(true).await;
        assert_eq!(given.phase(), "render");
        assert!(
            crate::chain::Chain(&given).to_string().ends_with(
                "a mode Pipeline Composition needs FUNCTIONS (a file or directory of Functions)"
            ),
            "{given:?}"
        );
    }
}
