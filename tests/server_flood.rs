//! Connect floods against `xfn start`: allowed callers keep being served
//! while a uid the daemon refuses loops `connect()` (the refusals counted and
//! logged sparingly), and while functions with `NetworkPolicy Runner` (in
//! the socket's network namespace, on xfn's own uid) loop it: the kernel
//! refuses theirs (`src/sandbox/scope.rs`); and while allowed callers open
//! connections faster than they close, never more than one over the cap.
//!
//! In a binary of its own (`server_alone`, run with nothing else): the
//! flood races the gatekeeper for the two CPUs, so any other test's work
//! (a daemon, an image being built and pushed) would take part in the race
//! and decide its outcome instead of the code under test.

use xfn_testkit::*;

/// Loops `connect()` to `@name` as `uid` until `stop` (or 5 million
/// attempts), closing each connection at once: a neighbour's flood.
fn flood_connects(
    name: String,
    uid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    attempts: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::sync::atomic::Ordering::Relaxed;
    std::thread::spawn(move || {
        let keep = libc::uid_t::MAX;
        // SAFETY: raw setresgid/setresuid change this thread's credentials
        // only; the thread runs nothing but the loop below.
        let rc = unsafe { libc::syscall(libc::SYS_setresgid, keep, uid, keep) };
        assert_eq!(rc, 0, "setresgid");
        // SAFETY: as above.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, keep, uid, keep) };
        assert_eq!(rc, 0, "setresuid");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        while !stop.load(Relaxed) && attempts.load(Relaxed) < 5_000_000 {
            // Blocking: it fills the listen queue whenever it can.
            let _ = std::os::unix::net::UnixStream::connect_addr(&addr);
            attempts.fetch_add(1, Relaxed);
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_neighbours_connect_flood_leaves_every_allowed_call_served_and_is_counted() {
    let _alone = crate::ALONE.lock().await;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    let registry = Registry::start();
    let image = echo_image(&registry, "echo:v1");
    // The flood races the gatekeeper for the CPUs: no other test's daemon
    // may take part in the race.
    let daemon = Daemon::start_alone(&[]).await;
    daemon.call_ok(&image).await;
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicU64::new(0));
    let flood = flood_connects(daemon.socket.clone(), 65531, stop.clone(), attempts.clone());
    for _ in 0..600 {
        if attempts.load(Relaxed) >= 10_000 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        attempts.load(Relaxed) >= 10_000,
        "the flood did not get going"
    );
    // Thirty calls, each on a new connection made as gRPC clients make
    // them (non-blocking: a full listen queue fails the connect), and
    // made again after a failed connect as gRPC clients reconnect: the
    // flood and the gatekeeper race for the two CPUs, so now and then
    // the queue is full at the moment of a connect (seen on the code
    // before issue 31 too, 1 of 4 runs). A gatekeeper that loses the race
    // fails most first tries, and a call whose three tries all fail.
    let mut failed = Vec::new();
    let mut retried = Vec::new();
    for _ in 0..30 {
        for attempt in 1..=3 {
            let result = match daemon.channel_as(Some(NONROOT)).await {
                Ok(channel) => Client::new(channel)
                    .run_function(request(&image, FUNCTION_IO))
                    .await
                    .map(|_| ()),
                Err(err) => Err(tonic::Status::unavailable(err.to_string())),
            };
            match result {
                Ok(()) => break,
                Err(status) if attempt < 3 && status.code() == tonic::Code::Unavailable => {
                    retried.push(status);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(status) => {
                    failed.push(status);
                    break;
                }
            }
        }
    }
    eprintln!("{} of 30 calls connected again: {retried:?}", retried.len());
    assert!(
        retried.len() <= 5,
        "{} of 30 calls' connects failed during the flood: {retried:?}",
        retried.len()
    );
    stop.store(true, Relaxed);
    flood.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} of 30 calls failed during the flood: {failed:?}\n{}",
        failed.len(),
        daemon.log()
    );
    let refused = daemon
        .metric(r#"xfn_callers_refused_total{reason="uid"}"#)
        .await;
    assert!(refused >= 10_000.0, "{}", daemon.metrics_text().await);
    // Logged at most once per interval, each line saying how many it skipped.
    let lines = daemon.log().matches("caller refused").count();
    assert!(
        lines >= 1 && (lines as f64) * 1000.0 <= refused,
        "{lines} lines for {refused} refusals"
    );
    assert!(daemon.log().contains("suppressed"), "{}", daemon.log());
}

/// The kernel's Landlock ABI, 0 without Landlock.
fn landlock_abi() -> i64 {
    // SAFETY: the version query of landlock_create_ruleset takes no
    // attribute (NULL, size 0, flag LANDLOCK_CREATE_RULESET_VERSION).
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    abi.max(0)
}

/// The counts a flooding function keeps in its /tmp/flood (flood.c), by
/// name: attempts, connected, refused (EPERM), other, errno.
fn flood_counts(pid: u32) -> Option<std::collections::BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/root/tmp/flood")).ok()?;
    Some(
        text.split_whitespace()
            .filter_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                Some((key.to_string(), value.parse().ok()?))
            })
            .collect(),
    )
}

