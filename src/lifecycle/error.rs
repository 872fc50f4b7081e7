//! Why a run failed, whichever path ran it (cold, warm, served) and
//! wherever it failed (the image, the rootfs, the sandbox, the function):
//! one enum, which `grpc::status` maps to a gRPC status.
use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::crun::tail_text as stderr_tail_text;
use crate::sandbox::{
    CrunError, LimitsUnavailable, MemoryLimitExceeded, NotServing, SandboxError, SpecError,
};

/// Errors of a run. `grpc::status` maps each to a gRPC status. Each
/// says its own step; what failed beneath is its typed source, so a message
/// for a person is the error's chain (`crate::chain`).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Getting the image failed (see `ImageError::kind`).
    #[error(transparent)]
    Image(#[from] crate::image::ImageError),
    /// The image config cannot be run: nothing to run, an unknown user
    /// (InvalidArgument).
    #[error("invalid run configuration")]
    InvalidConfig(#[source] SpecError),
    /// The function did not finish in time and was killed (DeadlineExceeded).
    #[error("the function timed out after {0:?} and was killed")]
    Timeout(Duration),
    /// The function exited non-zero (Unknown/Aborted).
    #[error(
        "the function failed with exit code {code}: {}",
        stderr_tail_text(stderr_tail)
    )]
    FunctionFailed {
        /// Exit code (128 + signal when killed by one).
        code: i32,
        /// The last `STDERR_TAIL_BYTES` of its stderr.
        stderr_tail: Vec<u8>,
    },
    /// The function wrote more than the cap (ResourceExhausted).
    #[error("the function wrote more than {limit} bytes to {stream} and was killed")]
    OutputTooLarge {
        /// `stdout` or `stderr`.
        stream: &'static str,
        /// The cap.
        limit: usize,
    },
    /// The function went past its memory limit and the kernel's OOM killer
    /// killed it (ResourceExhausted).
    #[error(transparent)]
    MemoryLimitExceeded(MemoryLimitExceeded),
    /// The OCI runtime is missing, not crun, or too old: nothing can run
    /// until the set-up is fixed (FailedPrecondition).
    #[error(transparent)]
    Runtime(#[from] crate::sandbox::oci_runtime::RuntimeError),
    /// Limits were required but are not enforced here (FailedPrecondition).
    #[error(transparent)]
    LimitsUnavailable(LimitsUnavailable),
    /// A function started as a server never listened where it should
    /// (Unavailable).
    #[error(transparent)]
    NotServing(NotServing),
    /// The rootfs mode asked for cannot be used here (`--rootfs overlay`
    /// without overlayfs; InvalidArgument).
    #[error("invalid run configuration")]
    RootfsMode(#[source] crate::rootfs::RootfsError),
    /// Setting the container up or running it failed on xfn's side: the
    /// bundle, its cgroup, crun's i/o, a spec oci-spec refused (Internal).
    #[error("internal error")]
    Sandbox(#[source] SandboxError),
    /// The run's root filesystem could not be made (Internal).
    #[error("internal error: cannot prepare the run's root filesystem")]
    Rootfs(#[source] crate::rootfs::RootfsError),
    /// The task making the root filesystem panicked (Internal).
    #[error("internal error: preparing the run's root filesystem panicked")]
    RootfsPanicked(#[source] tokio::task::JoinError),
    /// The runner's directories under the cache could not be made (Internal).
    #[error("internal error: cannot prepare the run directory {path}")]
    RunDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl From<SandboxError> for RunError {
    /// The sandbox's errors a caller tells apart (the function's own
    /// failures, the set-up's) become variants of their own; the rest are
    /// xfn's internal failures, kept whole as the source.
    fn from(err: SandboxError) -> Self {
        match err {
            SandboxError::LimitsUnavailable(err) => RunError::LimitsUnavailable(err),
            SandboxError::Spec(err @ (SpecError::NothingToRun | SpecError::User(_))) => {
                RunError::InvalidConfig(err)
            }
            SandboxError::Crun(CrunError::Timeout(after)) => RunError::Timeout(after),
            SandboxError::Crun(CrunError::Failed { code, stderr_tail }) => {
                RunError::FunctionFailed { code, stderr_tail }
            }
            SandboxError::Crun(CrunError::OutputTooLarge { stream, limit }) => {
                RunError::OutputTooLarge { stream, limit }
            }
            SandboxError::MemoryLimitExceeded(err) => RunError::MemoryLimitExceeded(err),
            SandboxError::Runtime(err) => RunError::Runtime(err),
            SandboxError::NotServing(err) => RunError::NotServing(err),
            other => RunError::Sandbox(other),
        }
    }
}
