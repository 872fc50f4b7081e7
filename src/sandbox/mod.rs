//! The sandbox: user namespace entry, cgroup detection, OCI spec building and
//! crun invocation.
//!
//! [`userns::enter`] runs once per process before any thread starts and
//! returns the [`userns::Namespace`] a [`Sandbox`] is made in; it then makes
//! any number of containers concurrently, each from a prepared root
//! filesystem. The mechanics live here (user namespaces, spec, bundle,
//! cgroup, seccomp, crun); a container's life (create, start, feed or
//! serve, teardown) is `crate::lifecycle`'s.
pub(crate) mod bundle;
pub(crate) mod cgroup;
pub(crate) mod crun;
pub(crate) mod exit_watch;
pub(crate) mod netns;
pub(crate) mod nproc;
pub(crate) mod oci_runtime;
pub(crate) mod reaper;
pub(crate) mod scope;
pub(crate) mod seccomp;
mod seccomp_bpf;
pub(crate) mod spec;
pub(crate) mod subids;
pub(crate) mod ucounts;
pub(crate) mod user;
pub(crate) mod userns;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

pub(crate) use bundle::{Bundle, RunDir};
pub(crate) use crun::{Crun, CrunError, CrunOutput};
pub use spec::Limits;
pub(crate) use spec::SpecError;

/// The default cap on stdout and on stderr of a run: 100 MiB.
pub(crate) const DEFAULT_MAX_OUTPUT_BYTES: usize = 100 << 20;

