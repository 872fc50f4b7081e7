//! `xfn host` under hostile functions and callers (issue 41, round 4):
//! each test makes one attack against the real binary — functions that
//! misbehave are `tests/fixtures/fn_server.rs` with a misbehaviour switch,
//! run by xfn in containers as any hosted function — and shows the bound
//! or the refusal, measured on xfn's own peak memory (VmHWM) or counts.
//!
//! Needs: crun, docker-registry, busybox-static, prlimit (util-linux).
use xfn_testkit as support;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use support::*;
use tonic::Code;
use xfn::proto::v1;

use crate::host_e2e::{functions_file, grpc_request, insecure_channel, messages, XfnHost, MIB};

/// `xfn host --insecure` hosting `functions` (name, entrypoint arguments
/// of the test function server), with `flags`.
fn host(dir: &Path, registry: &Registry, functions: &[(&str, &[&str])], flags: &[&str]) -> XfnHost {
    host_as(xfn_command(), dir, registry, functions, flags)
}

fn host_as(
    command: std::process::Command,
    dir: &Path,
    registry: &Registry,
    functions: &[(&str, &[&str])],
    flags: &[&str],
) -> XfnHost {
    let packages: Vec<(String, String)> = functions
        .iter()
        .map(|(name, args)| {
            let tag = format!("bounds-{name}:v1");
            (
                name.to_string(),
                function_server_image(registry, &tag, args),
            )
        })
        .collect();
    let listed: Vec<(&str, &str)> = packages
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_str()))
        .collect();
    let file = functions_file(dir, &listed);
    let mut all = vec!["--insecure"];
    all.extend_from_slice(flags);
    let host = XfnHost::start_as(command, dir, &file, &all);
    host.wait_for("every package is pulled", || {
        host.log_text().matches("function package ready").count() == functions.len()
    });
    host
}

/// One v1 call of `request` to the function `name`, with `deadline`, its
/// answer as bytes.
async fn call(
    host: &XfnHost,
    name: &str,
    request: Bytes,
    deadline: Option<Duration>,
) -> Result<Bytes, tonic::Status> {
    let channel = insecure_channel(host.port, name).await;
    raw_call(channel, request, deadline).await
}

async fn raw_call(
    channel: tonic::transport::Channel,
    request: Bytes,
    deadline: Option<Duration>,
) -> Result<Bytes, tonic::Status> {
    let call = raw::call(channel, raw::V1_RUN_FUNCTION, request, 128 << 20);
    match deadline {
        // The caller's deadline as Crossplane gives it (grpc-timeout) is
        // not what raw::call sends: the client gives up itself.
        Some(deadline) => tokio::time::timeout(deadline, call)
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("the client gave up"))),
        None => call.await,
    }
}

fn small_request(tag: &str) -> Bytes {
    Bytes::from(grpc_request(tag, 0.0).encode_to_vec())
}

/// Sixteen answers that declare 10 bytes and send 60 MiB: each is cut at
/// its declared length (INTERNAL, naming it), so xfn reads 15 bytes of
/// each. Before: each was charged 1 KiB of the response budget and read
/// whole, xfn's peak +945 MiB past a 512 MiB budget.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_longer_than_it_declares_is_cut_at_its_declared_length() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let lying: &[&str] = &["--flood", "62914560", "--declare", "10"];
    let host = host(
        dir.path(),
        &registry,
        &[("fn-long", lying)],
        &["--memory", "4Gi"],
    );
    // The server started by a first call, so what follows is the answers.
    let first = call(&host, "fn-long", small_request("0"), None).await;
    let base = host.own_peak();
    let calls = (0..16).map(|i| {
        let request = small_request(&i.to_string());
        let host = &host;
        async move { call(host, "fn-long", request, None).await }
    });
    let answers = futures::future::join_all(calls).await;
    let grown = host.own_peak().saturating_sub(base);
    eprintln!(
        "measured: xfn's VmHWM +{} MiB across 16 answers declaring 10 bytes and sending 60 MiB",
        grown / MIB
    );
    for answer in std::iter::once(first).chain(answers) {
        let status = answer.expect_err("an answer longer than it declares was passed on");
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert!(
            status
                .message()
                .contains("longer than the 10 bytes it declares"),
            "{status:?}"
        );
    }
    // Read up to the declared length, never the 60 MiB after it.
    assert!(grown < 64 * MIB, "+{} MiB", grown / MIB);
    // The server keeps serving (each answer is reset, not its connection).
    assert_eq!(host.metric("cold_starts_total", "fn-long"), 1);
}

