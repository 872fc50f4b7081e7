//! End to end: the real `xfn start` (as uid 65532, no capabilities, on an
//! abstract socket) answering RunFunction calls with real images from a real
//! registry, one status code per error class.

use std::time::Duration;

use tonic::Code;
use xfn_testkit::pb;
use xfn_testkit::*;

/// A registry, then `xfn start FLAGS` and a client of it.
async fn start(flags: &[&str]) -> (Registry, Daemon, Client) {
    let registry = Registry::start();
    let daemon = Daemon::start(flags).await;
    let client = daemon.client().await;
    (registry, daemon, client)
}

/// The status a call of `image` with a FunctionIO fails with.
async fn refused(client: &mut Client, image: &str) -> tonic::Status {
    client
        .run_function(request(image, FUNCTION_IO))
        .await
        .expect_err("the call fails")
}

/// A call of `image` with a FunctionIO, which succeeds.
async fn served(client: &mut Client, image: &str) {
    client
        .run_function(request(image, FUNCTION_IO))
        .await
        .unwrap_or_else(|status| panic!("{status:?}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_a_function_and_returns_its_output() {
    let (registry, daemon, mut client) = start(&[]).await;
    let image = echo_image(&registry, "echo:v1");
    // Twice: the first call pulls, the second is warm.
    for _ in 0..2 {
        let out = client
            .run_function(request(&image, FUNCTION_IO))
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()))
            .into_inner();
        assert_eq!(String::from_utf8(out.output).unwrap(), FUNCTION_IO);
    }
    assert_eq!(daemon.runs("ok").await, 2.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_requests_get_invalid_argument() {
    let (registry, daemon, mut client) = start(&["--max-input-bytes", "4096"]).await;
    let image = echo_image(&registry, "echo:v1");
    let cases = [
        (request("", FUNCTION_IO), "image is empty"),
        (request(&image, "- a\n- list\n"), "not a YAML mapping"),
        (
            request(&image, "apiVersion: v1\nkind: ConfigMap\n"),
            "not a FunctionIO",
        ),
        (request(&image, "{ not yaml"), "not YAML"),
        (
            request(&image, &format!("{FUNCTION_IO}# {}\n", "x".repeat(8192))),
            "--max-input-bytes",
        ),
    ];
    for (req, reason) in cases {
        let status = client.run_function(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(reason), "{status:?}");
    }
    assert_eq!(daemon.runs("invalid_argument").await, 5.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_image_is_not_found() {
    let (registry, _daemon, mut client) = start(&[]).await;
    let status = refused(&mut client, &registry.reference("missing:v1")).await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_auth_failure_is_permission_denied() {
    let registry = Registry::start_with_auth("alice", "s3cret");
    let image = echo_image(&registry, "private/echo:v1");
    let daemon = Daemon::start(&[]).await;
    let mut client = daemon.client().await;

    // Pulled again on each call (Always), as alice with `password`.
    let as_alice = |password: &str| {
        let mut req = request(&image, FUNCTION_IO);
        req.image_pull_config = Some(pb::ImagePullConfig {
            pull_policy: pb::ImagePullPolicy::Always as i32,
            auth: Some(pb::ImagePullAuth {
                username: "alice".into(),
                password: password.into(),
                ..Default::default()
            }),
        });
        req
    };
    let status = client.run_function(as_alice("wrong")).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    let out = client
        .run_function(as_alice("s3cret"))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_registry_is_unavailable() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let daemon = Daemon::start(&[]).await;
    let mut client = daemon.client().await;
    let status = refused(&mut client, &format!("127.0.0.1:{port}/fn:v1")).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_function_is_aborted_with_exit_code_and_stderr() {
    let (registry, daemon, mut client) = start(&[]).await;
    let image = script_image(&registry, "fail:v1", "echo it-went-wrong >&2; exit 3");
    let status = refused(&mut client, &image).await;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains('3'), "{status:?}");
    assert!(status.message().contains("it-went-wrong"), "{status:?}");
    // The daemon keeps serving.
    let echo = echo_image(&registry, "echo:v1");
    daemon.call_ok(&echo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_function_past_its_timeout_is_deadline_exceeded_and_killed() {
    let (registry, daemon, mut client) = start(&[]).await;
    let image = script_image(&registry, "hang:v1", "cat >/dev/null; n=36; sleep ${n}11");
    let status = client
        .run_function(request_with_timeout(
            &image,
            FUNCTION_IO,
            Duration::from_secs(1),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    wait_until_gone("sleep 3611").await;
    assert_eq!(daemon.metric("xfn_runs_in_flight").await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_callers_grpc_deadline_is_honoured() {
    let registry = Registry::start();
    let image = script_image(&registry, "hang:v1", "cat >/dev/null; n=36; sleep ${n}12");
    // The daemon's own default would let the run go on for an hour: only the
    // caller's deadline can end it.
    let daemon = Daemon::start(&["--default-timeout", "1h"]).await;
    let mut client = daemon.client().await;
    let mut req = tonic::Request::new(request(&image, FUNCTION_IO));
    req.set_timeout(Duration::from_secs(2));
    let status = client.run_function(req).await.unwrap_err();
    // The daemon answers DeadlineExceeded; tonic's own client-side timer may
    // fire first and report Cancelled("Timeout expired") — either way the
    // deadline ended the call.
    assert!(
        status.code() == Code::DeadlineExceeded
            || (status.code() == Code::Cancelled && status.message().contains("Timeout")),
        "{status:?}"
    );
    // And it ended the run: nothing is left of it.
    wait_until_gone("sleep 3612").await;
    daemon.wait_for_metric("xfn_runs_in_flight", 0.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_kills_its_run() {
    let registry = Registry::start();
    let image = script_image(&registry, "hang:v1", "cat >/dev/null; n=36; sleep ${n}13");
    let daemon = Daemon::start(&[]).await;
    let call = daemon.call_in_flight(&image, 1).await;
    while processes_with("sleep 3613").is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Dropping the client's future resets the HTTP/2 stream: a cancel.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    wait_until_gone("sleep 3613").await;
    daemon
        .wait_for_metric("xfn_runs_total{outcome=\"cancelled\"}", 1.0)
        .await;
    daemon.wait_for_metric("xfn_runs_in_flight", 0.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_beyond_the_run_and_queue_limits_are_turned_away() {
    let registry = Registry::start();
    let hang = script_image(&registry, "hang:v1", "cat >/dev/null; n=36; sleep ${n}14");
    let echo = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&["--max-concurrent-runs", "1", "--max-queued-runs", "1"]).await;
    // Pull the echo image first so the queued call needs only its run.
    let mut client = daemon.client().await;
    daemon.call_ok(&echo).await;

    let running = daemon.call_in_flight(&hang, 1).await;

    let mut queued_client = client.clone();
    let echo_req = request(&echo, FUNCTION_IO);
    let queued = tokio::spawn(async move { queued_client.run_function(echo_req).await });
    daemon.wait_for_metric("xfn_runs_queued", 1.0).await;

    let status = refused(&mut client, &echo).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // Cancel the hanging run: the queued call gets its slot and succeeds.
    running.abort();
    let out = queued
        .await
        .unwrap()
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
    wait_until_gone("sleep 3614").await;
    assert_eq!(daemon.runs("resource_exhausted").await, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_beyond_max_runs_queue_and_all_succeed() {
    let (registry, daemon, client) =
        start(&["--max-concurrent-runs", "2", "--max-queued-runs", "16"]).await;
    let echo = echo_image(&registry, "echo:v1");
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let mut client = client.clone();
            let input = format!("{FUNCTION_IO}# call {i}\n");
            let req = request(&echo, &input);
            tokio::spawn(async move { (input, client.run_function(req).await) })
        })
        .collect();
    for call in calls {
        let (input, result) = call.await.unwrap();
        let out = result.unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
        assert_eq!(out.into_inner().output, input.as_bytes());
    }
    assert_eq!(daemon.runs("ok").await, 8.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_concurrent_callers_with_default_flags_all_succeed() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&[]).await;
    // Warm: the calls below compete for run slots, not for the pull.
    daemon.call_ok(&echo).await;
    // A connection per call, as Crossplane dials, with Crossplane's kind of
    // deadline; far more callers than the CPUs this daemon runs at once.
    let mut calls = Vec::new();
    for i in 0..64 {
        let mut client = daemon.client().await;
        let input = format!("{FUNCTION_IO}# call {i}\n");
        let mut req = tonic::Request::new(request(&echo, &input));
        req.set_timeout(Duration::from_secs(120));
        calls.push(tokio::spawn(async move {
            (input, client.run_function(req).await)
        }));
    }
    for call in calls {
        let (input, result) = call.await.unwrap();
        let out = result.unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
        assert_eq!(out.into_inner().output, input.as_bytes());
    }
    assert_eq!(daemon.runs("ok").await, 65.0);
    assert_eq!(daemon.metric("xfn_runs_queued").await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_still_queued_at_its_deadline_is_deadline_exceeded_and_never_runs() {
    let registry = Registry::start();
    let hang = script_image(&registry, "hang:v1", "cat >/dev/null; n=36; sleep ${n}15");
    let echo = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&["--max-concurrent-runs", "1"]).await;
    daemon.call_ok(&echo).await;
    let running = daemon.call_in_flight(&hang, 1).await;

    // The daemon's answer, not the client's own timer.
    let mut raw = daemon.raw_client().await;
    let mut req = tonic::Request::new(request(&echo, FUNCTION_IO));
    req.set_timeout(Duration::from_secs(1));
    let status = raw.run_function(req).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("did not run"), "{status:?}");
    assert_eq!(daemon.runs("deadline_exceeded").await, 1.0);
    // It left the queue, and the slot stayed with the hanging run: the echo
    // never ran (the only ok call is the warm-up).
    assert_eq!(daemon.metric("xfn_runs_queued").await, 0.0);
    assert_eq!(daemon.metric("xfn_runs_in_flight").await, 1.0);
    assert_eq!(daemon.runs("ok").await, 1.0);
    running.abort();
    wait_until_gone("sleep 3615").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deadline_the_queue_cannot_meet_is_refused_at_once_while_ample_ones_are_all_served() {
    let registry = Registry::start();
    // Runs that take a while: a queue of them is seconds deep.
    let slow = script_image(
        &registry,
        "slow:v1",
        "input=$(cat); sleep 0.5; echo \"$input\"",
    );
    let daemon = Daemon::start(&["--max-concurrent-runs", "1"]).await;
    let client = daemon.client().await;
    let calls: Vec<_> = (0..14)
        .map(|i| {
            let mut client = client.clone();
            let input = format!("{FUNCTION_IO}# call {i}\n");
            let mut req = tonic::Request::new(request(&slow, &input));
            req.set_timeout(Duration::from_secs(120));
            tokio::spawn(async move { (input, client.run_function(req).await) })
        })
        .collect();
    // The daemon has seen the runs it estimates from (8), and 5 calls
    // still wait behind the one running: seconds of whole runs.
    daemon
        .wait_for_metric("xfn_runs_total{outcome=\"ok\"}", 8.0)
        .await;

    // A caller that can wait 200 ms is told now, not at its deadline (the
    // daemon's own answer: this client sets no timer of its own).
    let mut raw = daemon.raw_client().await;
    let mut req = tonic::Request::new(request(&slow, FUNCTION_IO));
    req.set_timeout(Duration::from_millis(200));
    let status = raw.run_function(req).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    for part in [
        "calls are queued for 1 run slots",
        "would wait at least",
        "past its deadline",
    ] {
        assert!(status.message().contains(part), "{part}: {status:?}");
    }

    // Everyone with an ample deadline is served.
    for call in calls {
        let (input, result) = call.await.unwrap();
        let out = result.unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
        assert_eq!(out.into_inner().output, input.as_bytes());
    }
    assert_eq!(daemon.runs("ok").await, 14.0);
    assert_eq!(daemon.runs("resource_exhausted").await, 1.0);
    assert_eq!(daemon.runs("deadline_exceeded").await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_runs_by_outcome() {
    let (registry, daemon, mut client) = start(&[]).await;
    let echo = echo_image(&registry, "echo:v1");
    served(&mut client, &echo).await;
    served(&mut client, &echo).await;
    refused(&mut client, "").await;
    let text = daemon.metrics_text().await;
    assert!(text.contains("xfn_runs_total{outcome=\"ok\"} 2"), "{text}");
    assert!(
        text.contains("xfn_runs_total{outcome=\"invalid_argument\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("xfn_run_duration_seconds_count{outcome=\"ok\"} 2"),
        "{text}"
    );
    assert!(text.contains("xfn_runs_in_flight 0"), "{text}");
    assert!(text.contains("xfn_limits_enforced "), "{text}");
    // The first call pulled the one-layer image; the second was warm.
    assert!(
        text.contains("xfn_image_manifests_resolved_total 1"),
        "{text}"
    );
    assert!(
        text.contains("xfn_image_blobs_downloaded_total 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn output_over_the_cap_is_resource_exhausted() {
    let (registry, _daemon, mut client) = start(&["--max-output-bytes", "65536"]).await;
    let image = script_image(&registry, "flood:v1", "cat >/dev/null; f=flood; yes xfn-$f");
    let status = refused(&mut client, &image).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("65536"), "{status:?}");
    wait_until_gone("yes xfn-flood").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn required_limits_that_cannot_be_enforced_are_a_failed_precondition() {
    let (registry, daemon, mut client) = start(&["--require-limits"]).await;
    let image = echo_image(&registry, "echo:v1");
    let result = client.run_function(request(&image, FUNCTION_IO)).await;
    // The daemon says whether this host (its cgroups) enforces limits.
    if daemon.metric("xfn_limits_enforced").await == 0.0 {
        let status = result.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("not enforced"), "{status:?}");
    } else {
        result.unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_policy_never_without_a_cached_image_is_a_failed_precondition() {
    let (registry, daemon, mut client) = start(&[]).await;
    let image = echo_image(&registry, "echo:v1");
    let never = |image: &str| {
        let mut req = request(image, FUNCTION_IO);
        req.image_pull_config = Some(pb::ImagePullConfig {
            pull_policy: pb::ImagePullPolicy::Never as i32,
            auth: None,
        });
        req
    };
    let status = client.run_function(never(&image)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // Once cached (a default call pulls it), Never runs it.
    served(&mut client, &image).await;
    let out = client
        .run_function(never(&image))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
}
