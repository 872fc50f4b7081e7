//! The recording layer: every answer is recorded by its outcome and
//! duration (`xfn_runs_total`, `xfn_run_duration_seconds`), with its
//! run's CPU and memory where it had a cgroup of its own, and logged
//! naming its function (`function=`) or image (`image=`); a call dropped
//! before it answered is recorded as `cancelled` ([`Calls::answer`]).
use std::sync::Arc;

use tonic::Status;

use super::{Function, FunctionRunner, Request, Response};
use crate::grpc::Calls;

/// `inner`, its calls recorded in the daemon's metrics.
#[derive(Debug)]
pub(crate) struct Recorded<R> {
    calls: Arc<Calls>,
    inner: R,
}

impl<R> Recorded<R> {
    /// `inner`, recorded in `calls`' metrics.
    pub(crate) fn new(calls: &Arc<Calls>, inner: R) -> Self {
        Self {
            calls: Arc::clone(calls),
            inner,
        }
    }
}

#[async_trait::async_trait]
impl<R: FunctionRunner> FunctionRunner for Recorded<R> {
    async fn run_function(
        &self,
        function: &Function,
        request: Request,
    ) -> Result<Response, Status> {
        let call = async {
            let response = self.inner.run_function(function, request).await?;
            if let Some(usage) = &response.usage {
                self.calls.metrics().record_usage(usage);
            }
            let outcome = response.outcome;
            Ok((response, outcome))
        };
        self.calls.answer(function.subject(), call).await
    }
}
