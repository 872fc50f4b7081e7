//! Feed: a started function gets its input on stdin, its stdout and the
//! tail of its stderr are read under the output cap, and its exit reaped,
//! all within the call's timeout; on a timeout or an error it is killed.
//! What is left goes back to the caller as [`Finished`], for the teardown.
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use super::seam::Remains;
use super::seam::Sandboxing;
use super::teardown::Finished;
use super::{Container, FunctionContainer, RunError, Started, Stdio};
use crate::sandbox::cgroup::run::RunCgroup;
use crate::sandbox::crun::{read_capped, read_tail, wait_exit, CrunError, CrunOutput};
use crate::sandbox::SandboxError;

impl<B: Sandboxing> FunctionContainer<Started, B> {
    /// Feeds the started function within `timeout` from now.
    pub(crate) async fn feed(
        self,
        input: &[u8],
        timeout: Duration,
    ) -> (Result<CrunOutput, RunError>, Remains<B>) {
        let (result, finished) = B::feed(self.container, input, timeout).await;
        (
            result.map_err(RunError::from),
            (finished, self.rootfs, self.pin),
        )
    }
}

impl Container<Started> {
    /// Writes `input` to the function's stdin, closes it, reads its output
    /// and waits for it to exit, all within `timeout` from now (output caps
    /// and OOM mapping as for every run). Returns the outcome and what is
    /// left to remove, which the caller drops off the reply path.
    pub(crate) async fn feed(
        self,
        input: &[u8],
        timeout: Duration,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        self.feed_within(input, timeout, timeout).await
    }

    /// [`Container::feed`] with `budget` left of a `timeout` (which errors
    /// name).
    pub(super) async fn feed_within(
        self,
        input: &[u8],
        budget: Duration,
        timeout: Duration,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        let Self { state, mut parts } = self;
        let Stdio {
            stdin,
            stdout,
            stderr,
        } = state.stdio;
        let began = Instant::now();
        let running_before = began.saturating_duration_since(state.at);
        let cap = parts.max_output_bytes;
        let pidfd = &parts.init.pidfd;
        let outcome = async {
            let writer = async move {
                let mut stdin = stdin;
                // A function may exit without reading its input: a broken
                // pipe is not an error of the run. Dropping stdin closes it.
                let _ = stdin.write_all(input).await;
                Ok::<(), CrunError>(())
            };
            let (_, out, err) = tokio::try_join!(
                writer,
                read_capped(Some(stdout), cap, "stdout"),
                read_tail(Some(stderr), cap, "stderr"),
            )?;
            let output_at = began.elapsed();
            let code = wait_exit(pidfd).await?;
            tracing::debug!(
                ?running_before,
                ?output_at,
                exited_at = ?began.elapsed(),
                "container feed phases (cumulative)"
            );
            Ok::<_, CrunError>((code, out, err))
        };
        let result = match tokio::time::timeout(budget, outcome).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(CrunError::Timeout(timeout)),
        };
        // Reaped by `wait_exit`; else killed and reaped here without
        // blocking an async thread (or, past 5 s, when `parts` finishes).
        parts.init.reaped = result.is_ok()
            || (parts.init.kill()
                && tokio::time::timeout(Duration::from_secs(5), wait_exit(&parts.init.pidfd))
                    .await
                    .is_ok_and(|code| code.is_ok()));
        let usage = parts.run_cgroup.as_ref().map(RunCgroup::usage);
        let result = match result {
            Ok((0, stdout, stderr_tail)) => Ok(CrunOutput {
                stdout,
                stderr_tail,
                usage,
            }),
            Ok((code, _, stderr_tail)) => Err(parts.failure(code, stderr_tail)),
            Err(err) => Err(err.into()),
        };
        crate::sandbox::log_usage(usage.as_ref(), &parts.limits, &result);
        (result, parts.finish())
    }
}
