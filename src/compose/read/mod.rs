//! The read stage of a render: every input file read and checked once,
//! into one `Read` that [`crate::compose::plan`] consumes. It runs while the
//! process is still single-threaded (before xfn's user namespace and the
//! async runtime), so a bad input fails before anything starts. The XRs
//! come out as Crossplane's reconciler hands them to the pipeline (a claim
//! as its XR, the XRD's defaults applied, uid, labels and references set);
//! nested XRs found later by the plan are made the same way, through
//! `composite_xr` and `configure`. Files are parsed by [`crate::compose::read::files`],
//! objects checked by [`crate::compose::read::model`]; flag syntax is the CLI's.
//! Nothing here imports a later stage (plan, run).
pub(crate) mod claim;
pub(crate) mod files;
pub(crate) mod model;
pub(crate) mod operation;
pub(crate) mod schemas;
pub(crate) mod xrd;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use self::files::{parse_value, read_functions, read_objects, read_one};
use self::model::{
    observed_by_name, AlphaFunction, Composite, Composition, Function, Pipeline, PipelineStep,
};
use self::operation::{is_operation, Operation};
use self::xrd::{XrSchema, Xrd};
use crate::compose::names;
use crate::compose::names::COMPOSITE_LABEL;
use crate::compose::ComposeError;
use crate::compose::OutputOptions;
use crate::value::{get_str, object_at};

/// What a render is given, as paths and flags: what `xfn render`'s command
/// line maps onto.
#[derive(Debug, Clone, Default)]
pub(crate) struct RenderInputs {
    /// `crossplane render`'s positional form, `XR COMPOSITION [FUNCTIONS]`
    /// or `OPERATION FUNCTIONS` (which it is, is read from this file's
    /// kind): the XR (or several, a multi-document file), or an Operation,
    /// CronOperation or WatchOperation.
    pub(crate) xr_or_operation: PathBuf,
    /// More XR files (`--xr`, repeatable), rendered after the first file's
    /// XRs with the same Composition and Functions.
    pub(crate) more_xrs: Vec<PathBuf>,
    /// The Composition (or CompositionRevision) for XRs; the Functions for
    /// an Operation.
    pub(crate) composition_or_functions: Option<PathBuf>,
    /// The Functions for XRs.
    pub(crate) functions: Option<PathBuf>,
    /// `-o`: observed composed resources.
    pub(crate) observed_resources: Option<PathBuf>,
    /// `-e` (and `--extra-resources`), repeatable.
    pub(crate) required_resources: Vec<PathBuf>,
    /// `-s`: a directory of OpenAPI v3 documents.
    pub(crate) required_schemas: Option<PathBuf>,
    /// `--xrd`.
    pub(crate) xrd: Option<PathBuf>,
    /// The XR input is a claim even with no XRD saying so (`xfn test`'s
    /// `claim:` input); otherwise only the XRD's `spec.claimNames` makes an
    /// object of another kind than the Composition's a claim.
    pub(crate) claim: bool,
    /// `-w`: a WatchOperation's watched resource.
    pub(crate) watched_resource: Option<PathBuf>,
    /// `--function-credentials`.
    pub(crate) function_credentials: Option<PathBuf>,
    /// `-a KEY=VALUE`, repeatable: set on every Function's annotations,
    /// in order (a later one for the same key wins, all over the
    /// Functions' own).
    pub(crate) function_annotations: Vec<(String, String)>,
    /// `--context-files key=file`: a context field read from a JSON or
    /// YAML file.
    pub(crate) context_files: Vec<(String, PathBuf)>,
    /// `--context-values key=value`: a context field, JSON or YAML text
    /// (these win over the files).
    pub(crate) context_values: Vec<(String, String)>,
    /// What to print.
    pub(crate) output: OutputOptions,
    /// `--iterations N`: render an XR up to N times, each time observing
    /// what the previous render composed, until its output is stable (0
    /// and 1: once).
    pub(crate) iterations: u32,
    /// `--nested-composition FILE`, repeatable: a composed resource of a
    /// type one of these composes is itself an XR, rendered through it
    /// (recursively) after the XR that composed it.
    pub(crate) nested_compositions: Vec<PathBuf>,
}

