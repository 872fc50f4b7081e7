//! The composition core: runs a Composition's function pipeline locally and
//! produces what Crossplane would compose, for `xfn render`.
//!
//! - [`plan`]: a render decided before anything runs: every input read and
//!   checked, the runtimes (and so the namespaces) it needs; it starts,
//!   reuses and stops function servers, and serves composition and
//!   operation renders alike.
//! - [`model`]: Crossplane's objects (the XR, Composition, Functions,
//!   observed resources), each checked as it is built; [`files`]: reading
//!   them from files and directories;
//!   [`xrd`] (`--xrd`), [`schemas`] (`-s`), [`operation`] (Operations),
//!   [`claim`] (a claim given as the XR).
//! - [`v1`]: `mode: Pipeline` Compositions, one `RunFunctionRequest` per step,
//!   through a [`v1::FunctionCaller`] per Function.
//! - [`alpha`]: `spec.functions[]` Compositions, one FunctionIO per step,
//!   through an [`alpha::AlphaStep`].
//! - [`runtimes`]: the callers and steps over the real runner, a running
//!   function server or the runner daemon.
//! - [`output`]: the YAML stream `crossplane render` prints, with the
//!   metadata [`names`] gives composed resources.
//!
//! No CLI lives here; `src/cli/render.rs` wires flags to this module.
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

pub mod alpha;
pub mod claim;
pub mod files;
pub mod json;
pub mod model;
pub mod names;
pub mod operation;
pub mod output;
pub mod plan;
pub mod runtimes;
pub mod schemas;
pub mod v1;
pub mod value;
pub mod xrd;

/// Errors of the composition core. File errors name the file, step errors
/// the step.
#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
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
    /// A file holds the wrong kind of object.
    #[error("{path}: expected a {expected}, found {found:?}")]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// What was expected.
        expected: String,
        /// What was found (`apiVersion kind`).
        found: String,
    },
    /// The Composition composes another type than the XR's.
    #[error("{path}: the Composition composes {composes}, but the XR is a {xr}")]
    TypeMismatch {
        /// The Composition file.
        path: PathBuf,
        /// Its `compositeTypeRef`.
        composes: String,
        /// The XR's type.
        xr: String,
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
    /// A step failed to run.
    #[error("pipeline step {step:?} failed: {message}")]
    StepFailed {
        /// The step.
        step: String,
        /// Why.
        message: String,
    },
    /// A step returned a Fatal result.
    #[error("pipeline step {step:?} returned a fatal result: {message}")]
    Fatal {
        /// The step.
        step: String,
        /// The result's message.
        message: String,
    },
    /// Calling a function failed: unreachable, a gRPC error, or its
    /// container run failed (with the tail of its stderr).
    #[error("{0}")]
    Call(String),
    /// Converting a message failed.
    #[error("protocol conversion: {0}")]
    Protocol(String),
    /// A Function cannot be run as given (no package, a bad pull policy).
    #[error("Function {function:?}: {message}")]
    FunctionInvalid {
        /// The Function.
        function: String,
        /// What is wrong.
        message: String,
    },
    /// A Function's server could not be started (`Docker` runtime).
    #[error(
        "Function {function:?}: cannot start its image {image} as a function server: {message}"
    )]
    FunctionStart {
        /// The Function.
        function: String,
        /// Its image.
        image: String,
        /// Why.
        message: String,
    },
    /// Composing failed as Crossplane's reconcile would (an invalid
    /// composed resource name, observed resources it would not read).
    #[error("cannot compose resources: {0}")]
    Compose(String),
    /// Output cannot be written.
    #[error("cannot write the output: {0}")]
    Output(String),
}

/// What was observed: the XR and its composed resources by name.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The XR as given.
    pub composite: Value,
    /// Observed composed resources: (composition resource name, object).
    pub resources: Vec<(String, Value)>,
}

impl Observed {
    /// The observed composed resource called `name`.
    pub fn resource(&self, name: &str) -> Option<&Value> {
        self.resources
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, object)| object)
    }
}

/// Readiness of a desired composed resource, as the function said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Ready.
    True,
    /// Not ready.
    False,
    /// The function did not say: ready when its observed `Ready` condition is True.
    Unspecified,
}

/// One desired composed resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ComposedResource {
    /// The object as the pipeline desires it.
    pub object: Value,
    /// Its readiness.
    pub ready: Readiness,
}

/// A result a step returned, attributed to the step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// The step that returned it.
    pub step: String,
    /// Its severity.
    pub severity: crate::proto::v1::Severity,
    /// Its message.
    pub message: String,
    /// Its reason, if any.
    pub reason: Option<String>,
}

/// A condition a step set on the XR.
#[derive(Debug, Clone, PartialEq)]
pub struct XrCondition {
    /// `type`.
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// `reason`.
    pub reason: String,
    /// `message`.
    pub message: Option<String>,
}

/// What a pipeline produced.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The desired XR (typically only its status), if a step set one.
    pub desired_composite: Option<Value>,
    /// Desired composed resources by name (sorted).
    pub resources: BTreeMap<String, ComposedResource>,
    /// Every non-fatal result, in order.
    pub results: Vec<StepResult>,
    /// Conditions steps set on the XR.
    pub conditions: Vec<XrCondition>,
    /// The context after the last step.
    pub context: Option<Value>,
    /// The fatal result that ended the pipeline, if one did; everything
    /// above is then what came before it.
    pub fatal: Option<StepResult>,
    /// Each step's `output` (Operations), in order.
    pub outputs: Vec<(String, Value)>,
    /// The XR's readiness, when the pipeline set it explicitly.
    pub composite_ready: Option<bool>,
    /// What the steps' last calls required (protobuf JSON
    /// `ResourceSelector`s), once each: the engine's `required_resources`.
    pub required_resources: Vec<Value>,
    /// The schemas they required (`SchemaSelector`s).
    pub required_schemas: Vec<Value>,
}
