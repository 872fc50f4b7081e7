//! End to end: who may call `xfn start` (a refused neighbour's flood: `server_flood.rs`),
//! its connections' bounds (idle connections past the cap, handshakes that
//! never come, the idle timeout), any gRPC client's `:authority` (Python's
//! grpcio on the default socket), its health and reflection services, and
//! how it stops (SIGTERM drains runs in flight; the grace period ends the
//! rest). Restarts and PID 1: `server_restart.rs`.

use tonic::Code;
use xfn_testkit::*;

const RUNNER_SERVICE: &str = "apiextensions.fn.proto.v1alpha1.ContainerizedFunctionRunnerService";

/// What a client sees when the daemon drops its connection at accept: no
/// gRPC status from the server, but a transport error, which tonic reports
/// as Unavailable (connect failed), Unknown (reset) or Cancelled (closed),
/// depending on how far its handshake got.
fn assert_refused(status: &tonic::Status) {
    use std::error::Error;
    assert!(
        matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "{status:?}"
    );
    let transport = status
        .source()
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some());
    assert!(
        transport || status.code() == Code::Unavailable,
        "{status:?}"
    );
}

/// Whether the daemon runs in a user namespace of its own (its uid_map is
/// not the identity map), as the sandbox puts it.
fn in_user_namespace(pid: u32) -> bool {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).expect("uid_map");
    map.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"]
}