/// Where a render's Functions are read from, and the steps that use them.
type FunctionsAndSteps = (Option<PathBuf>, Vec<PipelineStep>);

/// What is rendered.
#[derive(Debug)]
pub(super) enum Subject {
    /// XRs through a pipeline Composition, one after the other, over the
    /// same function servers.
    Composite { xrs: Vec<CompositeXr> },
    /// An XR through an alpha (`spec.functions`) Composition.
    Alpha {
        xr: Value,
        functions: Vec<AlphaFunction>,
        observed: Vec<(String, Value)>,
    },
    /// An Operation.
    Operation(Operation),
}

/// One XR of a composite render, as the pipeline first sees it, with the
/// Composition it is rendered through.
#[derive(Debug, Clone)]
pub(super) struct CompositeXr {
    /// The Composition (mode Pipeline).
    pub(super) composition: Composition,
    /// Legacy or Modern.
    pub(super) schema: XrSchema,
    /// What `-x` merges the output into: the XR as given with the XRD's
    /// defaults.
    pub(super) input_xr: Value,
    /// The XR as Crossplane's reconciler hands it to the pipeline.
    pub(super) xr: Value,
    /// Its observed composed resources by name.
    pub(super) observed: Vec<(String, Value)>,
}

/// A render with every input read and checked: what the plan runs.
#[derive(Debug)]
pub(super) struct Read {
    /// What is rendered.
    pub(super) subject: Subject,
    /// The Functions a step uses.
    pub(super) functions: Vec<Function>,
    /// `-e`, and a WatchOperation's watched resource.
    pub(super) required: Vec<Value>,
    /// `-s`.
    pub(super) schemas: Vec<Value>,
    /// `--function-credentials`.
    pub(super) credentials: Vec<Value>,
    /// The first step's context.
    pub(super) context: Option<Value>,
    /// What to print.
    pub(super) output: OutputOptions,
    /// How many times at most an XR is rendered (`--iterations`).
    pub(super) iterations: u32,
    /// `--nested-composition`s: (file, Composition object, its steps).
    pub(super) nested: Vec<(PathBuf, Value, Vec<PipelineStep>)>,
}

impl Read {
    /// Reads and checks every input.
    pub(super) fn from_inputs(inputs: &RenderInputs) -> Result<Self, ComposeError> {
        // The subject's documents, then each --xr file's, with the file
        // each came from.
        let mut subjects = Vec::new();
        for path in std::iter::once(&inputs.xr_or_operation).chain(&inputs.more_xrs) {
            let objects = read_objects(path)?;
            if objects.is_empty() {
                return Err(usage(path, "holds no object"));
            }
            subjects.extend(objects.into_iter().map(|o| (path.clone(), o)));
        }
        let first = subjects[0].1.clone();
        let required = read_all(&inputs.required_resources)?;
        let schemas = match &inputs.required_schemas {
            Some(dir) => crate::compose::read::schemas::read_schema_documents(dir)?,
            None => Vec::new(),
        };
        let credentials = match &inputs.function_credentials {
            Some(path) => read_objects(path)?,
            None => Vec::new(),
        };
        let context = initial_context(&inputs.context_files, &inputs.context_values)?;
        let mut this = Self {
            subject: Subject::Operation(Operation {
                object: Value::Null,
                steps: Vec::new(),
            }),
            functions: Vec::new(),
            required,
            schemas,
            credentials,
            context,
            output: inputs.output,
            iterations: inputs.iterations.max(1),
            nested: Vec::new(),
        };
        let read = if is_operation(&first) {
            this.read_operation(inputs, subjects.len(), first)?
        } else {
            match this.read_composite(inputs, subjects)? {
                Some(read) => read,
                // An alpha Composition names its functions' images itself.
                None => return Ok(this),
            }
        };
        let (functions_path, mut steps) = read;
        let Some(functions_path) = functions_path else {
            return Err(usage(
                &inputs.xr_or_operation,
                "FUNCTIONS (a file or directory of Functions) is missing",
            ));
        };
        steps.extend(this.nested.iter().flat_map(|(_, _, s)| s.iter().cloned()));
        let functions = read_functions(&functions_path, &inputs.function_annotations)?;
        // Only the Functions a step uses must be runnable; a step that
        // names an unknown one fails here, before anything starts.
        for step in &steps {
            if !functions.iter().any(|f| f.name == step.function_ref.name) {
                let mut known: Vec<_> = functions.iter().map(|f| f.name.clone()).collect();
                known.sort();
                return Err(ComposeError::UnknownFunction {
                    step: step.step.clone(),
                    function: step.function_ref.name.clone(),
                    known: known.join(", "),
                });
            }
        }
        this.functions = functions
            .into_iter()
            .filter(|f| steps.iter().any(|s| s.function_ref.name == f.name))
            .collect();
        Ok(this)
    }

