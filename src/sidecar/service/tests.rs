//! Unit tests of the service over a fake runner (the end-to-end tests in
//! tests/server_*.rs use the real binary and engine).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::*;
use crate::grpc::admission::AdmissionLimits;
use crate::grpc::metrics::Metrics;
use crate::runner::{RunConfig, RunError};
use tonic::Code;

const IO: &[u8] = b"apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\n";

/// Echoes its input after `delay`, remembering the configs it saw and
/// whether a run was dropped before finishing.
#[derive(Default)]
struct FakeRunner {
    delay: Duration,
    configs: Mutex<Vec<RunConfig>>,
    dropped: Arc<AtomicBool>,
}

struct DropFlag(Arc<AtomicBool>, bool);
impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl FunctionRunner for FakeRunner {
    async fn run_function(
        &self,
        function: &Function,
        request: call::Request,
    ) -> Result<call::Response, Status> {
        self.configs.lock().unwrap().push(function.config.clone());
        let mut flag = DropFlag(self.dropped.clone(), false);
        tokio::time::sleep(self.delay).await;
        flag.1 = true;
        if function.image == "fail" {
            return Err(crate::grpc::status_of(&RunError::Timeout(
                Duration::from_secs(1),
            )));
        }
        Ok(call::Response::ran(request.input))
    }
}

fn service(
    runner: FakeRunner,
    options: ServiceOptions,
) -> (Arc<SidecarService<FakeRunner>>, Arc<FakeRunner>) {
    service_limited(runner, options, AdmissionLimits::with_runs(1))
}

fn service_limited(
    runner: FakeRunner,
    options: ServiceOptions,
    limits: AdmissionLimits,
) -> (Arc<SidecarService<FakeRunner>>, Arc<FakeRunner>) {
    let runner = Arc::new(runner);
    let calls = Arc::new(Calls::new(limits, Arc::new(Metrics::new())));
    let svc = SidecarService::new(runner.clone(), options, calls);
    (Arc::new(svc), runner)
}

fn request(image: &str, input: &[u8]) -> Request<pb::RunFunctionRequest> {
    Request::new(pb::RunFunctionRequest {
        image: image.into(),
        input: input.to_vec(),
        ..Default::default()
    })
}

#[tokio::test]
async fn runs_and_returns_stdout() {
    let (svc, runner) = service(FakeRunner::default(), ServiceOptions::default());
    let out = svc.run_function(request("fn:v1", IO)).await.unwrap();
    assert_eq!(out.into_inner().output, IO);
    let configs = runner.configs.lock().unwrap();
    assert_eq!(configs[0].timeout, Duration::from_secs(25));
    let text = svc.calls.metrics().render();
    assert!(text.contains("xfn_runs_total{outcome=\"ok\"} 1"), "{text}");
}

#[tokio::test]
async fn invalid_requests_never_reach_the_runner() {
    let (svc, runner) = service(FakeRunner::default(), ServiceOptions::default());
    for (image, input) in [
        ("", IO),
        ("fn:v1", b"- not a mapping".as_slice()),
        ("fn:v1", b"kind: Pod".as_slice()),
    ] {
        let status = svc.run_function(request(image, input)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }
    let options = ServiceOptions {
        max_input_bytes: 8,
        ..Default::default()
    };
    let (small, _) = service(FakeRunner::default(), options);
    let status = small.run_function(request("fn:v1", IO)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("--max-input-bytes"),
        "{}",
        status.message()
    );
    assert!(runner.configs.lock().unwrap().is_empty());
}

#[tokio::test]
async fn run_errors_go_through_status_of() {
    let (svc, _) = service(FakeRunner::default(), ServiceOptions::default());
    let status = svc.run_function(request("fail", IO)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
}

#[tokio::test]
async fn the_caller_deadline_caps_the_run_timeout() {
    let (svc, runner) = service(FakeRunner::default(), ServiceOptions::default());
    let mut req = request("fn:v1", IO);
    req.metadata_mut()
        .insert("grpc-timeout", "2S".parse().unwrap());
    svc.run_function(req).await.unwrap();
    let timeout = runner.configs.lock().unwrap()[0].timeout;
    assert!(
        timeout <= Duration::from_secs(2) && timeout > Duration::ZERO,
        "{timeout:?}"
    );
}

#[tokio::test]
async fn callers_past_the_queue_are_turned_away() {
    let fake = FakeRunner {
        delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let limits = AdmissionLimits {
        max_queued: 1,
        ..AdmissionLimits::with_runs(1)
    };
    let (svc, runner) = service_limited(fake, ServiceOptions::default(), limits);
    let abort = svc.calls.drain(Duration::ZERO).abort;
    let running = tokio::spawn({
        let svc = svc.clone();
        async move { svc.run_function(request("fn:v1", IO)).await }
    });
    let queued = tokio::spawn({
        let svc = svc.clone();
        async move { svc.run_function(request("fn:v1", IO)).await }
    });
    while svc.calls.queued() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let status = svc.run_function(request("fn:v1", IO)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    // The end of the grace period ends the running call and drops its run.
    abort.cancel();
    let status = running.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(queued.await.unwrap().is_err());
    assert!(runner.dropped.load(Ordering::SeqCst));
}

#[tokio::test]
async fn dropping_the_call_drops_the_run() {
    let fake = FakeRunner {
        delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let (svc, runner) = service(fake, ServiceOptions::default());
    let call = tokio::spawn({
        let svc = svc.clone();
        async move { svc.run_function(request("fn:v1", IO)).await }
    });
    while runner.configs.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert!(runner.dropped.load(Ordering::SeqCst));
    let text = svc.calls.metrics().render();
    assert!(
        text.contains("xfn_runs_total{outcome=\"cancelled\"} 1"),
        "{text}"
    );
    assert!(text.contains("xfn_runs_in_flight 0"), "{text}");
}

#[tokio::test]
async fn a_call_queued_past_its_deadline_is_deadline_exceeded_and_never_runs() {
    let fake = FakeRunner {
        delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let (svc, runner) = service(fake, ServiceOptions::default());
    let running = tokio::spawn({
        let svc = svc.clone();
        async move { svc.run_function(request("fn:v1", IO)).await }
    });
    while runner.configs.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut req = request("fn:v1", IO);
    req.metadata_mut()
        .insert("grpc-timeout", "100m".parse().unwrap());
    let status = svc.run_function(req).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("did not run"), "{status:?}");
    assert_eq!(runner.configs.lock().unwrap().len(), 1, "it never ran");
    assert_eq!(svc.calls.queued(), 0);
    running.abort();
}