async fn call_as(daemon: &Daemon, uid: Option<u32>) -> Result<(), tonic::Status> {
    let channel = match daemon.channel_as(uid).await {
        Ok(channel) => channel,
        Err(err) => return Err(tonic::Status::unavailable(err.to_string())),
    };
    let mut client = Client::new(channel);
    // An invalid request: it never reaches the runner, so this checks only
    // whether the connection is served.
    match client.run_function(request("", FUNCTION_IO)).await {
        Err(status) if status.code() == Code::InvalidArgument => Ok(()),
        Err(status) => Err(status),
        Ok(_) => panic!("an empty image was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_with_another_uid_are_refused_at_accept() {
    let daemon = Daemon::start(&[]).await;
    // The daemon's own uid is served.
    call_as(&daemon, Some(NONROOT)).await.unwrap();
    // Another uid: the connection is dropped before any gRPC is spoken.
    let status = call_as(&daemon, Some(65533)).await.unwrap_err();
    assert_refused(&status);
    let log = daemon.log();
    assert!(log.contains("caller refused"), "{log}");
    // The refused caller harmed nothing.
    call_as(&daemon, Some(NONROOT)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn root_and_allowed_uids_are_served_although_xfn_sits_in_its_namespace() {
    let daemon = Daemon::start(&["--allow-uid", "65533"]).await;
    // Rootless, xfn maps only its own uid into its namespace, where root and
    // 65533 would read as the overflow uid; its gatekeeper, outside, sees
    // them as they are.
    assert!(in_user_namespace(daemon.pid()));
    call_as(&daemon, None).await.unwrap();
    call_as(&daemon, Some(65533)).await.unwrap();
    call_as(&daemon, Some(NONROOT)).await.unwrap();
    assert_refused(&call_as(&daemon, Some(65531)).await.unwrap_err());
    assert!(daemon.log().contains("caller refused"), "{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_root_daemon_with_a_mapped_range_serves_root_and_refuses_others() {
    // As root xfn maps a 65536-id range (host 100000+) and becomes its
    // namespace's root: host root and 65532 are both unmapped inside.
    let daemon = Daemon::start_as_root(&[]).await;
    assert!(in_user_namespace(daemon.pid()));
    call_as(&daemon, None).await.unwrap();
    assert_refused(&call_as(&daemon, Some(NONROOT)).await.unwrap_err());
    // Its gatekeeper (host root, outside) dies with it even after a crash,
    // and so do the supervisor, the init of its PID namespace and xfn
    // (`xfn::pidns`), though the mapped root may not signal host root.
    let mut daemon = daemon;
    let marker = daemon.cmdline_marker();
    assert_eq!(
        processes_with(&marker).len(),
        4,
        "supervisor, init, xfn and gatekeeper"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    daemon.wait().await;
    wait_until_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let daemon = Daemon::start(&[]).await;
    let channel = daemon.channel_as(Some(NONROOT)).await.unwrap();
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest {
            service: RUNNER_SERVICE.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response {response:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&RUNNER_SERVICE), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_runs_in_flight_finish_then_exits_zero() {
    let registry = Registry::start();
    let image = script_image(&registry, "slow:v1", "sleep 2; cat");
    let mut daemon = Daemon::start(&[]).await;
    daemon.sigterm_drains_a_call_in_flight(&image).await;
    // The gatekeeper left with it.
    wait_until_gone(&daemon.cmdline_marker()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_grace_period_ends_runs_that_outlive_it() {
    let registry = Registry::start();
    let image = sleeper_image(&registry, "hang:v1", 3621);
    let mut daemon = Daemon::start(&["--grace-period", "1s"]).await;
    let call = daemon.call_in_flight(&image, 1).await;
    daemon.sigterm();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    let exit = daemon.wait().await;
    assert!(exit.success(), "{exit}\n{}", daemon.log());
    wait_until_gone("sleep 3621").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_on_a_socket_path_with_the_same_caller_checks() {
    let dir = world_traversable_tempdir();
    let sockets = dir.path().join("sockets");
    dir_owned_by(&sockets, NONROOT);
    let path = sockets.join("xfn.sock");
    let daemon =
        Daemon::start_listening(Listen::Path(path.clone()), &["--allow-uid", "65533"]).await;
    assert!(path.exists());
    call_as(&daemon, Some(NONROOT)).await.unwrap();
    // Root may connect to any socket file; the gatekeeper accepts it.
    call_as(&daemon, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_on_tcp() {
    let daemon = Daemon::start_listening(Listen::Tcp, &[]).await;
    call_as(&daemon, None).await.unwrap();
    assert!(
        daemon.log().contains("callers cannot be checked"),
        "{}",
        daemon.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draining_daemon_refuses_new_connections() {
    let registry = Registry::start();
    let image = sleeper_image(&registry, "hang:v1", 3622);
    let mut daemon = Daemon::start(&["--grace-period", "1h"]).await;
    let call = daemon.call_in_flight(&image, 1).await;
    daemon.sigterm();
    // The run hangs and the grace period is long: the daemon is draining
    // for as long as this test wants. New connections are refused (the
    // gatekeeper left with the accept loop).
    let mut refused = false;
    for _ in 0..200 {
        if daemon.channel_as(Some(NONROOT)).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(refused, "still accepting while draining:\n{}", daemon.log());
    assert_eq!(daemon.metric("xfn_runs_in_flight").await, 1.0);
    assert!(daemon.try_wait().is_none());
    // The caller gives up: its run is killed, the drain completes, exit 0.
    call.abort();
    let exit = daemon.wait().await;
    assert!(exit.success(), "{exit}\n{}", daemon.log());
    wait_until_gone("sleep 3622").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_squatted_abstract_name_makes_start_exit_non_zero_naming_it() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("xfn-test/{}/squatted", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _rival = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let dir = world_traversable_tempdir();
    let cache = nonroot_cache(&dir);
    let out = unprivileged(NONROOT, std::path::Path::new(env!("CARGO_BIN_EXE_xfn")))
        .arg("start")
        .arg("--address")
        .arg(format!("@{name}"))
        .arg("--cache-dir")
        .arg(&cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("@{name}")), "{stderr}");
    assert!(stderr.contains("already held"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_function_sharing_the_runners_network_cannot_call_it_but_reaches_loopback() {
    // A TCP server on 127.0.0.1, in the network namespace xfn runs in.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in server.incoming().flatten() {
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request);
            let _ = conn.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nreached");
        }
    });
    let daemon = Daemon::start(&[]).await;
    let registry = Registry::start();
    let script = format!(
        "cat >/dev/null; /bin/dial '{}'; wget -q -O - http://127.0.0.1:{port}/",
        daemon.socket
    );
    let image = ImageBuilder::new()
        .layer(Layer::busybox().file("/bin/dial", 0o755, dial_binary()))
        .entrypoint(["/bin/sh", "-c", &script])
        .push(&registry, "dialer:v1")
        .reference;
    // The probe works: the daemon's own uid, from the host, is served.
    let host = std::process::Command::new("sh")
        .arg("-c")
        .arg("cat > /tmp/xfn-dial-$$ && chmod 755 /tmp/xfn-dial-$$ && echo /tmp/xfn-dial-$$")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    host.stdin
        .as_ref()
        .unwrap()
        .write_all(&dial_binary())
        .unwrap();
    let path = String::from_utf8(host.wait_with_output().unwrap().stdout).unwrap();
    let path = std::path::PathBuf::from(path.trim());
    let probe = unprivileged(NONROOT, &path)
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "served");

    let mut req = request(&image, FUNCTION_IO);
    req.run_function_config = Some(xfn_testkit::pb::RunFunctionConfig {
        network: Some(xfn_testkit::pb::NetworkConfig {
            policy: xfn_testkit::pb::NetworkPolicy::Runner as i32,
        }),
        ..Default::default()
    });
    let out = daemon
        .client()
        .await
        .run_function(req)
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    let output = String::from_utf8(out.into_inner().output).unwrap();
    // The kernel refuses the function's connect where Landlock scopes
    // abstract sockets (src/sandbox/scope.rs); elsewhere the gatekeeper
    // closes it, as a caller in a container.
    if daemon.log().contains("the kernel refuses their connects") {
        assert_eq!(
            output,
            "unreachable: Operation not permitted\nreached",
            "{}",
            daemon.log()
        );
    } else {
        eprintln!("the kernel cannot scope abstract sockets: the gatekeeper refuses instead");
        assert_eq!(output, "refused\nreached", "{}", daemon.log());
        assert!(
            daemon.log().contains("runs in a container"),
            "{}",
            daemon.log()
        );
    }
}

/// The kB a `released_kb=N ... MESSAGE` line of the daemon's log gave back,
/// for each such line.
fn released_kb(log: &str, message: &str) -> Vec<u64> {
    log.lines()
        .filter(|line| line.contains(message))
        .filter_map(|line| {
            let rest = line.split("released_kb=").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_daemon_and_gatekeeper_give_back_the_code_pages_their_calls_ran() {
    let registry = Registry::start();
    let image = echo_image(&registry, "echo:v1");
    // Default flags: the release is not a flag, it is what a sidecar does.
    let daemon = Daemon::start(&[]).await;
    let (xfn, gate) = (daemon.xfn_pid(), daemon.gatekeeper_pid());
    daemon.call_ok(&image).await;
    daemon.call_ok(&image).await;
    let (xfn_busy, gate_busy) = (status_field(xfn, "VmRSS"), status_field(gate, "VmRSS"));
    let daemon_released = |log: &str| released_kb(log, "idle daemon: file pages released");
    let gate_released = |log: &str| released_kb(log, "idle gatekeeper: file pages released");
    // Both look every 5 s (xfn::resident::IDLE_AFTER); bounded, so that a
    // release that never comes fails naming it.
    let started_with = daemon_released(&daemon.log()).len();
    for _ in 0..300 {
        let log = daemon.log();
        if daemon_released(&log).len() > started_with && !gate_released(&log).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let log = daemon.log();
    let (daemon_kb, gate_kb) = (daemon_released(&log), gate_released(&log));
    assert!(
        daemon_kb.len() > started_with && !gate_kb.is_empty(),
        "no idle release after the calls:\n{log}"
    );
    let (xfn_idle, gate_idle) = (status_field(xfn, "VmRSS"), status_field(gate, "VmRSS"));
    // What the calls brought back went again: megabytes of the daemon's
    // code, and what the gatekeeper ran to accept the connections.
    assert!(
        daemon_kb.last().is_some_and(|&kb| kb >= 1024) && xfn_idle < xfn_busy,
        "xfn: {xfn_busy} kB after the calls, {xfn_idle} kB idle, released {daemon_kb:?}\n{log}"
    );
    assert!(
        gate_idle < gate_busy,
        "gatekeeper: {gate_busy} kB after the calls, {gate_idle} kB idle, released {gate_kb:?}\n{log}"
    );
    // And it still serves, faulting back in what it runs.
    daemon.call_ok(&image).await;
}

/// What an HTTP/2 client sends first: the preface and an empty SETTINGS.
const HTTP2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// The frame types in what the server sent on `conn` until it closed it
/// (bounded: a connection never closed fails the test, not hangs it).
async fn frames_until_closed(conn: &mut tokio::net::UnixStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        conn.read_to_end(&mut bytes),
    )
    .await
    .expect("the daemon never closed the connection");
    // A cut connection may also end in a reset.
    if let Err(err) = read {
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }
    let mut kinds = Vec::new();
    let mut rest = bytes.as_slice();
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        kinds.push(rest[3]);
        rest = &rest[(9 + len).min(rest.len())..];
    }
    kinds
}

const GOAWAY: u8 = 0x7;

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_past_the_default_cap_make_room_and_new_callers_are_served() {
    use tokio::io::AsyncWriteExt;
    let registry = Registry::start();
    let image = echo_image(&registry, "echo:v1");
    // Defaults: --max-connections 1024.
    let daemon = Daemon::start(&[]).await;
    daemon.call_ok(&image).await;
    // An allowed caller opens connections, says hello, and goes quiet.
    let mut idle = Vec::new();
    for _ in 0..1100 {
        let mut conn = daemon.connect_raw(Some(NONROOT)).await.expect("connect");
        conn.write_all(HTTP2_HELLO).await.expect("hello");
        idle.push(conn);
    }
    // Past the cap, each newcomer made the longest idle one close (or cut
    // one already asked to): 76 closed in all.
    let made_room = || async {
        daemon
            .metric(r#"xfn_connections_closed_total{reason="evicted"}"#)
            .await
            + daemon
                .metric(r#"xfn_connections_closed_total{reason="unresponsive"}"#)
                .await
    };
    for _ in 0..600 {
        if made_room().await >= 76.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(made_room().await >= 76.0, "{}", daemon.metrics_text().await);
    // Other callers, on new connections, are served.
    for _ in 0..5 {
        daemon.call_ok(&image).await;
    }
    // What was closed is gone: the open connections are back under the cap.
    for _ in 0..600 {
        if daemon.metric("xfn_connections_open").await <= 1024.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let open = daemon.metric("xfn_connections_open").await;
    assert!(open <= 1024.0, "{open} connections open");
    // The oldest one is gone.
    frames_until_closed(&mut idle[0]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_idle_past_the_idle_timeout_is_sent_goaway_and_closed() {
    use tokio::io::AsyncWriteExt;
    let daemon = Daemon::start(&["--idle-connection-timeout", "1s"]).await;
    let mut conn = daemon.connect_raw(Some(NONROOT)).await.expect("connect");
    conn.write_all(HTTP2_HELLO).await.expect("hello");
    assert!(frames_until_closed(&mut conn).await.contains(&GOAWAY));
    let closed = r#"xfn_connections_closed_total{reason="idle_timeout"}"#;
    assert!(daemon.metric(closed).await >= 1.0);
    // The daemon goes on serving.
    call_as(&daemon, Some(NONROOT)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_that_never_handshake_are_cut_while_other_callers_are_served() {
    let registry = Registry::start();
    let image = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&["--max-connections", "16", "--handshake-timeout", "2s"]).await;
    daemon.call_ok(&image).await;
    // More silent connections than the cap.
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(daemon.connect_raw(Some(NONROOT)).await.expect("connect"));
    }
    for _ in 0..3 {
        daemon.call_ok(&image).await;
    }
    // Every silent one is closed: evicted for newcomers, or cut at its
    // handshake timeout.
    for conn in &mut silent {
        frames_until_closed(conn).await;
    }
    let cut = r#"xfn_connections_closed_total{reason="handshake_timeout"}"#;
    assert!(
        daemon.metric(cut).await >= 1.0,
        "{}",
        daemon.metrics_text().await
    );
    daemon.call_ok(&image).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_grpcio_client_calls_run_function_on_the_default_socket() {
    let registry = Registry::start();
    let image = echo_image(&registry, "echo:v1");
    // The daemon's network namespace reaches no registry: pull first.
    let dir = world_traversable_tempdir();
    let cache = nonroot_cache(&dir);
    let pulled = unprivileged(NONROOT, std::path::Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["pull", "--cache-dir"])
        .arg(&cache)
        .arg(&image)
        .output()
        .unwrap();
    assert!(pulled.status.success(), "{pulled:?}");
    let daemon = Daemon::start_on_the_default_socket(&cache, &[]).await;
    // grpcio's own :authority for this target is
    // "crossplane%2Ffn%2Fdefault.sock", which the http crate refuses
    // (xfn's server reads it as localhost, and logs it once).
    let target = format!("unix-abstract:{DEFAULT_SOCKET}");
    for _ in 0..2 {
        let response = grpcio_run_function(&daemon, &target, &request(&image, FUNCTION_IO))
            .unwrap_or_else(|status| panic!("{status}\n{}", daemon.log()));
        assert_eq!(response.output, FUNCTION_IO.as_bytes());
    }
    assert!(
        daemon.log().contains("crossplane%2Ffn%2Fdefault.sock"),
        "{}",
        daemon.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn why_a_malformed_request_is_reset_is_logged_at_the_default_level() {
    use tokio::io::AsyncWriteExt;
    // No --debug: what a sidecar logs.
    let daemon = Daemon::start_without_debug_log(&[]).await;
    // HEADERS without :method (HPACK literals, not indexed).
    let literal = |name: &[u8], value: &[u8]| {
        let mut out = vec![0, name.len() as u8];
        out.extend_from_slice(name);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
        out
    };
    let mut block = literal(b":scheme", b"http");
    block.extend(literal(b":path", b"/x"));
    let mut bytes = HTTP2_HELLO.to_vec();
    bytes.extend_from_slice(&[0, 0, block.len() as u8, 0x1, 0x5, 0, 0, 0, 1]);
    bytes.extend(block);
    let mut conn = daemon.connect_raw(Some(NONROOT)).await.expect("connect");
    conn.write_all(&bytes).await.expect("write");
    daemon.wait_for_log("missing :method", 1).await;
    // The daemon goes on serving.
    call_as(&daemon, Some(NONROOT)).await.unwrap();
}