    /// Reads an Operation's render: the Operation (`first`, the only
    /// input), its watched resource; returns where its Functions are and
    /// its steps.
    fn read_operation(
        &mut self,
        inputs: &RenderInputs,
        count: usize,
        first: Value,
    ) -> Result<FunctionsAndSteps, ComposeError> {
        if !inputs.nested_compositions.is_empty() {
            return Err(usage(
                &inputs.xr_or_operation,
                "--nested-composition is for XRs, not Operations",
            ));
        }
        if count > 1 {
            return Err(usage(
                &inputs.xr_or_operation,
                "an Operation render takes one Operation (several inputs are for XRs)",
            ));
        }
        if inputs.functions.is_some() {
            return Err(usage(
                &inputs.xr_or_operation,
                "an Operation render takes OPERATION FUNCTIONS",
            ));
        }
        for (flag, given) in [
            ("--xrd", inputs.xrd.is_some()),
            (
                "-o/--observed-resources",
                inputs.observed_resources.is_some(),
            ),
            ("--include-deleted-resources", inputs.output.include_deleted),
            ("--include-requirements", inputs.output.include_requirements),
            ("--iterations", inputs.iterations > 1),
        ] {
            if given {
                return Err(usage(
                    &inputs.xr_or_operation,
                    &format!("{flag} is for XRs, not Operations"),
                ));
            }
        }
        let watched = match &inputs.watched_resource {
            Some(path) => {
                let objects = read_objects(path)?;
                let [watched] = objects.as_slice() else {
                    return Err(ComposeError::Invalid {
                        path: path.clone(),
                        message: format!(
                            "--watched-resource must hold exactly one resource, found {}",
                            objects.len()
                        ),
                    });
                };
                // Functions fetch it like any required resource.
                self.required.push(watched.clone());
                Some(watched.clone())
            }
            None => None,
        };
        let operation = Operation::from_object(&inputs.xr_or_operation, first, watched.as_ref())?;
        let steps = operation.steps.clone();
        self.subject = Subject::Operation(operation);
        Ok((inputs.composition_or_functions.clone(), steps))
    }