/// Eight answers that declare 64 MiB and then send a byte a second: one
/// function's answers hold at most its share of --response-budget, so
/// another function is answered at once, and an answer that stalls below
/// the minimum rate is given up, its room given back. Before: the eight
/// held the whole 512 MiB and the other function answered 0 of 5 calls
/// with 5 s deadlines.
#[tokio::test(flavor = "multi_thread")]
async fn answers_that_stall_hold_no_more_than_their_share_and_are_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let stalling: &[&str] = &["--flood", "67108864", "--trickle"];
    let host = host(
        dir.path(),
        &registry,
        &[("fn-stall", stalling), ("fn-fine", &[])],
        &["--memory", "4Gi"],
    );
    call(&host, "fn-fine", small_request("warm"), None)
        .await
        .unwrap();
    let base = host.own_peak();
    let stalled: Vec<_> = (0..8)
        .map(|i| {
            let request = small_request(&format!("stall-{i}"));
            let port = host.port;
            tokio::spawn(async move {
                let started = Instant::now();
                let channel = insecure_channel(port, "fn-stall").await;
                let answer = raw_call(channel, request, Some(Duration::from_secs(600))).await;
                (answer, started.elapsed())
            })
        })
        .collect();
    host.wait_for("the eight answers have begun", || {
        host.log_text().matches("one a second").count() >= 8
    });
    // Their prefixes read, two of them hold the function's whole share (a
    // quarter of the default --response-budget, 512 MiB), the other six
    // wait for room.
    host.wait_for("two stalled answers hold the function's share", || {
        host.metric("response_bytes_held", "fn-stall") == 128 * MIB
    });
    let fine = (0..5).map(|i| {
        let request = small_request(&format!("fine-{i}"));
        let host = &host;
        async move { call(host, "fn-fine", request, Some(Duration::from_secs(5))).await }
    });
    let answered = futures::future::join_all(fine)
        .await
        .into_iter()
        .filter(|a| a.is_ok())
        .count();
    eprintln!("measured: the other function answered {answered} of 5 calls (5 s deadlines)");
    assert_eq!(answered, 5, "{}", host.log_text());
    for call in stalled {
        let (answer, took) = call.await.unwrap();
        let status = answer.expect_err("a stalled answer was answered");
        eprintln!("a stalled answer ended after {took:?}: {status:?}");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("stalled"), "{status:?}");
    }
    host.wait_for("the given-up answers' room is given back", || {
        host.metric("response_bytes_held", "fn-stall") == 0
    });
    let grown = host.own_peak().saturating_sub(base);
    eprintln!(
        "measured: xfn's VmHWM +{} MiB across eight stalled 64 MiB answers",
        grown / MIB
    );
    assert!(grown < 64 * MIB, "+{} MiB", grown / MIB);
}

/// 150 calls of 4 MB to one busy function (16 run, the rest wait for its
/// server): the calls waiting hold at most --max-queued-bytes of requests,
/// host-wide, past which a call is refused RESOURCE_EXHAUSTED naming it.
/// Before: the host's own queue for a function's servers counted calls
/// only (1024 per function): 134 waited, xfn's peak +580 MiB (26 → 607
/// MiB) whatever --max-queued-bytes said.
#[tokio::test(flavor = "multi_thread")]
async fn calls_waiting_for_a_busy_function_hold_no_more_than_the_queued_byte_cap() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let host = host(
        dir.path(),
        &registry,
        &[("fn-busy", &[])],
        &["--max-queued-bytes", "64Mi", "--memory", "4Gi"],
    );
    call(&host, "fn-busy", small_request("warm"), None)
        .await
        .unwrap();
    let base = host.own_peak();
    // 4 MB of input beside `sleep`: each call holds its server for 120 s.
    let mut busy = grpc_request("busy", 120.0);
    let pad = prost_types::value::Kind::StringValue("x".repeat(4_000_000));
    busy.input
        .as_mut()
        .unwrap()
        .fields
        .insert("pad".into(), prost_types::Value { kind: Some(pad) });
    let request = Bytes::from(busy.encode_to_vec());
    let channel = insecure_channel(host.port, "fn-busy").await;
    let mut calls = Vec::new();
    for i in 0..150 {
        let (channel, request) = (channel.clone(), request.clone());
        calls.push(tokio::spawn(async move {
            raw_call(channel, request, Some(Duration::from_secs(300))).await
        }));
        // One at a time into xfn, so what it holds is what it queued, not
        // requests still arriving side by side.
        host.wait_for("the call reaches the function", || {
            host.metric("calls_total", "fn-busy") >= i + 2
        });
    }
    let grown = host.own_peak().saturating_sub(base);
    let queued = host.metric("calls_queued", "fn-busy");
    let mut refused = Vec::new();
    for call in calls {
        if call.is_finished() {
            refused.push(call.await.unwrap().expect_err("a call of 120 s answered"));
        } else {
            call.abort();
        }
    }
    eprintln!(
        "measured: 150 calls of 4 MB to a busy function: {queued} queued, {} refused, xfn's VmHWM +{} MiB",
        refused.len(),
        grown / MIB
    );
    assert!(!refused.is_empty(), "nothing was refused: {queued} queued");
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("--max-queued-bytes"),
            "{status:?}"
        );
    }
    assert!(
        queued <= 16,
        "{queued} calls of 4 MB queued under a 64 MiB cap"
    );
    // 64 MiB queued, 16 running (each request held and sent on: 2 × 4 MB).
    assert!(grown < (64 + 16 * 8 + 32) * MIB, "+{} MiB", grown / MIB);
}

