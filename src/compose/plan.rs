//! A render, decided before anything runs: the composition core's front
//! door. [`RenderPlan::read`] reads every input once, through the read
//! stage ([`crate::compose::read`]), and holds the `Read` it made whole;
//! [`RenderPlan::needs`] says from it what the render needs of the machine
//! (whether the namespace must be entered at all, how many warm
//! containers); [`RenderPlan::render`] then starts (or reuses) every
//! function server a step uses, runs the pipeline (nested XRs after the XR
//! that composed them) and stops the servers it started, whatever the
//! outcome ([`RenderPlan::render_over`]: over servers the caller keeps);
//! [`Rendered`] prints it. Composition and operation renders are the same
//! plan with a different subject.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::compose::print::output::{to_yaml_stream, CompositeOutput};
use crate::compose::read::model::{
    AlphaFunction, Composition, Function, Pipeline, PipelineStep, RuntimeKind,
};
use crate::compose::read::{
    composite_xr, configure, usage, CompositeXr, Read, RenderInputs, Subject,
};
use crate::compose::run::alpha::{run_alpha, ContainerConfig};
use crate::compose::run::runtimes::kept::{self, KeeperCommand, KeptStart};
use crate::compose::run::runtimes::{
    daemon_answers, ContainerDefaults, ContainerSteps, RuntimeMap, Runtimes,
};
use crate::compose::run::v1::V1Pipeline;
use crate::compose::{ComposeError, Observed};
use crate::image::PullPolicy;
use crate::runner::Runner;
use crate::value::get_str;

/// A render's future is `Send`, so it may run on any task: every runtime
/// is a backend of the `Send` call seam (checked when xfn compiles).
const _: () = {
    fn send<T: Send>(_: T) {}
    #[allow(dead_code)]
    fn render_is_send(plan: RenderPlan, defaults: ContainerDefaults) {
        send(plan.render(None, defaults));
    }
};

/// How deep nested XRs are rendered: a Composition that composes its own
/// type (directly or through others) stops here with an error.
pub(crate) const MAX_NESTING: usize = 8;

/// A render with every input read and checked: the [`Read`] it came
/// from, whole (each input file read once), and the kept servers got
/// ready for it.
#[derive(Debug)]
pub(crate) struct RenderPlan {
    read: Read,
    /// Kept servers got ready by [`RenderPlan::start_kept`], by Function.
    kept: std::sync::Mutex<HashMap<String, KeptStart>>,
}

/// What a render needs of the machine before it starts: whether it runs
/// containers here (and so xfn's user namespace), and how many one call
/// makes at most (each made ahead in the runner's warm pool).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Needs {
    /// Whether a Function (Exec, Docker not kept) or an alpha step no
    /// daemon runs is run in a container here.
    pub(crate) containers: bool,
    /// Most containers one call makes in-process (Exec Functions, alpha
    /// steps no daemon runs).
    pub(crate) per_call: usize,
}

impl Needs {
    /// What renders of `functions` (Functions files, each read once) and
    /// `compositions` (Composition files) need together: `xfn test`'s
    /// run, before any test is read. Files that cannot be read yet
    /// (templated from other tests) are skipped: their test reads them.
    pub(crate) fn of_files<'a>(
        functions: impl IntoIterator<Item = &'a Path>,
        compositions: impl IntoIterator<Item = &'a Path>,
    ) -> Self {
        let mut needs = Needs::default();
        let mut exec = std::collections::BTreeSet::new();
        for function in functions
            .into_iter()
            .filter_map(|f| crate::compose::read::files::read_functions(f, &[]).ok())
            .flatten()
        {
            match function.runtime {
                RuntimeKind::Exec => {
                    needs.containers = true;
                    // Function's Debug is every setting that makes its container.
                    exec.insert(format!("{function:?}"));
                }
                RuntimeKind::Docker => needs.containers = true,
                RuntimeKind::Development { .. } => {}
            }
        }
        let alpha = compositions
            .into_iter()
            .filter_map(|c| crate::compose::read::files::read_one(c).ok())
            .filter_map(|c| Composition::alpha_functions(&c))
            .map(|steps| alpha_containers(&steps))
            .max()
            .unwrap_or(0);
        needs.containers |= alpha > 0;
        needs.per_call = exec.len().max(alpha);
        needs
    }
}

/// What a render printed, and whether a Fatal result cut it short.
#[derive(Debug)]
pub(crate) struct Rendered {
    /// The output objects of each XR (or of the Operation), in input
    /// order: the XR first, then what `crossplane render` prints after it.
    pub(crate) renders: Vec<Vec<Value>>,
    /// `pipeline step "s" returned a fatal result: …`, when one did (for
    /// several XRs, each XR's, named): that XR's output is then partial,
    /// and `xfn render` exits 3.
    pub(crate) fatal: Option<String>,
}