    /// Reads an XR render: the XRs (`subjects`, with the files they came
    /// from), the Composition, the observed resources and nested
    /// Compositions; returns where the Functions are and the steps, or
    /// None for an alpha Composition (the read is then complete).
    fn read_composite(
        &mut self,
        inputs: &RenderInputs,
        subjects: Vec<(PathBuf, Value)>,
    ) -> Result<Option<FunctionsAndSteps>, ComposeError> {
        if inputs.watched_resource.is_some() {
            return Err(usage(
                &inputs.xr_or_operation,
                "--watched-resource is for WatchOperations",
            ));
        }
        let Some(composition_path) = &inputs.composition_or_functions else {
            return Err(usage(
                &inputs.xr_or_operation,
                "an XR render takes XR COMPOSITION [FUNCTIONS]",
            ));
        };
        // Files given in another order than `XR COMPOSITION [FUNCTIONS]`
        // are named for what they are, with the order.
        let order = |path: &Path, object: &Value, place: &str| {
            let kind = get_str(object, &["kind"]).unwrap_or_default();
            usage(
                path,
                &format!(
                    "holds {} {kind}, given as the {place}: an XR render takes XR COMPOSITION \
                     [FUNCTIONS], in that order",
                    super::article(kind)
                ),
            )
        };
        let is_composition = |object: &Value| {
            let api = get_str(object, &["apiVersion"]).unwrap_or_default();
            let kind = get_str(object, &["kind"]).unwrap_or_default();
            api.starts_with("apiextensions.crossplane.io/")
                && matches!(kind, "Composition" | "CompositionRevision")
        };
        let is_function = |object: &Value| {
            let api = get_str(object, &["apiVersion"]).unwrap_or_default();
            api.starts_with("pkg.crossplane.io/") && get_str(object, &["kind"]) == Some("Function")
        };
        if let Some((path, object)) = subjects
            .iter()
            .find(|(_, o)| is_composition(o) || is_function(o))
        {
            return Err(order(path, object, "XR"));
        }
        let composition_object = read_one(composition_path)?;
        if !is_composition(&composition_object) && !composition_object["kind"].is_null() {
            let kind = get_str(&composition_object, &["kind"]).unwrap_or_default();
            if is_function(&composition_object) || subjects.iter().any(|(_, o)| o["kind"] == kind) {
                return Err(order(composition_path, &composition_object, "COMPOSITION"));
            }
        }
        let observed = match &inputs.observed_resources {
            Some(path) => Some((path, observed_by_name(path, read_objects(path)?)?)),
            None => None,
        };
        let several = subjects.len() > 1;
        let mut xrs = Vec::new();
        let mut seen: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let counts = subjects
            .iter()
            .fold(BTreeMap::new(), |mut counts, (path, _)| {
                *counts.entry(path.clone()).or_insert(0) += 1;
                counts
            });
        for (path, object) in subjects {
            let index = seen.entry(path.clone()).or_insert(0);
            let (this, count) = (*index, counts[&path]);
            *index += 1;
            let xr = composite_xr(
                inputs.xrd.as_deref(),
                &path,
                object.clone(),
                composition_path,
                &composition_object,
                inputs.claim,
            )
            .map_err(|e| e.in_document(&path, this, count, &object))?;
            xrs.push(xr);
        }
        let composition = xrs[0].composition.clone();
        if let Some((path, observed)) = observed {
            distribute_observed(path, &mut xrs, observed)?;
        }
        match composition.pipeline.clone() {
            Pipeline::Alpha(_) if !inputs.nested_compositions.is_empty() => Err(usage(
                composition_path,
                "--nested-composition is for mode Pipeline Compositions",
            )),
            Pipeline::Alpha(_) if inputs.iterations > 1 => Err(usage(
                composition_path,
                "--iterations is for mode Pipeline Compositions",
            )),
            Pipeline::Alpha(_) if several => Err(usage(
                composition_path,
                "several XRs are rendered through mode Pipeline Compositions only",
            )),
            Pipeline::Alpha(functions) => {
                let Some(xr) = xrs.pop() else {
                    unreachable!("there is one XR")
                };
                self.subject = Subject::Alpha {
                    xr: xr.xr,
                    functions,
                    observed: xr.observed,
                };
                Ok(None)
            }
            Pipeline::V1(steps) => {
                for xr in &mut xrs {
                    configure(xr);
                    check_observed(composition_path, &xr.xr, &xr.observed)?;
                    // Crossplane finds an observed resource by the name its
                    // reference gives and skips a reference with none
                    // (v2.3.4 composition_functions.go:795, `if ref.Name ==
                    // "" { continue }`): a nameless one is not observed.
                    xr.observed.retain(|(_, o)| {
                        get_str(o, &["metadata", "name"]).is_some_and(|n| !n.is_empty())
                    });
                }
                self.subject = Subject::Composite { xrs };
                self.nested = read_nested(&inputs.nested_compositions)?;
                let Some(functions) = inputs.functions.clone() else {
                    return Err(ComposeError::NoFunctions {
                        path: composition_path.clone(),
                    });
                };
                Ok(Some((Some(functions), steps)))
            }
        }
    }
}

