//! The sandbox: user namespace entry, cgroup detection, OCI spec building and
//! crun invocation.
//!
//! [`userns::enter`] runs once per process before any thread starts;
//! [`Sandbox`] then runs any number of containers concurrently, each from a
//! prepared root filesystem.
pub mod bundle;
pub mod cgroup;
pub mod crun;
pub mod quantity;
pub mod spec;
pub mod user;
pub mod userns;

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use oci_spec::image::Config as ImageConfig;

pub use bundle::{Bundle, RunDir};
pub use crun::{Crun, CrunError, CrunOutput, RunLimits};
pub use spec::{Limits, SpecError};

/// The default cap on stdout and on stderr of a run: 100 MiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 100 << 20;

/// Errors of the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Runs need xfn's user namespace, entered at start.
    #[error(
        "xfn has not entered its user namespace; functions can only run after `userns::enter`"
    )]
    NotInNamespace,
    /// Limits are required but cannot be enforced here.
    #[error("resource limits are required (--require-limits) but not enforced: {0}")]
    LimitsUnavailable(String),
    /// The spec could not be built from the image.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The bundle could not be written.
    #[error(transparent)]
    Bundle(#[from] bundle::BundleError),
    /// The container run failed.
    #[error(transparent)]
    Crun(#[from] CrunError),
}

/// How the sandbox runs containers.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// The crun binary.
    pub runtime: PathBuf,
    /// `<cache>/run`: bundles and crun state.
    pub run_dir: PathBuf,
    /// Cap on stdout and on stderr, each.
    pub max_output_bytes: usize,
    /// Refuse runs when limits are not enforced.
    pub require_limits: bool,
}

/// One run's inputs besides the bundle.
#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    /// The prepared, per-run root filesystem.
    pub rootfs: &'a Path,
    /// The image config's `config` section.
    pub image: Option<&'a ImageConfig>,
    /// stdin of the function.
    pub input: &'a [u8],
    /// Kill after this long.
    pub timeout: Duration,
    /// Share xfn's network (NetworkPolicy::Runner).
    pub host_network: bool,
    /// cpu and memory limits.
    pub limits: Limits,
}

/// Runs containers; shared by every call.
#[derive(Debug)]
pub struct Sandbox {
    crun: Crun,
    run_dir: RunDir,
    options: SandboxOptions,
    limits_unavailable: Option<String>,
}

static LIMITS_WARNING: Once = Once::new();

impl Sandbox {
    /// A sandbox in the namespace xfn entered. Sweeps what a dead xfn left in
    /// the run dir.
    pub fn new(options: SandboxOptions) -> Result<Self, SandboxError> {
        let namespace = userns::current().ok_or(SandboxError::NotInNamespace)?;
        let run_dir = RunDir::open(&options.run_dir)?;
        let crun = Crun {
            binary: options.runtime.clone(),
            state_root: run_dir.crun_state(),
        };
        crun.delete_stale(bundle::is_stale);
        // Limits go through cgroups, which crun is not given yet (its cgroup
        // manager is disabled), so they are not enforced on any host today.
        let limits_unavailable = Some(namespace.cgroups.why_no_limits());
        Ok(Self {
            crun,
            run_dir,
            options,
            limits_unavailable,
        })
    }

    /// Builds the spec, writes the bundle and runs the container; the bundle
    /// and crun's state are gone when this returns or is dropped.
    pub async fn run(&self, request: &RunRequest<'_>) -> Result<CrunOutput, SandboxError> {
        self.check_limits()?;
        if let (Some(why), true) = (
            &self.limits_unavailable,
            request.limits != Limits::default(),
        ) {
            // Once per process, not per run: a daemon must not flood its log.
            LIMITS_WARNING.call_once(|| {
                tracing::warn!("cpu and memory limits are NOT enforced: {why}");
            });
        }
        let bundle = self.run_dir.bundle()?;
        let spec = spec::build(&spec::SpecInput {
            rootfs: request.rootfs,
            image: request.image,
            host_network: request.host_network,
            limits: request.limits,
            hostname: "function",
        })?;
        bundle.write_spec(&spec)?;
        let output = self
            .crun
            .run(
                &bundle.id,
                &bundle.dir,
                request.input,
                RunLimits {
                    timeout: request.timeout,
                    max_output_bytes: self.options.max_output_bytes,
                },
            )
            .await?;
        drop(bundle);
        Ok(output)
    }

    /// Fails when limits are required but not enforced.
    pub fn check_limits(&self) -> Result<(), SandboxError> {
        match (self.options.require_limits, &self.limits_unavailable) {
            (true, Some(why)) => Err(SandboxError::LimitsUnavailable(why.clone())),
            _ => Ok(()),
        }
    }

    /// Why cpu/memory/pids limits are not enforced, when they are not: for a
    /// daemon to report at start and in its metrics.
    pub fn limits_unavailable(&self) -> Option<&str> {
        self.limits_unavailable.as_deref()
    }
}