impl Rendered {
    /// The YAML stream `crossplane render` prints; several XRs' outputs
    /// follow each other as documents of one stream.
    pub(crate) fn to_yaml(&self) -> Result<String, ComposeError> {
        let objects: Vec<Value> = self.renders.iter().flatten().cloned().collect();
        to_yaml_stream(&objects)
    }

    /// One JSON object a line per XR (or Operation): see
    /// [`crate::compose::print::output::json_object`].
    pub(crate) fn to_json_lines(&self) -> Result<String, ComposeError> {
        let mut text = String::new();
        for objects in &self.renders {
            let line = serde_json::to_string(&crate::compose::print::output::json_object(objects))
                .map_err(ComposeError::OutputJson)?;
            text.push_str(&line);
            text.push('\n');
        }
        Ok(text)
    }
}

impl RenderPlan {
    /// Reads and checks every input ([`crate::compose::read`]), each
    /// file once.
    pub(crate) fn read(inputs: &RenderInputs) -> Result<Self, ComposeError> {
        Ok(Self {
            read: Read::from_inputs(inputs)?,
            kept: Default::default(),
        })
    }

    /// What the render needs before it starts (see [`Needs`]). A render
    /// of Development Functions (or of alpha steps that all go to a
    /// daemon, which must see xfn's own uid) runs no container, and works
    /// wherever a namespace cannot be entered; a kept server runs in its
    /// keeper's namespace, not the render's.
    pub(crate) fn needs(&self) -> Needs {
        match &self.read.subject {
            Subject::Alpha { functions, .. } => {
                let per_call = alpha_containers(functions);
                Needs {
                    containers: per_call > 0,
                    per_call,
                }
            }
            _ => Needs {
                containers: self.read.functions.iter().any(|f| match f.runtime {
                    RuntimeKind::Exec => true,
                    RuntimeKind::Docker => f.keep.is_none(),
                    RuntimeKind::Development { .. } => false,
                }),
                per_call: self
                    .read
                    .functions
                    .iter()
                    .filter(|f| matches!(f.runtime, RuntimeKind::Exec))
                    .count(),
            },
        }
    }

    /// Gets every kept server ready (reused, or its keeper started), while
    /// the process is single-threaded and outside any namespace: keepers
    /// enter their own, as any xfn does. `pull_policy` is the default for
    /// Functions that set none.
    pub(crate) fn start_kept(
        &self,
        keeper: &KeeperCommand,
        pull_policy: PullPolicy,
    ) -> Result<(), ComposeError> {
        // Two Functions keeping one server would each lock and start it.
        let mut names: HashMap<&str, &str> = HashMap::new();
        for function in self.read.functions.iter() {
            let (Some(name), RuntimeKind::Docker) = (&function.keep, &function.runtime) else {
                continue;
            };
            if let Some(other) = names.insert(name, &function.name) {
                return Err(ComposeError::FunctionInvalid {
                    function: function.name.clone(),
                    message: format!(
                        "Function {other:?} keeps a server named {name:?} too; give each its own \
                         render.crossplane.io/runtime-docker-name"
                    ),
                });
            }
        }
        for function in self.read.functions.iter().filter(|f| f.keep.is_some()) {
            if !matches!(function.runtime, RuntimeKind::Docker) {
                continue;
            }
            let policy = match function.pull_policy.as_deref() {
                Some(policy) => {
                    policy
                        .parse()
                        .map_err(|source| ComposeError::FunctionPullPolicy {
                            function: function.name.clone(),
                            source,
                        })?
                }
                None => pull_policy,
            };
            let start = kept::prepare(function, function.image(), policy, keeper)?;
            if let Ok(mut kept) = self.kept.lock() {
                kept.insert(function.name.clone(), start);
            }
        }
        Ok(())
    }

    /// The Functions a step uses.
    pub(crate) fn functions(&self) -> &[Function] {
        &self.read.functions
    }

    /// Renders over `runtimes` someone else started and stops (`xfn test`:
    /// one server per Function for every test that uses it). An alpha
    /// Composition (`spec.functions`) calls no Function servers: its
    /// steps run through `alpha` (the runner, or a daemon at a step's
    /// endpoint), as `xfn render` runs them.
    pub(crate) async fn render_over(
        &self,
        runtimes: &RuntimeMap,
        alpha: &ContainerSteps,
    ) -> Result<Rendered, ComposeError> {
        if let Subject::Alpha { .. } = &self.read.subject {
            return self.render_alpha(alpha).await;
        }
        self.render_all(runtimes).await
    }