/// One XR read from `path` for the Composition in `composition_path`
/// (a claim converted to the XR Crossplane creates for it, the XRD's
/// defaults applied for a Pipeline Composition), with the Composition and
/// the XR's schema. Its observed resources are given later.
pub(super) fn composite_xr(
    xrd: Option<&Path>,
    path: &Path,
    object: Value,
    composition_path: &Path,
    composition_object: &Value,
    claim: bool,
) -> Result<CompositeXr, ComposeError> {
    let (composite_api, composite_kind) = Composition::composite_type(composition_object);
    let composite_type = (composite_api.to_string(), composite_kind.to_string());
    // The XRD, read whole before the XR: it is what says a namespaced
    // object of another kind is a claim.
    let xrd = xrd
        .map(|path| Ok::<_, ComposeError>((path, Xrd::read(path)?)))
        .transpose()?;
    // A claim is rendered as the XR Crossplane creates for it; an object of
    // another kind is one only when the XRD's `spec.claimNames` (or the
    // caller, `claim`) says so, never by guess: a namespaced XR of the
    // wrong kind would otherwise render as a plausible, wrong XR.
    let kind = get_str(&object, &["kind"]).unwrap_or_default().to_string();
    let api = get_str(&object, &["apiVersion"])
        .unwrap_or_default()
        .to_string();
    let claim_kind = if claim::is_claim_of(&object, (&composite_type.0, &composite_type.1)) {
        let named = xrd.as_ref().and_then(|(_, x)| x.claim_kind()) == Some(kind.as_str());
        if !(named || claim) {
            let hint = match &xrd {
                Some(_) => "the XRD given names no such claim (spec.claimNames.kind)",
                None => {
                    "if it is a claim, give the XRD (--xrd) whose spec.claimNames.kind names it"
                }
            };
            return Err(usage(
                path,
                &format!(
                    "the XR input is {} {api} {kind}, but the Composition {} composes {} {} \
                     (spec.compositeTypeRef); {hint}",
                    super::article(&api),
                    composition_path.display(),
                    composite_type.0,
                    composite_type.1,
                ),
            ));
        }
        Some(kind)
    } else {
        None
    };
    let object = match &claim_kind {
        Some(kind) => {
            tracing::info!(
                claim = kind,
                xr = composite_type.1,
                "rendering the claim as the XR Crossplane creates for it"
            );
            claim::composite_of(&object, (&composite_type.0, &composite_type.1))
        }
        None => object,
    };
    let composite = Composite::from_object(path, object)?;
    let composition =
        Composition::from_object(composition_path, composition_object.clone(), &composite)?;
    let mut xr = composite.object.clone();
    let xrd = match (xrd, &composition.pipeline) {
        (Some((path, xrd)), Pipeline::V1(_)) => {
            xrd.check_defines(path, &composite)?;
            Some((path, xrd))
        }
        _ => None,
    };
    // Claims exist only for Legacy (v1 LegacyCluster) XRs.
    let schema = match (&xrd, &claim_kind) {
        (Some((_, x)), _) => x.schema,
        (None, Some(_)) => XrSchema::Legacy,
        (None, None) => XrSchema::default(),
    };
    if let Some((path, xrd)) = &xrd {
        check_scope(path, xrd, &xr)?;
        xrd.apply_defaults(&mut xr, path)?;
    }
    // What `-x` merges the output into: the XR as given with the XRD's
    // defaults, as the CLI (`ApplyXRDDefaults`, then the merge) and as the
    // API server would hold it.
    Ok(CompositeXr {
        composition,
        schema,
        input_xr: xr.clone(),
        xr,
        observed: Vec::new(),
    })
}

/// The `--nested-composition` files: each a mode Pipeline Composition,
/// with its steps (whose Functions must be given, as the XR's).
fn read_nested(
    paths: &[PathBuf],
) -> Result<Vec<(PathBuf, Value, Vec<PipelineStep>)>, ComposeError> {
    let mut nested = Vec::new();
    for path in paths {
        let object = read_one(path)?;
        let (api_version, kind) = Composition::composite_type(&object);
        // Checked against an XR of the very type it composes: the
        // Composition's own checks, before any XR of it exists.
        let sample = Composite::from_object(
            path,
            json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "nested"}}),
        )?;
        let composition = Composition::from_object(path, object.clone(), &sample)?;
        let Pipeline::V1(steps) = composition.pipeline else {
            return Err(usage(
                path,
                "a nested XR's Composition must be mode Pipeline",
            ));
        };
        nested.push((path.clone(), object, steps));
    }
    Ok(nested)
}