/// Errors of the sandbox. Each says its own step; what failed beneath is
/// its source (see `crate::chain`).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Limits are required but cannot be enforced here.
    #[error(transparent)]
    LimitsUnavailable(#[from] LimitsUnavailable),
    /// The spec could not be built from the image.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The bundle could not be written.
    #[error(transparent)]
    Bundle(#[from] bundle::BundleError),
    /// The container run failed.
    #[error(transparent)]
    Crun(#[from] CrunError),
    /// The OCI runtime is missing, not crun, or too old.
    #[error(transparent)]
    Runtime(#[from] oci_runtime::RuntimeError),
    /// The run's cgroup could not be set up.
    #[error(transparent)]
    Cgroup(#[from] cgroup::run::CgroupError),
    /// The kernel's OOM killer killed a process of the run.
    #[error(transparent)]
    MemoryLimitExceeded(#[from] MemoryLimitExceeded),
    /// A served container kept running but never listened where expected.
    #[error(transparent)]
    NotServing(#[from] NotServing),
    /// The run's own level of the process count could not be made.
    #[error(transparent)]
    ProcessCount(#[from] nproc::NprocError),
}

/// cpu/memory/pids limits are required (`--require-limits`) but this host
/// does not enforce them. Defined here, where it is found; the runner's
/// error carries it as it is.
#[derive(Debug, thiserror::Error)]
#[error("resource limits are required but not enforced: {why}")]
pub struct LimitsUnavailable {
    /// Why not (no delegated cgroup, a controller missing), as the cgroup
    /// probe found.
    pub why: String,
}

/// The kernel's OOM killer killed a process of the run: it went past its
/// memory limit. Defined here, where the cgroup tells; the runner's error
/// carries it as it is.
#[derive(Debug, thiserror::Error)]
#[error(
    "the function exceeded its memory limit of {} and was killed by the OOM killer (exit code {code}): {}",
    crate::quantity::format_bytes(*limit_bytes),
    crun::tail_text(stderr_tail)
)]
pub struct MemoryLimitExceeded {
    /// The limit, in bytes.
    pub limit_bytes: u64,
    /// The exit code the run ended with (137 when the function's own
    /// process was killed).
    pub code: i32,
    /// The last [`crun::STDERR_TAIL_BYTES`] of its stderr.
    pub stderr_tail: Vec<u8>,
}

/// A served container kept running but never listened where expected; its
/// source is why the last connection attempt failed.
#[derive(Debug, thiserror::Error)]
#[error(
    "the function did not listen on {address} within {after:?} (its output ends: {}); the last attempt to connect failed",
    String::from_utf8_lossy(output_tail).trim()
)]
pub struct NotServing {
    /// Where it should listen, inside its network namespace.
    pub address: std::net::SocketAddr,
    /// How long xfn waited.
    pub after: Duration,
    /// The last bytes of its stdout and stderr.
    pub output_tail: Vec<u8>,
    /// Why the last connection attempt failed.
    pub source: std::io::Error,
}

/// How the sandbox runs containers.
#[derive(Debug, Clone)]
pub(crate) struct SandboxOptions {
    /// The crun binary.
    pub(crate) runtime: PathBuf,
    /// `<cache>/run`: bundles and crun state.
    pub(crate) run_dir: PathBuf,
    /// Cap on stdout and on stderr, each.
    pub(crate) max_output_bytes: usize,
    /// Refuse runs when limits are not enforced.
    pub(crate) require_limits: bool,
    /// Most processes (and threads) a run may have at once: `pids.max`, or
    /// `RLIMIT_NPROC` where no cgroup enforces that.
    pub(crate) pids_limit: i64,
    /// This process's claim on the cache: names what runs leave behind, so
    /// a later xfn knows whose it is.
    pub(crate) instance: std::sync::Arc<crate::instance::Instance>,
    /// Size of each run's `/tmp`, in bytes.
    pub(crate) tmp_size_bytes: u64,
    /// Keep this xfn's run state in a tmpfs of its mount namespace
    /// (`bundle.rs`): only where its containers end with it.
    pub(crate) state_in_memory: bool,
}

/// What a container is made from: everything of a run but its input and
/// timeout, which come with the call.
#[derive(Debug, Clone)]
pub(crate) struct ContainerRequest<'a> {
    /// The prepared, per-container root filesystem; it must outlive the
    /// container.
    pub(crate) rootfs: &'a Path,
    /// The image config's `config` section.
    pub(crate) image: Option<&'a oci_spec::image::Config>,
    /// Share xfn's network (NetworkPolicy::Runner) instead of an empty
    /// network namespace of its own.
    pub(crate) host_network: bool,
    /// cpu, memory and pids limits (pids, where unset: the sandbox's
    /// `pids_limit`).
    pub(crate) limits: Limits,
    /// Replaces the image's `Cmd` (its entrypoint stays): how a function
    /// image is started as a server. `None` runs the image as it is.
    pub(crate) cmd: Option<&'a [String]>,
    /// `KEY=VALUE`s added to the image's environment.
    pub(crate) env: &'a [String],
}

/// Runs containers; shared by every call.
#[derive(Debug)]
pub(crate) struct Sandbox {
    crun: Crun,
    run_dir: RunDir,
    options: SandboxOptions,
    limits_unavailable: Option<String>,
    /// Where run cgroups go, when limits are enforced.
    delegation: Option<cgroup::Delegation>,
    /// The verdict on the runtime, reached before the first container.
    runtime_checked:
        std::sync::OnceLock<Result<oci_runtime::CrunVersion, oci_runtime::RuntimeError>>,
    /// The seccomp profile compiled once (base64 BPF), when it could be.
    seccomp_bpf: Option<String>,
    /// The ids functions run under (each run maps the image's onto them).
    function_ids: userns::FunctionIds,
    /// Per-namespace kernel counts set on each run's user namespace.
    ucounts: ucounts::UcountLimits,
    /// The id maps of each run's own level of the process count
    /// (`nproc.rs`), where no cgroup bounds a run's processes.
    own_ids: nproc::OwnIds,
}

static LIMITS_WARNING: Once = Once::new();

impl Sandbox {
    /// A sandbox in the namespace xfn entered. Sweeps what a dead xfn left in
    /// the run dir. Makes this process a child subreaper: every container's
    /// init becomes its child (`reaper.rs`).
    pub(crate) fn new(
        namespace: &userns::Namespace,
        options: SandboxOptions,
    ) -> Result<Self, SandboxError> {
        let run_dir = RunDir::open(
            &options.run_dir,
            options.instance.clone(),
            options.state_in_memory,
        )?;
        let delegation = namespace.cgroups().delegation().cloned();
        let crun = Crun {
            binary: options.runtime.clone(),
            state_root: run_dir.crun_state_on_disk(),
            cgroups: delegation.is_some(),
        };
        crun.delete_stale(|id| run_dir.is_stale(id));
        let crun = Crun {
            state_root: run_dir.crun_state(),
            ..crun
        };
        crun.pin_read_only();
        if let Some(delegation) = &delegation {
            // After crun's stale containers: their processes are gone or
            // get killed here with their cgroups.
            cgroup::run::sweep_stale(delegation, |name| options.instance.is_dead_name(name));
        }
        let limits_unavailable = namespace.cgroups().why_no_limits();
        let function_ids = namespace.function_ids();
        let mut sandbox = Self {
            crun,
            run_dir,
            options,
            limits_unavailable,
            delegation,
            runtime_checked: std::sync::OnceLock::new(),
            seccomp_bpf: None,
            function_ids,
            ucounts: namespace.ucounts().clone(),
            own_ids: nproc::OwnIds::read()?,
        };
        sandbox.seccomp_bpf = sandbox.precompiled_seccomp();
        // After the seccomp probe, whose container crun deletes without
        // anyone of xfn's waiting for its init.
        reaper::become_subreaper()?;
        Ok(sandbox)
    }

    /// Where this sandbox's runs get their root filesystems (in memory or on
    /// the disk, as its run state: `bundle.rs`).
    pub(crate) fn rootfs_dir(&self) -> PathBuf {
        self.run_dir.rootfs_dir()
    }

    /// Checks once that the OCI runtime is crun, new enough
    /// ([`oci_runtime::MIN_CRUN`]); every container start calls it, and daemons
    /// call it at start to refuse to serve without a usable runtime.
    pub(crate) fn check_runtime(&self) -> Result<oci_runtime::CrunVersion, SandboxError> {
        self.runtime_checked
            .get_or_init(|| {
                oci_runtime::check(
                    &self.options.runtime,
                    &self.options.run_dir,
                    &self.options.instance,
                )
            })
            .clone()
            .map_err(SandboxError::from)
    }

    /// What `crun create` is given for `request`, once the sandbox is
    /// ready for it: a fresh bundle with its spec and, where limits are
    /// enforced, the run's cgroup. Both are removed when dropped.
    pub(crate) fn prepare(
        &self,
        request: &ContainerRequest<'_>,
    ) -> Result<(Bundle, Option<cgroup::run::RunCgroup>), SandboxError> {
        self.ready_for(&request.limits)?;
        self.prepare_bundle(&self.spec_input(request))
    }

    /// The OCI runtime.
    pub(crate) fn crun(&self) -> &Crun {
        &self.crun
    }

    /// A process-count namespace of the run's own, where no cgroup bounds
    /// its processes (`nproc.rs`).
    pub(crate) fn run_level(&self) -> Result<OwnedFd, SandboxError> {
        Ok(nproc::run_level(&self.own_ids)?)
    }

    /// Gives the user namespace of the process `pidfd` its share of the
    /// per-uid kernel counts (`ucounts.rs`).
    pub(crate) fn bound_counts(&self, pidfd: BorrowedFd<'_>) -> std::io::Result<()> {
        self.ucounts.bound_run(pidfd)
    }

    /// The cap on stdout and on stderr of a run, each.
    pub(crate) fn max_output_bytes(&self) -> usize {
        self.options.max_output_bytes
    }

    /// What every container start checks first: the runtime is usable,
    /// limits are enforced where they are required, and (once per process)
    /// a warning when the requested limits cannot be.
    fn ready_for(&self, limits: &Limits) -> Result<(), SandboxError> {
        self.check_runtime()?;
        self.check_limits()?;
        self.warn_unenforced(limits);
        Ok(())
    }

    /// The spec input of a container: the same for every path (run at
    /// once, created ahead, started ahead, served), so that a warm container
    /// is exactly the container a cold call would get.
    fn spec_input<'a>(&'a self, request: &ContainerRequest<'a>) -> spec::SpecInput<'a> {
        spec::SpecInput {
            rootfs: request.rootfs,
            image: request.image,
            host_network: request.host_network,
            limits: request.limits,
            hostname: "function",
            pids_limit: self.options.pids_limit,
            cgroups_path: None,
            cmd: request.cmd,
            env: request.env,
            seccomp_bpf: None,
            tmp_size_bytes: self.options.tmp_size_bytes,
            function_ids: self.function_ids,
        }
    }

    /// A fresh bundle with the spec of `input` (whose `cgroups_path` is
    /// filled in here) and, where limits are enforced, the run's cgroup,
    /// which the spec names. Both are removed when dropped.
    fn prepare_bundle(
        &self,
        input: &spec::SpecInput<'_>,
    ) -> Result<(Bundle, Option<cgroup::run::RunCgroup>), SandboxError> {
        let bundle = self.run_dir.bundle()?;
        let run_cgroup = match &self.delegation {
            Some(delegation) => Some(cgroup::run::RunCgroup::create(
                delegation,
                bundle.id.strip_prefix("xfn-").unwrap_or(&bundle.id),
            )?),
            None => None,
        };
        let spec = spec::build(&spec::SpecInput {
            cgroups_path: run_cgroup.as_ref().map(|c| c.container_cgroup()),
            seccomp_bpf: self.seccomp_bpf.as_deref(),
            ..input.clone()
        })?;
        bundle.write_spec(&spec)?;
        Ok((bundle, run_cgroup))
    }

    /// Fails when limits are required but not enforced.
    pub(crate) fn check_limits(&self) -> Result<(), SandboxError> {
        match (self.options.require_limits, &self.limits_unavailable) {
            (true, Some(why)) => Err(LimitsUnavailable { why: why.clone() }.into()),
            _ => Ok(()),
        }
    }

    /// Why cpu/memory/pids limits are not enforced, when they are not: for a
    /// daemon to report at start and in its metrics.
    pub(crate) fn limits_unavailable(&self) -> Option<&str> {
        self.limits_unavailable.as_deref()
    }

    /// Warns, once per process, when limits were asked for but are not
    /// enforced here.
    fn warn_unenforced(&self, limits: &Limits) {
        if let (Some(why), true) = (&self.limits_unavailable, *limits != Limits::default()) {
            // Once per process, not per run: a daemon must not flood its log.
            LIMITS_WARNING.call_once(|| {
                tracing::warn!("cpu and memory limits are NOT enforced: {why}");
            });
        }
    }
}

/// How a container that exited with `code` failed: past its memory limit
/// when one was set and its cgroup saw the OOM killer act, else by its exit
/// code; with the tail of its output.
pub(crate) fn failure(
    code: i32,
    stderr_tail: Vec<u8>,
    usage: Option<&cgroup::run::RunUsage>,
    memory_limit: Option<u64>,
) -> SandboxError {
    match (usage.is_some_and(|u| u.oom_kills > 0), memory_limit) {
        (true, Some(limit_bytes)) => MemoryLimitExceeded {
            limit_bytes,
            code,
            stderr_tail,
        }
        .into(),
        _ => SandboxError::Crun(CrunError::Failed { code, stderr_tail }),
    }
}

/// The run's log line with what its cgroup measured.
pub(crate) fn log_usage(
    usage: Option<&cgroup::run::RunUsage>,
    limits: &Limits,
    result: &Result<CrunOutput, SandboxError>,
) {
    let Some(usage) = usage else {
        return;
    };
    let outcome = match result {
        Ok(_) => "ok".to_string(),
        Err(SandboxError::Crun(CrunError::Failed { code, .. }))
        | Err(SandboxError::MemoryLimitExceeded(MemoryLimitExceeded { code, .. })) => {
            format!("exit {code}")
        }
        Err(SandboxError::Crun(CrunError::Timeout(_))) => "timeout".to_string(),
        Err(SandboxError::Crun(CrunError::OutputTooLarge { .. })) => "output too large".to_string(),
        Err(_) => "error".to_string(),
    };
    tracing::info!(
        outcome,
        cpu_seconds = usage.cpu_usec as f64 / 1e6,
        cpu_usec = usage.cpu_usec,
        memory_peak_bytes = usage.memory_peak_bytes,
        oom_kills = usage.oom_kills,
        pids_limit_hits = usage.pids_max_events,
        cpu_limit_millis = limits.cpu_millis,
        memory_limit_bytes = limits.memory_bytes,
        "function run used"
    );
}