    /// Runs an alpha Composition's steps (`spec.functions`) through `steps`.
    async fn render_alpha(&self, steps: &ContainerSteps) -> Result<Rendered, ComposeError> {
        let Subject::Alpha {
            xr,
            functions,
            observed,
        } = &self.read.subject
        else {
            unreachable!("called for alpha Compositions only")
        };
        let observed = Observed {
            composite: xr.clone(),
            resources: observed.clone(),
        };
        let outcome = run_alpha(functions, steps, &observed).await?;
        let objects = crate::compose::run::alpha::output::alpha_objects(
            &observed,
            &outcome,
            self.read.output,
        );
        Ok(Rendered {
            renders: vec![objects],
            fatal: None,
        })
    }

    /// Runs the render: every function server a step uses started (or
    /// reused) at once, the pipeline, the servers stopped (kept ones
    /// left running), the output assembled.
    pub(crate) async fn render(
        self,
        runner: Option<Arc<Runner>>,
        defaults: ContainerDefaults,
    ) -> Result<Rendered, ComposeError> {
        if let Subject::Alpha { .. } = &self.read.subject {
            return self
                .render_alpha(&ContainerSteps { runner, defaults })
                .await;
        }
        let kept = self
            .kept
            .lock()
            .map(|mut k| std::mem::take(&mut *k))
            .unwrap_or_default();
        let runtimes = Runtimes::new(&self.read.functions, runner.as_ref(), &defaults, kept)?;
        // Every server starts once, before the first XR, and serves them all.
        runtimes.around(self.render_all(runtimes.map())).await
    }

    /// Renders the Operation, or each XR in turn over `runtimes`, each
    /// followed by the nested XRs it composed (depth first).
    async fn render_all(&self, runtimes: &RuntimeMap) -> Result<Rendered, ComposeError> {
        let fatal_message = |outcome: &crate::compose::Outcome| {
            outcome.fatal.as_ref().map(|f| {
                format!(
                    "pipeline step {:?} returned a fatal result: {}",
                    f.step, f.message
                )
            })
        };
        let xrs = match &self.read.subject {
            Subject::Operation(operation) => {
                let outcome = self.pipeline(&operation.steps, runtimes, None).await?;
                return Ok(Rendered {
                    renders: vec![operation.objects(&outcome, self.read.output)],
                    fatal: fatal_message(&outcome),
                });
            }
            Subject::Composite { xrs } => xrs,
            Subject::Alpha { .. } => unreachable!("alpha renders run their own steps"),
        };
        let mut renders = Vec::new();
        let mut fatal = Vec::new();
        for top in xrs {
            // Depth first, in the order each XR composed its nested XRs.
            let mut pending = vec![(top.clone(), 0)];
            while let Some((xr, depth)) = pending.pop() {
                let observed = Observed {
                    composite: xr.xr.clone(),
                    resources: xr.observed.clone(),
                };
                let Pipeline::V1(steps) = &xr.composition.pipeline else {
                    unreachable!("composite renders are of mode Pipeline Compositions")
                };
                let (outcome, observed) = self.renders(steps, runtimes, &xr, observed).await?;
                if let Some(message) = fatal_message(&outcome) {
                    fatal.push(match (xrs.len(), depth) {
                        (1, 0) => message,
                        _ => format!(
                            "XR {}: {message}",
                            get_str(&xr.xr, &["metadata", "name"]).unwrap_or_default()
                        ),
                    });
                }
                let objects = self.composite_objects(&xr, &outcome, &observed)?;
                let composed = &objects[1..=outcome.resources.len().min(objects.len() - 1)];
                let nested = self.nested_xrs(composed, depth)?;
                pending.extend(nested.into_iter().rev().map(|n| (n, depth + 1)));
                renders.push(objects);
            }
        }
        Ok(Rendered {
            renders,
            fatal: (!fatal.is_empty()).then(|| fatal.join("; ")),
        })
    }

    /// The composed resources (of an XR at nesting `depth`) that are XRs
    /// of a `--nested-composition`, as Crossplane's reconciler would hand
    /// them to its pipeline (they observe nothing yet).
    fn nested_xrs(
        &self,
        composed: &[Value],
        depth: usize,
    ) -> Result<Vec<CompositeXr>, ComposeError> {
        let mut nested = Vec::new();
        for object in composed {
            let kind = (
                get_str(object, &["apiVersion"]).unwrap_or_default(),
                get_str(object, &["kind"]).unwrap_or_default(),
            );
            let Some((path, composition, _)) = self
                .read
                .nested
                .iter()
                .find(|(_, c, _)| Composition::composite_type(c) == kind)
            else {
                continue;
            };
            if depth + 1 >= MAX_NESTING {
                return Err(usage(
                    path,
                    &format!(
                        "XRs nested {MAX_NESTING} deep: does a Composition compose its own type?"
                    ),
                ));
            }
            let mut xr = composite_xr(None, path, object.clone(), path, composition, false)?;
            configure(&mut xr);
            nested.push(xr);
        }
        Ok(nested)
    }

