//! The composition core: runs a Composition's function pipeline locally and
//! produces what Crossplane would compose, for `xfn render`, in four
//! stages, a folder each (the plan reads no input file; read runs nothing):
//!
//! - [`read`]: every input read and checked once into one `Read`, through
//!   `files` (files and directories) and `model` (the XR, Composition,
//!   Functions, observed resources), with `xrd` (`--xrd`), `schemas`
//!   (`-s`), `operation` (Operations) and `claim` (a claim given as the XR).
//! - [`plan`]: the runtimes (and so the namespaces) a render needs; starts,
//!   reuses and stops function servers; renders XRs and the nested XRs they
//!   compose, Operations alike.
//! - [`run`]: `v1` (`mode: Pipeline`) and `alpha` (`spec.functions[]`)
//!   pipelines, over `runtimes`: the real runner, a running function
//!   server or the runner daemon.
//! - [`print`](mod@print): `output`, the YAML stream `crossplane render` prints, with
//!   the metadata `names` gives composed resources, in `yaml11`.
//!
//! Imports run one way: plan uses read, run and print; run and print use
//! read's model; read uses no later stage but print's names and output
//! options. [`crate::value`] (JSON helpers) sits under all four. No CLI lives
//! here, nor any flag syntax: `src/cli/render.rs` (and `cli/map_flag.rs`)
//! map flags onto [`read::RenderInputs`].
//!
//! The front door: callers outside (`xfn render`, `xfn test`) name only
//! what is re-exported here, `crate::compose::{…}`, never a stage's module:
//! the plan ([`RenderPlan`]: read, needs, render), the function callers a
//! caller may share between renders, and the YAML files and streams of
//! the read and print stages.
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

pub(crate) mod names;
pub(crate) mod plan;
pub(crate) mod print;
pub(crate) mod read;
pub(crate) mod run;

pub(crate) use plan::{Needs, RenderPlan};
pub(crate) use print::output::to_yaml_stream;
pub(crate) use read::files::{parse_stream, read_objects, read_one};
pub(crate) use read::model::Function;
pub(crate) use read::RenderInputs;
pub(crate) use run::runtimes::kept::{self, KeeperCommand};
pub(crate) use run::runtimes::{
    runtime_for, ContainerDefaults, ContainerSteps, Runtime, RuntimeMap,
};

/// What to print besides the XR and the composed resources.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OutputOptions {
    /// `-x` (composition) / `--include-full-operation`: the whole input
    /// object, not just its identity and status.
    pub(crate) include_full: bool,
    /// `-r`: the results.
    pub(crate) include_results: bool,
    /// `-c`: the context.
    pub(crate) include_context: bool,
    /// `--include-deleted-resources` (xfn): the observed composed
    /// resources Crossplane would garbage collect, as Crossplane's renderer's
    /// `deleted_resources`.
    pub(crate) include_deleted: bool,
    /// `--include-requirements` (xfn): what the pipeline required, as the
    /// Crossplane's renderer's `required_resources` and `required_schemas`.
    pub(crate) include_requirements: bool,
}