/// --max-servers 2, three functions called once each: the third finds no
/// slot free, and the server idle the longest stops to make room (counted
/// in `xfn_host_servers_evicted_total`). Before: the third call waited
/// for a slot until its deadline while both servers sat idle, and would
/// until --server-idle (5 minutes) passed with no call to either.
#[tokio::test(flavor = "multi_thread")]
async fn with_every_server_slot_taken_the_least_recently_used_idle_server_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let host = host(
        dir.path(),
        &registry,
        &[("fn-a", &[]), ("fn-b", &[]), ("fn-c", &[])],
        &["--max-servers", "2"],
    );
    for name in ["fn-a", "fn-b"] {
        call(&host, name, small_request(name), None).await.unwrap();
    }
    // fn-a is the least recently used of the two.
    let third = call(
        &host,
        "fn-c",
        small_request("c"),
        Some(Duration::from_secs(30)),
    )
    .await;
    let third = third.unwrap_or_else(|s| panic!("{s:?}\n{}", host.log_text()));
    let third = v1::RunFunctionResponse::decode(third).unwrap();
    assert_eq!(messages(&third), ["from the grpc function"]);
    assert_eq!(host.metric("servers_evicted_total", "fn-a"), 1);
    assert_eq!(host.metric("servers_evicted_total", "fn-b"), 0);
    assert_eq!(host.metric("servers_running", "fn-a"), 0);
    assert_eq!(host.servers(), 2);
    // fn-a comes back by evicting fn-b, now the least recently used.
    call(
        &host,
        "fn-a",
        small_request("a2"),
        Some(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(host.metric("servers_evicted_total", "fn-b"), 1);
}

/// 2,100 idle connections to the metrics port of an xfn host limited to
/// 2,048 descriptors: the port holds at most its own cap of them (the
/// oldest idle closed for each newcomer), so /healthz still answers and
/// a function still starts and answers. Before: they took every
/// descriptor; calls and cold starts got DEADLINE_EXCEEDED and /healthz
/// was silent.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_to_the_metrics_port_leave_health_and_calls_their_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let mut prlimit = std::process::Command::new("prlimit");
    prlimit.arg("--nofile=2048:2048").arg(xfn_binary());
    let host = host_as(prlimit, dir.path(), &registry, &[("fn-late", &[])], &[]);
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], host.metrics_port));
    let mut idle = Vec::new();
    for _ in 0..2100 {
        // Past xfn's cap the kernel's backlog fills: those may not connect.
        if let Ok(stream) =
            std::net::TcpStream::connect_timeout(&metrics, Duration::from_millis(200))
        {
            idle.push(stream);
        }
    }
    // The daemon's descriptors (it runs under prlimit's pid, re-executed
    // into its namespaces).
    let xfn_fds = host
        .own_pids()
        .into_iter()
        .map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count()))
        .max()
        .unwrap_or(0);
    eprintln!(
        "measured: {} idle connections to the metrics port made; xfn holds {xfn_fds} descriptors",
        idle.len()
    );
    let health = tokio::task::spawn_blocking({
        let port = host.metrics_port;
        move || healthz(port)
    });
    let health = tokio::time::timeout(Duration::from_secs(60), health)
        .await
        .expect("/healthz never answered under the flood")
        .unwrap();
    assert!(
        health.starts_with("HTTP/1.1 200") || health.starts_with("HTTP/1.0 200"),
        "{health}"
    );
    // A cold start and a call, with the connections still open.
    let answer = call(
        &host,
        "fn-late",
        small_request("late"),
        Some(Duration::from_secs(60)),
    )
    .await;
    answer.unwrap_or_else(|s| panic!("{s:?}\n{}", host.log_text()));
    assert!(xfn_fds < 1024, "xfn holds {xfn_fds} descriptors");
    assert!(
        !host.log_text().contains("Too many open files"),
        "{}",
        host.log_text()
    );
    drop(idle);
}