    /// One run of the pipeline, observing `observed` (none for an
    /// Operation).
    async fn pipeline(
        &self,
        steps: &[PipelineStep],
        runtimes: &RuntimeMap,
        observed: Option<&Observed>,
    ) -> Result<crate::compose::Outcome, ComposeError> {
        V1Pipeline {
            steps,
            runtimes,
            observed,
            required: &self.read.required,
            schemas: &self.read.schemas,
            credentials: &self.read.credentials,
            context: self.read.context.clone(),
        }
        .run_steps()
        .await
    }

    /// Runs the pipeline for `xr` once, or for `--iterations N` up to N
    /// times: each render observes what the previous one composed (its
    /// composed resources as observed resources, the XR with its status
    /// and references), as Crossplane's next reconcile would, until the
    /// output is the same twice (bi-directional patching settles) or a
    /// Fatal result ends it. Returns the last outcome and what it observed.
    async fn renders(
        &self,
        steps: &[PipelineStep],
        runtimes: &RuntimeMap,
        xr: &CompositeXr,
        mut observed: Observed,
    ) -> Result<(crate::compose::Outcome, Observed), ComposeError> {
        let mut previous: Option<Vec<Value>> = None;
        for round in 1..=self.read.iterations {
            let outcome = self.pipeline(steps, runtimes, Some(&observed)).await?;
            if self.read.iterations == 1 {
                return Ok((outcome, observed));
            }
            let again = round < self.read.iterations && outcome.fatal.is_none();
            let objects = self.composite_objects(xr, &outcome, &observed)?;
            if previous.as_ref() == Some(&objects) {
                tracing::info!(renders = round, "the output is stable");
                return Ok((outcome, observed));
            }
            if !again {
                if outcome.fatal.is_none() {
                    tracing::warn!(
                        renders = round,
                        "the output still changed in the last of {round} renders \
                         (--iterations {round}); printing the last"
                    );
                }
                return Ok((outcome, observed));
            }
            observed = fed_back(&observed, &objects, outcome.resources.len());
            previous = Some(objects);
        }
        unreachable!("the last round returns")
    }

    /// The output objects of `xr`'s render, whose `outcome` observed
    /// `observed`.
    fn composite_objects(
        &self,
        xr: &CompositeXr,
        outcome: &crate::compose::Outcome,
        observed: &Observed,
    ) -> Result<Vec<Value>, ComposeError> {
        CompositeOutput {
            xr: &xr.xr,
            input_xr: &xr.input_xr,
            schema: xr.schema,
            composition: (&xr.composition.name, xr.composition.revision.as_deref()),
            observed,
            outcome,
            options: self.read.output,
        }
        .objects()
    }
}

/// How many of an alpha Composition's steps run a container in-process
/// (those whose runner daemon does not answer): each needs xfn's user
/// namespace and is made ahead in the runner's warm pool.
pub(crate) fn alpha_containers(functions: &[AlphaFunction]) -> usize {
    functions
        .iter()
        .filter(|f| {
            let spec = f.container.clone().unwrap_or_default();
            ContainerConfig::from_spec(&spec).is_ok_and(|c| !daemon_answers(&c.endpoint))
        })
        .count()
}

/// What the next reconcile observes after a render printed `objects` (the
/// XR, then its `composed` composed resources): the XR with the printed
/// status and references, the composed resources as applied.
fn fed_back(observed: &Observed, objects: &[Value], composed: usize) -> Observed {
    let mut composite = observed.composite.clone();
    if let Some(printed) = objects.first() {
        let mut without_status = printed.clone();
        let status = without_status
            .as_object_mut()
            .and_then(|o| o.remove("status"));
        crate::value::merge(&mut composite, &without_status);
        if let (Some(object), Some(status)) = (composite.as_object_mut(), status) {
            object.insert("status".into(), status);
        }
    }
    let resources = objects
        .iter()
        .skip(1)
        .take(composed)
        .filter_map(|object| {
            let name = get_str(
                object,
                &[
                    "metadata",
                    "annotations",
                    crate::compose::read::model::RESOURCE_NAME_ANNOTATION,
                ],
            )?;
            Some((name.to_string(), object.clone()))
        })
        .collect();
    Observed {
        composite,
        resources,
    }
}
