//! Start: the byte on `exec.fifo` (all that `crun start` does) lets the
//! init exec the function, which then runs until it reads its stdin. A
//! start that fails hands what is left to the teardown; a container
//! created ahead that is gone by its start is replaced by a fresh one
//! ([`FunctionContainer::start_or_create`]).
use std::time::{Duration, Instant};

use super::seam::Remains;
use super::seam::Sandboxing;
use super::teardown::{Finished, Teardown};
use super::{Container, Created, FunctionContainer, RunError, Started};
use crate::sandbox::{CrunError, CrunOutput, SandboxError};

impl<B: Sandboxing> FunctionContainer<Created, B> {
    /// Starts the function ahead of its call. On failure what is left goes
    /// through `teardown` (awaited).
    pub(crate) async fn start(
        self,
        teardown: &Teardown,
    ) -> Result<FunctionContainer<Started, B>, RunError> {
        let Self {
            container,
            rootfs,
            pin,
        } = self;
        match B::start(container).await {
            Ok(container) => Ok(FunctionContainer {
                container,
                rootfs,
                pin,
            }),
            Err((err, finished)) => {
                let remains: Remains<B> = (finished, rootfs, pin);
                teardown.drop_later(remains).await;
                Err(err.into())
            }
        }
    }

    /// Starts `prepared`, a container created ahead (its start consumes
    /// it), or, when there is none or it is gone (killed out of band: its
    /// start fails, and what is left of it goes through `teardown`),
    /// creates one from `recipe` and `settings` and starts that. Says
    /// which: [`Origin`].
    pub(crate) async fn start_or_create(
        prepared: Option<Self>,
        sandbox: &B,
        rootfs: &B::RootfsMaker,
        recipe: &super::Recipe<B::Pin>,
        settings: super::Settings<'_>,
        teardown: &Teardown,
    ) -> Result<(FunctionContainer<Started, B>, Origin), RunError> {
        if let Some(prepared) = prepared {
            let id = B::id(&prepared.container).to_owned();
            match prepared.start(teardown).await {
                Ok(started) => return Ok((started, Origin::Prepared)),
                Err(err) => {
                    tracing::info!(container = %id, error = %crate::chain::Chain(&err), "the container created ahead is gone: creating another");
                }
            }
        }
        let created = Self::create(sandbox, rootfs, recipe, settings, teardown).await?;
        Ok((created.start(teardown).await?, Origin::Created))
    }

    /// Starts and feeds the container within `timeout` from `since`.
    pub(crate) async fn run(
        self,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> (Result<CrunOutput, RunError>, Remains<B>) {
        let (result, finished) = B::run(self.container, input, timeout, since).await;
        (
            result.map_err(RunError::from),
            (finished, self.rootfs, self.pin),
        )
    }
}

/// Where a started container came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Created ahead, before its call.
    Prepared,
    /// Created on its call (none was prepared, or the prepared one was gone).
    Created,
}

impl Container<Created> {
    /// Starts the function: it execs and runs until it reads its stdin.
    /// Fails when the container is gone, handing back what is left to
    /// remove (off the async threads).
    pub(crate) async fn start(self) -> Result<Container<Started>, (SandboxError, Finished)> {
        let Self { state, parts } = self;
        if let Err(err) = parts.guard.crun.start(&parts.guard.id).await {
            return Err((err.into(), parts.finish()));
        }
        Ok(Container {
            state: Started {
                stdio: state.stdio,
                at: Instant::now(),
            },
            parts,
        })
    }

    /// Starts the container and feeds it, both within `timeout` counted
    /// from `since` (the call's start: a cold call's creation counts).
    pub(crate) async fn run(
        self,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> (Result<CrunOutput, SandboxError>, Finished) {
        let budget = |since: Instant| timeout.saturating_sub(since.elapsed());
        let Self { state, parts } = self;
        let started =
            tokio::time::timeout(budget(since), parts.guard.crun.start(&parts.guard.id)).await;
        let started = match started {
            Ok(Ok(())) => Container {
                state: Started {
                    stdio: state.stdio,
                    at: Instant::now(),
                },
                parts,
            },
            Ok(Err(err)) => return (Err(err.into()), parts.finish()),
            Err(_) => {
                return (
                    Err(SandboxError::Crun(CrunError::Timeout(timeout))),
                    parts.finish(),
                )
            }
        };
        started.feed_within(input, budget(since), timeout).await
    }
}