/// Gives each XR its observed resources from `-o`: all of them to a
/// single XR (which then checks them as Crossplane's reconciler would);
/// with several XRs, each resource to the XR its controller reference
/// names (by uid, or by kind and name where the XR has no uid yet), and a
/// resource no XR controls is refused.
fn distribute_observed(
    path: &Path,
    xrs: &mut [CompositeXr],
    observed: Vec<(String, Value)>,
) -> Result<(), ComposeError> {
    if let [xr] = xrs {
        xr.observed = observed;
        return Ok(());
    }
    for (name, object) in observed {
        let controller = controller_ref(&object).cloned();
        let owner = controller.as_ref().and_then(|c| {
            xrs.iter_mut()
                .find(|xr| get_str(c, &["uid"]) == Some(xr_uid(&xr.xr).as_str()))
        });
        let Some(owner) = owner else {
            return Err(usage(
                path,
                &format!(
                    "observed resource {name} is controlled by none of the XRs; with several \
                     XRs each observed resource needs the controller reference of its XR"
                ),
            ));
        };
        owner.observed.push((name, object));
    }
    Ok(())
}

pub(super) fn usage(path: &Path, message: &str) -> ComposeError {
    ComposeError::Invalid {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn read_all(paths: &[PathBuf]) -> Result<Vec<Value>, ComposeError> {
    let mut objects = Vec::new();
    for path in paths {
        objects.extend(read_objects(path)?);
    }
    Ok(objects)
}

/// A namespaced XR for a `Namespaced` XRD, a cluster-scoped one otherwise.
fn check_scope(path: &Path, xrd: &Xrd, xr: &Value) -> Result<(), ComposeError> {
    let namespaced = get_str(xr, &["metadata", "namespace"]).is_some_and(|n| !n.is_empty());
    match (xrd.scope(), namespaced) {
        ("Namespaced", false) => Err(usage(
            path,
            "the XRD's XRs are Namespaced, but the XR has no metadata.namespace",
        )),
        (scope, true) if scope != "Namespaced" => Err(usage(
            path,
            &format!(
                "the XRD's XRs are {scope} (cluster-scoped), but the XR has a metadata.namespace"
            ),
        )),
        _ => Ok(()),
    }
}

/// The XR's uid: its own, or the stable one the render gives an XR
/// without one (as Crossplane's renderer).
fn xr_uid(xr: &Value) -> String {
    if let Some(uid) = get_str(xr, &["metadata", "uid"]).filter(|u| !u.is_empty()) {
        return uid.to_string();
    }
    let text = |path: &[&str]| get_str(xr, path).unwrap_or_default().to_string();
    names::xr_uid(
        &text(&["apiVersion"]),
        &text(&["kind"]),
        &text(&["metadata", "namespace"]),
        &text(&["metadata", "name"]),
    )
}

/// What Crossplane's reconciler sets on the XR before the pipeline sees
/// it: a uid (a stable one, as Crossplane's renderer), the composite
/// label composed resources are named after, the composition (revision)
/// reference, and references to the observed composed resources.
pub(super) fn configure(composite: &mut CompositeXr) {
    let CompositeXr {
        composition,
        schema,
        xr,
        observed,
        ..
    } = composite;
    let schema = *schema;
    let text = |path: &[&str]| get_str(xr, path).unwrap_or_default().to_string();
    let (namespace, name) = (
        text(&["metadata", "namespace"]),
        text(&["metadata", "name"]),
    );
    let uid = xr_uid(xr);
    object_at(xr, &["metadata"]).insert("uid".into(), json!(uid));
    object_at(xr, &["metadata", "labels"])
        .entry(COMPOSITE_LABEL)
        .or_insert_with(|| json!(name));
    let path = schema.spec_path("compositionRef");
    object_at(xr, &path[..path.len() - 1])
        .insert("compositionRef".into(), json!({ "name": composition.name }));
    if let Some(revision) = &composition.revision {
        object_at(xr, &path[..path.len() - 1])
            .insert("compositionRevisionRef".into(), json!({ "name": revision }));
    }
    if !observed.is_empty() {
        let refs: Vec<Value> = observed
            .iter()
            .map(|(_, o)| {
                let mut r = json!({
                    "apiVersion": get_str(o, &["apiVersion"]).unwrap_or_default(),
                    "kind": get_str(o, &["kind"]).unwrap_or_default(),
                    "name": get_str(o, &["metadata", "name"]).unwrap_or_default(),
                });
                if let Some(ns) =
                    get_str(o, &["metadata", "namespace"]).filter(|_| namespace.is_empty())
                {
                    r["namespace"] = json!(ns);
                }
                r
            })
            .collect();
        let path = schema.spec_path("resourceRefs");
        object_at(xr, &path[..path.len() - 1]).insert("resourceRefs".into(), Value::Array(refs));
    }
}

/// Observed resources Crossplane's reconciler would read: controlled by
/// the XR (or by nothing), in a namespaced XR's namespace.
fn check_observed(
    path: &Path,
    xr: &Value,
    observed: &[(String, Value)],
) -> Result<(), ComposeError> {
    let uid = get_str(xr, &["metadata", "uid"]).unwrap_or_default();
    let namespace = get_str(xr, &["metadata", "namespace"]).unwrap_or_default();
    let mut problems = Vec::new();
    for (_, o) in observed {
        let name = get_str(o, &["metadata", "name"]).unwrap_or_default();
        let controller = controller_ref(o);
        if controller.is_some_and(|c| get_str(c, &["uid"]).unwrap_or_default() != uid) {
            problems.push(format!(
                "observed resource {name} has a controller ref but is not controlled by the XR"
            ));
        }
        if !namespace.is_empty()
            && get_str(o, &["metadata", "namespace"]).unwrap_or_default() != namespace
        {
            problems.push(format!(
                "observed resource {name} is not in the same namespace as the XR"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(usage(
            path,
            &format!("invalid observed resources: {}", problems.join("; ")),
        ))
    }
}

/// The context from `--context-files` (JSON or YAML files) and
/// `--context-values` (JSON or YAML; these win), their `key=value`
/// entries parsed by the CLI.
fn initial_context(
    files: &[(String, PathBuf)],
    values: &[(String, String)],
) -> Result<Option<Value>, ComposeError> {
    if files.is_empty() && values.is_empty() {
        return Ok(None);
    }
    let mut fields = serde_json::Map::new();
    for (key, file) in files {
        let text = std::fs::read_to_string(file).map_err(|source| ComposeError::Read {
            path: file.clone(),
            source,
        })?;
        // A context value need not be an object: any JSON or YAML, its
        // nesting bounded before it is parsed.
        fields.insert(key.clone(), parse_value(file, &text)?);
    }
    for (key, text) in values {
        let value = parse_value(Path::new("--context-values"), text).map_err(|e| match e {
            ComposeError::Invalid { message, .. } => ComposeError::Invalid {
                path: PathBuf::from("--context-values"),
                message: format!("{key}={text}: {message}"),
            },
            other => other,
        })?;
        fields.insert(key.clone(), value);
    }
    Ok(Some(Value::Object(fields)))
}

/// An object's controller reference (`metadata.ownerReferences[]` with
/// `controller: true`), if it has one.
fn controller_ref(object: &Value) -> Option<&Value> {
    object
        .get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .and_then(|refs| {
            refs.iter()
                .find(|r| r.get("controller") == Some(&json!(true)))
        })
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_values_are_read_as_json_or_yaml_text() {
        let entry = |k: &str, v: &str| (k.to_string(), v.to_string());
        let values = [
            entry("n", "3"),
            entry("s", "hello"),
            entry("o", "{\"a\": true}"),
        ];
        let context = initial_context(&[], &values).unwrap().unwrap();
        assert_eq!(context, json!({"n": 3, "s": "hello", "o": {"a": true}}));
        assert_eq!(initial_context(&[], &[]).unwrap(), None);
    }

    const COMPOSITION: &str = "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata: {name: c}
spec:
  compositeTypeRef: {apiVersion: example.org/v1, kind: XBucket}
  mode: Pipeline
  pipeline:
  - step: s
    functionRef: {name: f}
";
    const FUNCTIONS: &str =
        "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata: {name: f}\nspec: {package: x}\n";

    /// Reads `xr` (and the Composition and Functions above) as `xfn render
    /// xr.yaml composition.yaml functions.yaml` would, with `--xrd` if given.
    fn read_with(xr: &str, xrd: Option<&str>, claim: bool) -> Result<Read, String> {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let inputs = RenderInputs {
            xr_or_operation: write("xr.yaml", xr),
            composition_or_functions: Some(write("composition.yaml", COMPOSITION)),
            functions: Some(write("functions.yaml", FUNCTIONS)),
            xrd: xrd.map(|x| write("xrd.yaml", x)),
            claim,
            ..Default::default()
        };
        Read::from_inputs(&inputs).map_err(|e| crate::chain::one_line(&e))
    }

    #[test]
    fn an_observed_resource_with_no_name_is_not_observed_as_crossplane_skips_it() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let observed = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: named\n  \
             annotations: {crossplane.io/composition-resource-name: a}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  \
             annotations: {crossplane.io/composition-resource-name: b}\n";
        let inputs = RenderInputs {
            xr_or_operation: write(
                "xr.yaml",
                "apiVersion: example.org/v1\nkind: XBucket\nmetadata: {name: x}\n",
            ),
            composition_or_functions: Some(write("composition.yaml", COMPOSITION)),
            functions: Some(write("functions.yaml", FUNCTIONS)),
            observed_resources: Some(write("observed.yaml", observed)),
            ..Default::default()
        };
        let read = Read::from_inputs(&inputs).unwrap();
        let Subject::Composite { xrs } = &read.subject else {
            panic!("a composite render")
        };
        let names: Vec<&str> = xrs[0].observed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a"]);
    }

    const BUCKET_CLAIM: &str =
        "apiVersion: example.org/v1\nkind: Bucket\nmetadata: {name: mine, namespace: team-a}\n";

    #[test]
    fn a_namespaced_xr_of_another_kind_is_refused_naming_both_kinds_unless_it_is_a_claim() {
        let err = read_with(BUCKET_CLAIM, None, false).err().unwrap();
        assert!(
            err.contains("the XR input is an example.org/v1 Bucket")
                && err.contains("composes example.org/v1 XBucket (spec.compositeTypeRef)")
                && err.contains("give the XRD (--xrd)"),
            "{err}"
        );
        // An XRD that names it as its claim, or the caller, makes it one.
        let xrd = "apiVersion: apiextensions.crossplane.io/v1
kind: CompositeResourceDefinition
metadata: {name: xbuckets.example.org}
spec:
  group: example.org
  names: {kind: XBucket, plural: xbuckets}
  claimNames: {kind: Bucket, plural: buckets}
  versions: [{name: v1, served: true, referenceable: true}]
";
        assert!(read_with(BUCKET_CLAIM, Some(xrd), false).is_ok());
        assert!(read_with(BUCKET_CLAIM, None, true).is_ok());
        let other = xrd.replace("  claimNames: {kind: Bucket, plural: buckets}\n", "");
        let err = read_with(BUCKET_CLAIM, Some(&other), false).err().unwrap();
        assert!(err.contains("the XRD given names no such claim"), "{err}");
    }

    #[test]
    fn an_error_in_one_xr_of_several_names_the_document() {
        let xrs = "apiVersion: example.org/v1\nkind: XBucket\nmetadata: {name: a}\n---\n\
                   apiVersion: example.org/v1\nkind: XQueue\nmetadata: {name: b}\n";
        let err = read_with(xrs, None, false).err().unwrap();
        assert!(
            err.contains("xr.yaml: document 2 of 2 (example.org/v1 XQueue \"b\")")
                && err.contains("but the XR is an example.org/v1 XQueue"),
            "{err}"
        );
    }

    #[test]
    fn files_given_out_of_order_are_named_with_the_order() {
        let err = read_with(COMPOSITION, None, false).err().unwrap();
        assert!(
            err.contains("xr.yaml: holds a Composition, given as the XR: an XR render takes XR COMPOSITION [FUNCTIONS], in that order"),
            "{err}"
        );
        let err = read_with(FUNCTIONS, None, false).err().unwrap();
        assert!(err.contains("holds a Function, given as the XR"), "{err}");
    }

    #[test]
    fn articles_read_as_english() {
        assert_eq!(crate::compose::article("apiextensions.crossplane.io"), "an");
        assert_eq!(crate::compose::article("Composition"), "a");
        assert_eq!(crate::compose::article("XBucket"), "an");
        assert_eq!(crate::compose::article("Xylophone"), "a");
    }
}