/// Errors of the composition core. File errors name the file, step errors
/// the step; each says its own step, and what failed beneath is its typed
/// source (a person reads the chain: `crate::chain`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ComposeError {
    /// A file cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file's content is invalid.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A file nests deeper, or its aliases expand further, than xfn reads
    /// (`crate::nesting`).
    #[error("{path}")]
    OutOfBounds {
        /// The file.
        path: PathBuf,
        /// Which bound.
        source: crate::nesting::NestingError,
    },
    /// A file is not the YAML (or JSON) it must be.
    #[error("{path}: {what}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// What it is not (`invalid YAML`).
        what: &'static str,
        /// Why.
        source: yaml_serde::Error,
    },
    /// A field of a file's object does not parse as what it must hold.
    #[error("{path}: {field}")]
    Field {
        /// The file.
        path: PathBuf,
        /// The field (`spec.pipeline`).
        field: &'static str,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// One object of a file of several is refused.
    #[error("{path}: document {index} of {count} ({what})")]
    InDocument {
        /// The file.
        path: PathBuf,
        /// The document's place in the file, from 1.
        index: usize,
        /// How many objects the file holds.
        count: usize,
        /// The object's kind and name.
        what: String,
        /// Why it is refused.
        #[source]
        source: Box<ComposeError>,
    },
    /// A file holds the wrong kind of object.
    #[error("{path}: expected {} {expected}, found {found:?}", article(.expected))]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// What was expected.
        expected: String,
        /// What was found (`apiVersion kind`).
        found: String,
    },
    /// The Composition composes another type than the XR's.
    #[error("{path}: the Composition composes {composes}, but the XR is {} {xr}", article(.xr))]
    TypeMismatch {
        /// The Composition file.
        path: PathBuf,
        /// Its `compositeTypeRef`.
        composes: String,
        /// The XR's type.
        xr: String,
    },
    /// A mode Pipeline Composition is given no Functions (`xfn test` says
    /// which input is missing instead).
    #[error(
        "{path}: a mode Pipeline Composition needs FUNCTIONS (a file or directory of Functions)"
    )]
    NoFunctions {
        /// The Composition file.
        path: PathBuf,
    },
    /// A pipeline step names a Function not given.
    #[error("pipeline step {step:?} references unknown Function {function:?} (known: {known})")]
    UnknownFunction {
        /// The step.
        step: String,
        /// The Function it names.
        function: String,
        /// The Functions given.
        known: String,
    },
    /// A step cannot run as written (its credentials, its container
    /// spec), or its requirements never settled.
    #[error("pipeline step {step:?} failed: {message}")]
    StepFailed {
        /// The step.
        step: String,
        /// What is wrong, in words.
        message: String,
    },
    /// A step's requirements kept changing for every call core allows.
    #[error(
        "{what} {step:?}: requirements didn't stabilize after the maximum number of iterations ({max})"
    )]
    RequirementsUnstable {
        /// Core's wording of the step: Composition or Operation.
        what: &'static str,
        /// The step.
        step: String,
        /// The iterations allowed.
        max: usize,
    },
    /// A step failed: calling its function, or reading what it returned.
    #[error("pipeline step {step:?} failed")]
    Step {
        /// The step.
        step: String,
        /// Why.
        source: Box<ComposeError>,
    },
    /// A step returned a Fatal result.
    #[error("pipeline step {step:?} returned a fatal result: {message}")]
    Fatal {
        /// The step.
        step: String,
        /// The result's message.
        message: String,
    },
    /// Calling a function failed.
    #[error("calling {target}")]
    Call {
        /// The function's image, server address or daemon endpoint.
        target: String,
        /// Why (boxed: a run's error is large, and every compose result
        /// carries this enum).
        source: Box<CallError>,
    },
    /// Converting a message to or from a function failed.
    #[error(transparent)]
    Protocol(#[from] crate::proto_json::ProtocolError),
    /// A Function cannot be run as given (no package, a bad pull policy).
    #[error("Function {function:?}: {message}")]
    FunctionInvalid {
        /// The Function.
        function: String,
        /// What is wrong.
        message: String,
    },
    /// A Function's pull policy annotation is not one xfn knows.
    #[error("Function {function:?}")]
    FunctionPullPolicy {
        /// The Function.
        function: String,
        /// The policy it names.
        source: crate::image::UnknownPullPolicy,
    },
    /// A Function's server could not be started (`Docker` runtime).
    #[error("Function {function:?}: cannot start its image {image} as a function server")]
    FunctionStart {
        /// The Function.
        function: String,
        /// Its image.
        image: String,
        /// Why (boxed, as [`ComposeError::Call`]'s).
        source: Box<StartError>,
    },
    /// Composing failed as Crossplane's reconcile would (an invalid
    /// composed resource name, observed resources it would not read).
    #[error("cannot compose resources: {0}")]
    Compose(String),
    /// The output cannot be written as YAML.
    #[error("cannot write the output as YAML")]
    OutputYaml(#[source] yaml_serde::Error),
    /// The output cannot be written as JSON.
    #[error("cannot write the output as JSON")]
    OutputJson(#[source] serde_json::Error),
}

/// "a" or "an" before `word`, as English reads it aloud (`an
/// apiextensions…`, `a Composition`, `an XBucket`).
pub(crate) fn article(word: &str) -> &'static str {
    let mut chars = word.chars();
    match (chars.next(), chars.next()) {
        (Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U'), _) => "an",
        // An XR kind's X is read as the letter ("an XBucket").
        (Some('X'), Some(c)) if c.is_ascii_uppercase() => "an",
        _ => "a",
    }
}

impl ComposeError {
    /// Names the document `index` (from 0) of `count` in `path` that
    /// `object` came from, where the file holds several.
    pub(crate) fn in_document(
        self,
        path: &std::path::Path,
        index: usize,
        count: usize,
        object: &Value,
    ) -> Self {
        if count < 2 {
            return self;
        }
        let field = |name: &str| {
            crate::value::get_str(object, &[name])
                .unwrap_or_default()
                .to_string()
        };
        let name = crate::value::get_str(object, &["metadata", "name"]).unwrap_or_default();
        ComposeError::InDocument {
            path: path.to_path_buf(),
            index: index + 1,
            count,
            what: format!("{} {} {name:?}", field("apiVersion"), field("kind")),
            source: Box::new(self),
        }
    }
}

/// Why calling a Function failed: the source of [`ComposeError::Call`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// Its container run failed (the image, its exit code and stderr, its
    /// limits).
    #[error(transparent)]
    Run(#[from] crate::runner::RunError),
    /// Its call failed with a status: its server's (or the runner
    /// daemon's) answer, or what the seam's backend said of its run (a
    /// container's exit, a function server's death).
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// Nothing answers where it should.
    #[error(
        "cannot connect after waiting {:.1} s: check that the function is running at \
         that address (--development-wait waits longer for one still starting)",
        .waited.as_secs_f64()
    )]
    Connect {
        /// How long render tried.
        waited: std::time::Duration,
        /// The last attempt's error.
        #[source]
        source: tonic::Status,
    },
    /// There is nowhere to run it.
    #[error("no runner daemon answers at {endpoint} and there is no in-process runner")]
    NoRunner {
        /// Where a daemon was looked for.
        endpoint: String,
    },
    /// Its request or response could not be converted.
    #[error(transparent)]
    Protocol(#[from] crate::proto_json::ProtocolError),
    /// Its step's pull policy is not one xfn knows.
    #[error(transparent)]
    PullPolicy(#[from] crate::image::UnknownPullPolicy),
    /// Its step's network policy is not one xfn knows.
    #[error(transparent)]
    NetworkPolicy(#[from] crate::runner::UnknownNetworkPolicy),
    /// Its step's cpu or memory limit does not parse.
    #[error("invalid run configuration")]
    Limits(#[source] crate::quantity::QuantityError),
}

/// Why a Function's server could not be started: the source of
/// [`ComposeError::FunctionStart`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// Its function server could not be run, exited or never listened.
    #[error(transparent)]
    Server(#[from] crate::function_server::ServerError),
    /// A file or directory of its kept server could not be made.
    #[error("cannot {what} {path}")]
    Io {
        /// What was being done (`create`, `lock`).
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Its kept server's info could not be encoded.
    #[error("cannot encode its kept server's info")]
    Info(#[source] serde_json::Error),
    /// It failed in a way said in words (its keeper exited, with its log's
    /// tail; a socket path too long).
    #[error("{0}")]
    Failed(String),
}

/// What was observed: the XR and its composed resources by name.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// The XR as given.
    pub(crate) composite: Value,
    /// Observed composed resources: (composition resource name, object).
    pub(crate) resources: Vec<(String, Value)>,
}

impl Observed {
    /// The observed composed resource called `name`.
    pub(crate) fn resource(&self, name: &str) -> Option<&Value> {
        self.resources
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, object)| object)
    }
}

/// Readiness of a desired composed resource, as the function said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Ready.
    True,
    /// Not ready.
    False,
    /// The function did not say: ready when its observed `Ready` condition is True.
    Unspecified,
}

/// One desired composed resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ComposedResource {
    /// The object as the pipeline desires it.
    pub(crate) object: Value,
    /// Its readiness.
    pub(crate) ready: Readiness,
}

/// A result a step returned, attributed to the step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepResult {
    /// The step that returned it.
    pub(crate) step: String,
    /// Its severity.
    pub(crate) severity: crate::proto::v1::Severity,
    /// Its message.
    pub(crate) message: String,
    /// Its reason, if any.
    pub(crate) reason: Option<String>,
}