/// Issue 31, item 5: `flooders` functions with `NetworkPolicy Runner` loop
/// `connect()` at the daemon's socket (xfn as 65532 without subordinate
/// ids: they run on its uid, so only their PID namespace tells the
/// gatekeeper who they are) while 30 calls are made, each on a new
/// connection as gRPC clients make them. Every call is served, the kernel
/// refuses every flood connect, and the gatekeeper never sees one.
async fn functions_flooding_the_socket_leave_every_other_call_served(flooders: usize) {
    let _alone = crate::ALONE.lock().await;
    use std::time::Duration;
    use xfn_testkit::pb;
    let abi = landlock_abi();
    if abi < 6 {
        eprintln!(
            "SKIPPED: the kernel's Landlock ABI is {abi}: it cannot refuse a function's \
             connect() to an abstract socket (ABI 6, Linux 6.12), and the gatekeeper alone \
             loses this race for CPU"
        );
        return;
    }
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    // Room for the flooders beside the calls.
    let daemon = Daemon::start_alone(&["--max-concurrent-runs", "4"]).await;
    assert!(
        daemon.log().contains("the kernel refuses their connects"),
        "{}",
        daemon.log()
    );
    let flood = ImageBuilder::new()
        .layer(Layer::busybox().file("/bin/flood", 0o755, flood_binary()))
        .entrypoint([
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!("cat >/dev/null; exec /bin/flood '{}'", daemon.socket),
        ])
        .push(&registry, "flood:v1")
        .reference;
    daemon.call_ok(&echo).await;
    let mut floods = Vec::new();
    for _ in 0..flooders {
        let mut client = daemon.client().await;
        let mut req = request_with_timeout(&flood, FUNCTION_IO, Duration::from_secs(600));
        if let Some(config) = req.run_function_config.as_mut() {
            config.network = Some(pb::NetworkConfig {
                policy: pb::NetworkPolicy::Runner as i32,
            });
        }
        floods.push(tokio::spawn(async move { client.run_function(req).await }));
    }
    // Every flood under way, each past 10,000 attempts.
    let command = format!("/bin/flood {}", daemon.socket);
    let pids = loop {
        let pids = processes_where(|cmdline| cmdline == command);
        let going = pids.len() == flooders
            && pids.iter().all(|&pid| {
                flood_counts(pid).is_some_and(|counts| counts.get("attempts") >= Some(&10_000))
            });
        if going {
            break pids;
        }
        for flood in &floods {
            assert!(
                !flood.is_finished(),
                "a flood ended early\n{}",
                daemon.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut failed = Vec::new();
    for _ in 0..30 {
        let result = match daemon.channel_as(Some(NONROOT)).await {
            Ok(channel) => Client::new(channel)
                .run_function(request(&echo, FUNCTION_IO))
                .await
                .map(|_| ()),
            Err(err) => Err(tonic::Status::unavailable(err.to_string())),
        };
        if let Err(status) = result {
            failed.push(status);
        }
    }
    let counts: Vec<_> = pids.iter().map(|&pid| flood_counts(pid)).collect();
    for &pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for flood in floods {
        let _ = flood.await;
    }
    eprintln!(
        "{flooders} flooding function(s): {} of 30 calls served; floods: {counts:?}",
        30 - failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of 30 calls failed while {flooders} function(s) flooded: {failed:?}\n{}",
        failed.len(),
        daemon.log()
    );
    for counts in counts {
        let counts = counts.expect("the flood's counts");
        assert_eq!(counts.get("connected"), Some(&0), "{counts:?}");
        assert_eq!(counts.get("refused"), counts.get("attempts"), "{counts:?}");
    }
    // The gatekeeper never saw one of them.
    let refused = daemon
        .metric(r#"xfn_callers_refused_total{reason="container"}"#)
        .await;
    assert_eq!(refused, 0.0, "{}", daemon.metrics_text().await);
    daemon.call_ok(&echo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_function_flooding_the_daemons_socket_is_refused_by_the_kernel_and_every_call_is_served()
{
    functions_flooding_the_socket_leave_every_other_call_served(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_functions_flooding_the_daemons_socket_are_refused_by_the_kernel_and_every_call_is_served(
) {
    functions_flooding_the_socket_leave_every_other_call_served(2).await;
}

/// Sockets `pid` holds open now: its connections, beside a few of its
/// own (listeners, the gatekeeper's channel). Other descriptors come and
/// go with the daemon's own work (a /proc file read, a run's namespace)
/// and are not what the cap bounds.
fn open_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_allowed_connections_never_holds_more_than_one_over_the_cap_open() {
    let _alone = crate::ALONE.lock().await;
    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;
    const CAP: usize = 64;
    const PER_THREAD: usize = 1500;
    // Alone: how far the table runs behind the sockets it was handed is
    // a race for the CPUs, which the bound must not depend on.
    let daemon = Daemon::start_alone(&["--max-connections", &CAP.to_string()]).await;
    daemon.wait_for_metric("xfn_connections_open", 0.0).await;
    let pid = daemon.xfn_pid();
    // At rest, with no connection: the least of a few looks (a look may
    // fall while the metrics scrape's connection closes).
    let mut rest = usize::MAX;
    for _ in 0..20 {
        rest = rest.min(open_sockets(pid));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, most) = (stop.clone(), most.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                most.fetch_max(open_sockets(pid), Relaxed);
            }
        })
    };
    // Two allowed callers (root) open connections as fast as they can,
    // say hello and keep them.
    let flood: Vec<_> = (0..2)
        .map(|_| {
            let name = daemon.socket.clone();
            std::thread::spawn(move || {
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                    .expect("an abstract name");
                let mut kept = Vec::new();
                for _ in 0..PER_THREAD {
                    let Ok(mut conn) = std::os::unix::net::UnixStream::connect_addr(&addr) else {
                        continue;
                    };
                    let _ = conn.write_all(HTTP2_HELLO);
                    kept.push(conn);
                }
                kept
            })
        })
        .collect();
    let kept: Vec<_> = flood.into_iter().map(|t| t.join().unwrap()).collect();
    // The daemon catches up with what was handed over.
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.store(true, Relaxed);
    sampler.join().unwrap();
    let most = most.load(Relaxed);
    let kept: usize = kept.iter().map(Vec::len).sum();
    eprintln!(
        "{kept} connections made; xfn held at most {most} sockets, {rest} at rest, cap {CAP}"
    );
    assert!(kept > 10 * CAP, "the flood made only {kept} connections");
    assert!(
        most <= rest + CAP + 1,
        "xfn held {most} sockets: {} connections over the cap of {CAP}",
        most - rest - CAP
    );
}

const HTTP2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
