//! The admission layer: every call waits in the daemon's one queue
//! ([`Calls`]: arrival order, its caps on calls and bytes, the drain's
//! end), for a run slot or for a slot of its own lane (`xfn host`: room on
//! a function's servers), and is counted by [`Calls::activity`]
//! whichever front end took it. Time queued counts against its deadline.
use std::sync::Arc;

use tonic::Status;

use super::{Function, FunctionRunner, Request, Response};
use crate::grpc::admission::Lane;
use crate::grpc::Calls;

/// A front end's own count of its calls waiting (`xfn host`'s per
/// function): raised while a call waits, lowered when it is admitted or
/// gives up (no guard of its own to allocate per call: [`Waited`]).
pub(crate) trait Waiting: Send + Sync {
    /// One more call waits.
    fn raise(&self);
    /// One call less waits.
    fn lower(&self);
}

/// A call counted in a [`Waiting`] until dropped.
struct Waited<'a>(&'a dyn Waiting);

impl<'a> Waited<'a> {
    fn new(count: &'a dyn Waiting) -> Self {
        count.raise();
        Self(count)
    }
}

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        self.0.lower();
    }
}

/// `inner`, each call admitted by the daemon's [`Calls`].
pub(crate) struct Admitted<R> {
    calls: Arc<Calls>,
    /// The slots waited for: a lane's, else a run slot.
    lane: Option<Lane>,
    waiting: Option<Arc<dyn Waiting>>,
    inner: R,
}

impl<R> std::fmt::Debug for Admitted<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("lane", &self.lane)
            .finish_non_exhaustive()
    }
}

impl<R> Admitted<R> {
    /// `inner`, each call waiting for a run slot.
    pub(crate) fn new(calls: &Arc<Calls>, inner: R) -> Self {
        Self {
            calls: Arc::clone(calls),
            lane: None,
            waiting: None,
            inner,
        }
    }

    /// `inner`, each call waiting in the same queue for a slot of `lane`
    /// instead, counted in `waiting` meanwhile.
    pub(crate) fn to_lane(
        calls: &Arc<Calls>,
        lane: Lane,
        waiting: Arc<dyn Waiting>,
        inner: R,
    ) -> Self {
        Self {
            calls: Arc::clone(calls),
            lane: Some(lane),
            waiting: Some(waiting),
            inner,
        }
    }
}

#[async_trait::async_trait]
impl<R: FunctionRunner> FunctionRunner for Admitted<R> {
    async fn run_function(
        &self,
        function: &Function,
        request: Request,
    ) -> Result<Response, Status> {
        let (bytes, deadline) = (request.input.len(), request.deadline);
        let waiting = self.waiting.as_deref().map(Waited::new);
        let run = |_left| async move {
            drop(waiting);
            self.inner.run_function(function, request).await
        };
        match &self.lane {
            Some(lane) => self.calls.admit_to(lane, bytes, deadline, run).await,
            None => self.calls.admit(bytes, deadline, run).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::grpc::admission::AdmissionLimits;
    use crate::grpc::metrics::Metrics;
    use crate::runner::RunConfig;

    /// A backend whose calls never end.
    struct Forever;

    #[async_trait::async_trait]
    impl FunctionRunner for Forever {
        async fn run_function(&self, _: &Function, _: Request) -> Result<Response, Status> {
            std::future::pending().await
        }
    }

    /// A front end's own count of its waiting calls.
    #[derive(Default)]
    struct Count(AtomicI64);

    impl Waiting for Count {
        fn raise(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn lower(&self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn call(input: &'static [u8]) -> Request {
        Request {
            input: bytes::Bytes::from_static(input),
            deadline: None,
        }
    }

    #[tokio::test]
    async fn calls_for_a_lane_and_for_run_slots_wait_in_one_queue_under_one_cap() {
        let limits = AdmissionLimits {
            max_running: 1,
            max_queued: 1,
            max_queued_bytes: 1 << 20,
        };
        let calls = Arc::new(Calls::new(limits, Arc::new(Metrics::new())));
        let count = Arc::new(Count::default());
        let runs = Arc::new(Admitted::new(&calls, Forever));
        let servers = Arc::new(Admitted::to_lane(
            &calls,
            Lane::new(1),
            Arc::clone(&count) as Arc<dyn Waiting>,
            Forever,
        ));
        let function = Arc::new(Function {
            name: Some("fn".into()),
            image: "image".into(),
            config: RunConfig::default(),
        });
        let spawn = |layer: Arc<dyn FunctionRunner>| {
            let function = Arc::clone(&function);
            tokio::spawn(async move { layer.run_function(&function, call(b"{}")).await })
        };
        // One running on a run slot, one on the lane's one slot, one
        // waiting for the lane: the queue's one place is taken.
        let _running = spawn(runs.clone());
        let _serving = spawn(servers.clone());
        while calls.metrics().in_flight().get() != 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let _waiting = spawn(servers.clone());
        while calls.queued() != 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "counted as waiting");
        for layer in [runs as Arc<dyn FunctionRunner>, servers] {
            let status = spawn(layer).await.unwrap().unwrap_err();
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        }
        let (begun, busy) = calls.activity();
        assert_eq!(begun, 5, "every call counted, whichever it waited for");
        assert!(busy);
    }
}