/// The answer to `GET /healthz` on `127.0.0.1:port`.
fn healthz(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A bound against never, not a timing check.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(90)));
    write!(stream, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// Ten calls at once to a function whose server exits as it starts: two
/// starts (one failure alone waits for nothing), and the calls after them
/// refused UNAVAILABLE for the backoff (1 s, doubling to 1 minute) naming
/// the failure. Before: a
/// container was created and started for every call.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_exits_as_it_starts_is_not_started_again_for_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    // clap refuses the flag's value: the server exits with code 2.
    let crashing: &[&str] = &["--serve", "nonsense"];
    let host = host(dir.path(), &registry, &[("fn-crash", crashing)], &[]);
    let calls = (0..10).map(|i| {
        let request = small_request(&i.to_string());
        let host = &host;
        async move { call(host, "fn-crash", request, Some(Duration::from_secs(120))).await }
    });
    let answers = futures::future::join_all(calls).await;
    let starts = host
        .log_text()
        .matches("function server did not start")
        .count();
    eprintln!(
        "measured: 10 calls at once to a function whose server exits as it starts: {starts} starts"
    );
    let mut backed_off = 0;
    for answer in answers {
        let status = answer.expect_err("a server that exits answered");
        assert!(
            matches!(status.code(), Code::Aborted | Code::Unavailable),
            "{status:?}"
        );
        backed_off += usize::from(status.message().contains("no new one is started"));
    }
    assert!(starts <= 2, "{starts} starts\n{}", host.log_text());
    assert!(backed_off >= 8, "{backed_off} refused for the backoff");
}

/// Eight calls of 4 MiB of empty values wait behind one run of a
/// stdin/stdout function (`--max-concurrent-runs 1`): each waits holding
/// only its request's JSON, the bytes its admission counts. Before: the
/// request was decoded into a message tree before admission and held
/// while queued: xfn's peak +822 MiB; now +372 MiB (debug build).
#[tokio::test(flavor = "multi_thread")]
async fn stdin_stdout_calls_waiting_for_a_run_hold_only_the_json_admission_counts() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let package = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sleep", "120"])
        .label("io.crossplane.xfn.kind", "stdin-stdout")
        .push(&registry, "bounds-stdin:v1")
        .reference;
    let file = functions_file(dir.path(), &[("fn-stdin", package.as_str())]);
    let flags = [
        "--insecure",
        "--max-concurrent-runs",
        "1",
        "--timeout",
        "5m",
    ];
    let host = XfnHost::start_as(xfn_command(), dir.path(), &file, &flags);
    host.wait_for("the package is pulled", || {
        host.log_text().contains("function package ready")
    });
    let mut request = grpc_request("empty", 0.0);
    let empty = prost_types::Value { kind: None };
    let list = prost_types::ListValue {
        // Just under --max-recv-message-size (4Mi): 2 bytes a value.
        values: vec![empty; 2_000_000],
    };
    request.input.as_mut().unwrap().fields.insert(
        "pad".into(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::ListValue(list)),
        },
    );
    let request = Bytes::from(request.encode_to_vec());
    assert!(request.len() >= 4_000_000, "{} bytes", request.len());
    let channel = insecure_channel(host.port, "fn-stdin").await;
    let base = host.own_peak();
    let mut calls = Vec::new();
    for i in 0..9 {
        let (channel, request) = (channel.clone(), request.clone());
        calls.push(tokio::spawn(async move {
            raw_call(channel, request, Some(Duration::from_secs(300))).await
        }));
        // One at a time, so what xfn holds is what it queued.
        host.wait_for("the call reaches the function", || {
            host.metric("calls_total", "fn-stdin") > i
        });
        host.wait_for("the call runs or waits", || {
            host.0.metric("xfn_runs_queued") >= i
        });
    }
    let grown = host.own_peak().saturating_sub(base);
    let queued = host.0.metric("xfn_runs_queued");
    for call in calls {
        assert!(!call.is_finished(), "a call ended: {:?}", call.await);
        call.abort();
    }
    eprintln!(
        "measured: 9 stdin/stdout calls of 4 MiB of empty values, {queued} queued: xfn's VmHWM +{} MiB",
        grown / MIB
    );
    assert_eq!(queued, 8);
    // Each queued call's JSON is `null,` per value (~10 MiB); one
    // conversion at a time builds its tree (~300 MiB) and lets it go.
    assert!(grown < 8 * 16 * MIB + 320 * MIB, "+{} MiB", grown / MIB);
}