/// A condition a step set on the XR.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct XrCondition {
    /// `type`.
    pub(crate) kind: String,
    /// `True`, `False` or `Unknown`.
    pub(crate) status: String,
    /// `reason`.
    pub(crate) reason: String,
    /// `message`.
    pub(crate) message: Option<String>,
}

/// What a pipeline produced.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    /// The desired XR (typically only its status), if a step set one.
    pub(crate) desired_composite: Option<Value>,
    /// Desired composed resources by name (sorted).
    pub(crate) resources: BTreeMap<String, ComposedResource>,
    /// Every non-fatal result, in order.
    pub(crate) results: Vec<StepResult>,
    /// Conditions steps set on the XR.
    pub(crate) conditions: Vec<XrCondition>,
    /// The context after the last step.
    pub(crate) context: Option<Value>,
    /// The fatal result that ended the pipeline, if one did; everything
    /// above is then what came before it.
    pub(crate) fatal: Option<StepResult>,
    /// Each step's `output` (Operations), in order.
    pub(crate) outputs: Vec<(String, Value)>,
    /// The XR's readiness, when the pipeline set it explicitly.
    pub(crate) composite_ready: Option<bool>,
    /// What the steps' last calls required (protobuf JSON
    /// `ResourceSelector`s), once each: Crossplane's renderer's `required_resources`.
    pub(crate) required_resources: Vec<Value>,
    /// The schemas they required (`SchemaSelector`s).
    pub(crate) required_schemas: Vec<Value>,
}
