//! What callers and functions cannot do to the real `xfn start` (as uid
//! 65532, no capabilities): deep input is refused before it is parsed
//! while other calls are served.
mod server_common;
mod support;

use std::time::Instant;

use server_common::*;
use support::*;
use tonic::Code;

/// Every input the daemon accepts is at most this (`--max-input-bytes`'s
/// default).
const INPUT_CAP: usize = 4 << 20;

/// A FunctionIO of exactly [`INPUT_CAP`] bytes whose `observed` opens flow
/// sequences to its end: libyaml took 11.9 s for 100,000 of them before
/// the bound, and grows with their square.
fn deep_flow_input() -> String {
    let head = "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: ";
    format!("{head}{}", "[".repeat(INPUT_CAP - head.len()))
}

/// The same size, nested by indentation: `- - - …` on one line.
fn deep_block_input() -> String {
    let head = "observed:\n";
    let body = "- ".repeat((INPUT_CAP - head.len() - 1) / 2);
    let text = format!("{head}{body}x");
    let pad = " ".repeat(INPUT_CAP - text.len());
    text + &pad
}

#[tokio::test(flavor = "multi_thread")]
async fn deep_input_at_the_cap_is_refused_before_parsing_while_other_calls_are_served() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&[]).await;
    daemon.call_ok(&echo).await;
    let (flow, block) = (deep_flow_input(), deep_block_input());
    assert_eq!((flow.len(), block.len()), (INPUT_CAP, INPUT_CAP));

    let mut calls = Vec::new();
    for i in 0..8 {
        let input = if i % 2 == 0 {
            flow.clone()
        } else {
            block.clone()
        };
        let mut client = daemon.client().await;
        let image = echo.clone();
        calls.push(tokio::spawn(async move {
            let started = Instant::now();
            let answer = client.run_function(request(&image, &input)).await;
            (answer, started.elapsed())
        }));
    }
    // Served meanwhile: calls of other callers, one after another.
    for _ in 0..4 {
        daemon.call_ok(&echo).await;
    }
    for call in calls {
        let (answer, took) = call.await.unwrap();
        let status = answer.expect_err("deep input is refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        // Refused at the 65th level, on line 3 or 2: the scan stopped
        // there, not at the end of the 4 MiB.
        let message = status.message();
        assert!(
            message.contains("nested more than 64 levels deep (at line")
                && message.contains("refused before parsing"),
            "{status:?}"
        );
        eprintln!("deep call refused after {took:?}: {message}");
    }
    assert_eq!(
        daemon
            .metric("xfn_runs_total{outcome=\"invalid_argument\"}")
            .await,
        8.0
    );
    assert_eq!(daemon.metric("xfn_runs_total{outcome=\"ok\"}").await, 5.0);
}
