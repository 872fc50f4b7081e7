//! `xfn test`: Composition test suites in xprin's format, run in one
//! process. Each test renders in-process through the composition core
//! (`crate::compose::RenderPlan`, the path `xfn render` takes), over function
//! servers [`servers::SharedServers`] starts once for every test that uses the
//! same Function; tests run concurrently, at most `-p N` at a time.
//!
//! - [`spec`]: suite files found, read and merged with `common`;
//! - [`template`]: `{{ .Repositories.* }}`, `{{ .Inputs.* }}`, `{{ .Outputs.* }}`,
//!   `{{ .Tests.ID.Outputs.* }}`, templates as typed values;
//! - [`run`]: one test's phases as xprin's code runs them (setup and
//!   pre-test hooks, patches, render, validation, assertions, post-test
//!   hooks, artifacts), inputs copied to the test's own temporary
//!   directory, hooks run in the suite file's;
//! - [`assert`](mod@assert): the `xprin`, `diff` and `dyff` checkers;
//! - [`report`]: Go's test output and JUnit; [`progress`]: the line redrawn
//!   on a terminal meanwhile; [`writes`]: the report and golden files,
//!   opened before xfn enters its user namespace; [`beneath`]: each of
//!   those a path beneath its root, opened following no symlink.
//!
//! Invariant: a check that did not run never reads as passed. Validation
//! against CRDs is a seam ([`Validate`]): `crate::schema::Validator` in `xfn test`,
//! fakes in unit tests.
use std::path::PathBuf;

pub(crate) mod assert;
pub(crate) mod beneath;
pub(crate) mod hooks;
pub(crate) mod progress;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod servers;
pub(crate) mod spec;
pub(crate) mod template;
pub(crate) mod writes;

/// Validates rendered objects against CRDs and XRDs (`crds:` inputs):
/// each error names the resource, the field path and the rule.
pub(crate) trait Validate {
    /// The errors of `rendered` against `crds`; none when valid.
    fn validate(&self, crds: &[serde_json::Value], rendered: &[serde_json::Value]) -> Vec<String>;
}

impl Validate for crate::schema::Validator {
    fn validate(&self, crds: &[serde_json::Value], rendered: &[serde_json::Value]) -> Vec<String> {
        crate::schema::Validator::validate(self, crds, rendered)
    }
}

/// Errors of reading suites: `xfn test` exits 2 on them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SuiteError {
    /// A suite file (or a path given) cannot be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A suite file is not YAML of xprin's format.
    #[error("{path}: not a test suite")]
    Yaml {
        path: PathBuf,
        source: yaml_serde::Error,
    },
    /// A suite file is invalid.
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// The configuration file (repositories) cannot be read.
    #[error("configuration {path}: {message}")]
    Config { path: PathBuf, message: String },
}
