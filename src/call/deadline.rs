//! The deadline layer: a run gets its function's timeout cut to what is
//! left of the caller's deadline when it starts (time queued counted), so
//! the run ends, and says so, before the caller gives up on it.
use tokio::time::Instant;
use tonic::Status;

use super::{Function, FunctionRunner, Request, Response};
use crate::grpc::deadline::effective_timeout;
use crate::runner::RunConfig;

/// `inner`, its runs' timeouts within the caller's deadline.
#[derive(Debug)]
pub(crate) struct WithinDeadline<R>(pub(crate) R);

#[async_trait::async_trait]
impl<R: FunctionRunner> FunctionRunner for WithinDeadline<R> {
    async fn run_function(
        &self,
        function: &Function,
        request: Request,
    ) -> Result<Response, Status> {
        let Some(deadline) = request.deadline else {
            return self.0.run_function(function, request).await;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Status::deadline_exceeded(
                "the caller's deadline passed before the run started; the function did not run",
            ));
        }
        let function = Function {
            config: RunConfig {
                timeout: effective_timeout(function.config.timeout, Some(left)),
                ..function.config.clone()
            },
            ..function.clone()
        };
        self.0.run_function(&function, request).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// Remembers the timeout of the run it was asked for.
    #[derive(Default)]
    struct Timeouts(Mutex<Vec<Duration>>);

    #[async_trait::async_trait]
    impl FunctionRunner for Timeouts {
        async fn run_function(
            &self,
            function: &Function,
            _request: Request,
        ) -> Result<Response, Status> {
            self.0.lock().unwrap().push(function.config.timeout);
            Ok(Response::ran(bytes::Bytes::new()))
        }
    }

    #[tokio::test]
    async fn a_run_gets_its_timeout_cut_to_the_deadline_and_none_past_it() {
        let layer = WithinDeadline(Timeouts::default());
        let function = Function {
            name: None,
            image: "image".into(),
            config: RunConfig {
                timeout: Duration::from_secs(25),
                ..RunConfig::default()
            },
        };
        let call = |deadline| Request {
            input: bytes::Bytes::new(),
            deadline,
        };
        let soon = Instant::now() + Duration::from_secs(2);
        layer
            .run_function(&function, call(Some(soon)))
            .await
            .unwrap();
        layer.run_function(&function, call(None)).await.unwrap();
        let passed = Instant::now() - Duration::from_millis(1);
        let status = layer
            .run_function(&function, call(Some(passed)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        let timeouts = layer.0 .0.lock().unwrap().clone();
        assert_eq!(timeouts.len(), 2, "no run past the deadline");
        assert!(timeouts[0] <= Duration::from_secs(2), "{timeouts:?}");
        assert_eq!(timeouts[1], Duration::from_secs(25));
    }
}
