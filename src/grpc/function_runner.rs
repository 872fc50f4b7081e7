//! The seam between a daemon's gRPC service and the engine: the sidecar
//! and the adaptor (so the host's stdin/stdout functions) call through it, so a service's admission, deadline and status
//! logic can be unit-tested with a fake, and layers (the adaptor's response
//! cache) wrap the engine as Crossplane's `internal/xfn` wraps its
//! `FunctionRunner`.
use crate::runner::{RunConfig, RunError, RunOutput, Runner};

/// Something that runs one function image once.
#[async_trait::async_trait]
pub(crate) trait FunctionRunner: Send + Sync + 'static {
    /// Runs `image` with `input` on stdin. Dropping the returned future must
    /// stop the run and clean up after it (a cancelled gRPC call drops it).
    async fn run(
        &self,
        image: &str,
        input: &[u8],
        config: &RunConfig,
    ) -> Result<RunOutput, RunError>;

    /// An answer this runner already holds for `image` and `input`, given
    /// without a run (so a caller may ask before it waits for a run slot):
    /// a cache layer's hit. The engine itself holds none.
    fn held(&self, _image: &str, _input: &[u8]) -> Option<RunOutput> {
        None
    }

    /// Whether CPU/memory/pids limits are really enforced (cgroup v2
    /// delegation) — exported as the `xfn_limits_enforced` gauge.
    fn limits_enforced(&self) -> bool {
        false
    }
}

#[async_trait::async_trait]
impl FunctionRunner for Runner {
    async fn run(
        &self,
        image: &str,
        input: &[u8],
        config: &RunConfig,
    ) -> Result<RunOutput, RunError> {
        Runner::run(self, image, input, config).await
    }

    fn limits_enforced(&self) -> bool {
        self.limits_unavailable().is_none()
    }
}
