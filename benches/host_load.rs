//! Client of `benches/host.sh`: calls a v1 function server directly and
//! through `xfn host`, and times its first call from zero both ways. One
//! `key=value` a line on stdout.
//!
//! Usage (`cargo bench` adds a `--bench` argument, which is ignored):
//!   host_load once TARGET
//!       One call.
//!   host_load warm DIRECT HOSTED [NAME=PEER...]
//!       ROUNDS (env, default 5) rounds of ROUND_CALLS (default 100) calls
//!       to each (and to each PEER, another proxy before DIRECT) in turn, one caller, each PACE_MS (default 20) after the
//!       last answer, after ten warm-up calls each: the two sides timed
//!       seconds apart, so the machine's drift falls on both alike. Then
//!       as many `grpc.health.v1.Health/Check` calls to HOSTED (`hop_*`):
//!       a round trip through xfn host with no function behind it. With
//!       DIRECT_PID and XFN_PID (env), also the CPU time per call of the
//!       direct server's processes and of xfn's (with its function
//!       server's, and alone); with NAME_PID (NAME upper case), a peer's,
//!       and each round's CPU of xfn's own processes over the peer's: the
//!       median round's ratio, the lowest and the highest.
//!   host_load cold-native CALLS PORT -- COMMAND...
//!       CALLS times: spawn COMMAND (a server that listens on
//!       127.0.0.1:PORT), connect as soon as it listens (trying every
//!       millisecond), call once; the time from spawn to the answer. The
//!       server is killed after each.
//!   host_load memory PID Rss|Pss all|own
//!       kB of the field of `/proc/PID/smaps_rollup` summed over process
//!       PID and its descendants (`all`), or over xfn's own among them.
//!   host_load cold-host HOSTED METRICS_PORT FUNCTION CALLS
//!       CALLS times: wait until `xfn host` (started with a short
//!       `--server-idle`) stopped FUNCTION's server (and, with PREPARED=1
//!       in the env, created its next one's container ahead), then call on
//!       the connection kept open: a call from zero.
//!   host_load count TARGET CALLS PID
//!       What CALLS calls to TARGET (PACE_MS apart) cost the processes of
//!       PID (xfn's own, not its function servers; or a peer's tree), per
//!       call: perf's counts (CPU, context switches, wake-ups, syscalls by
//!       kind, libc allocations where `probe_libc:*` exist) less the same
//!       processes' idle counts over as long; then strace's calls and
//!       bytes of each I/O syscall over CALLS more. Run as root.
//!
//! A target is `tcp:HOST:PORT` (plaintext) or `tls:HOST:PORT/NAME` (TLS to
//! HOST:PORT with SNI NAME, the client certificate `client.crt`/`.key` and
//! the CA `ca/tls.crt` of the directory CERTS (env), as Crossplane dials).
//! What a call sends is FUNCTION_KIND's request (env: `fn_server`, the test
//! server's `compose` action; `pythonic`, a function-pythonic composition);
//! each answer must carry the request's tag and a desired resource named
//! `bucket`.
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xfn_testkit::stats::percentile;

use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use xfn::proto::v1;
use xfn::proto::v1::function_runner_service_client::FunctionRunnerServiceClient as Client;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

fn request() -> Result<v1::RunFunctionRequest, AnyError> {
    let kind = std::env::var("FUNCTION_KIND").unwrap_or_else(|_| "fn_server".into());
    let (input, observed) = match kind.as_str() {
        "fn_server" => (
            json!({"action": "compose", "name": "bucket",
                   "resource": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"app": "bench"}}}),
            json!({}),
        ),
        "pythonic" => (
            json!({"apiVersion": "pythonic.fn.crossplane.io/v1alpha1", "kind": "Composite",
                   "composite": "class Composite(BaseComposite):\n  def compose(self):\n    self.resources.bucket('ConfigMap', 'v1').data.app = self.metadata.name\n"}),
            json!({"apiVersion": "example.crossplane.io/v1", "kind": "App",
                   "metadata": {"name": "bench"}, "spec": {}}),
        ),
        other => return Err(format!("FUNCTION_KIND {other:?}: fn_server or pythonic").into()),
    };
    Ok(v1::RunFunctionRequest {
        meta: Some(v1::RequestMeta {
            tag: "bench".into(),
            ..Default::default()
        }),
        input: xfn::proto::to_struct(&input),
        observed: Some(v1::State {
            composite: Some(v1::Resource {
                resource: xfn::proto::to_struct(&observed),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// One call, checked; its time.
async fn call(
    client: &mut Client<Channel>,
    request: &v1::RunFunctionRequest,
) -> Result<Duration, AnyError> {
    let started = Instant::now();
    let answer = client.run_function(request.clone()).await?.into_inner();
    let elapsed = started.elapsed();
    let tagged = answer.meta.as_ref().is_some_and(|m| m.tag == "bench");
    let bucket = answer
        .desired
        .as_ref()
        .is_some_and(|d| d.resources.contains_key("bucket"));
    if !tagged || !bucket {
        return Err(format!("the answer lacks the tag or the bucket: {answer:?}").into());
    }
    Ok(elapsed)
}

async fn connect(target: &str) -> Result<Channel, AnyError> {
    if let Some(address) = target.strip_prefix("tcp:") {
        let channel = Channel::from_shared(format!("http://{address}"))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        return Ok(channel);
    }
    let Some((address, name)) = target
        .strip_prefix("tls:")
        .and_then(|rest| rest.split_once('/'))
    else {
        return Err(format!("target {target:?}: tcp:HOST:PORT or tls:HOST:PORT/NAME").into());
    };
    let certs = PathBuf::from(std::env::var("CERTS").map_err(|_| "CERTS (env) is not set")?);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(
            certs.join("ca/tls.crt"),
        )?))
        .identity(Identity::from_pem(
            std::fs::read(certs.join("client.crt"))?,
            std::fs::read(certs.join("client.key"))?,
        ))
        .domain_name(name)
        // A byte-level TLS proxy (a peer) negotiates no ALPN.
        .assume_http2(true);
    let channel = Channel::from_shared(format!("https://{address}"))?
        .tls_config(tls)?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(channel)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `NAME_p50_ms`, `NAME_p99_ms`, `NAME_min_ms`, `NAME_calls` of `times`.
fn report(name: &str, times: &mut [Duration]) {
    times.sort();
    println!("{name}_calls={}", times.len());
    println!("{name}_min_ms={:.3}", ms(times[0]));
    println!("{name}_p50_ms={:.3}", ms(percentile(times, 0.50)));
    println!("{name}_p99_ms={:.3}", ms(percentile(times, 0.99)));
}

fn env_number(name: &str, default: u64) -> Result<u64, AnyError> {
    Ok(std::env::var(name).map_or(Ok(default), |v| v.parse())?)
}

async fn warm(direct: &str, hosted: &str, peers: &[String]) -> Result<(), AnyError> {
    let rounds = env_number("ROUNDS", 5)?;
    let per_round = env_number("ROUND_CALLS", 100)?;
    let pace = Duration::from_millis(env_number("PACE_MS", 20)?);
    let request = request()?;
    let mut targets = vec![
        ("direct".to_string(), direct),
        ("hosted".to_string(), hosted),
    ];
    for peer in peers {
        let (name, target) = peer
            .split_once('=')
            .ok_or_else(|| format!("peer {peer:?}: NAME=TARGET"))?;
        targets.push((name.to_string(), target));
    }
    let mut sides = Vec::new();
    for (name, target) in targets {
        let mut client = Client::new(connect(target).await?);
        for _ in 0..10 {
            call(&mut client, &request).await?;
        }
        sides.push((name, client, Vec::new(), Vec::new()));
    }
    // The floor of the hop itself: `grpc.health.v1.Health/Check` to xfn
    // host over a connection like the hosted one (TLS, the same SNI): a
    // round trip through xfn's TLS and HTTP/2 with no function behind it.
    let mut health = tonic_health::pb::health_client::HealthClient::new(connect(hosted).await?);
    let mut hop = Vec::new();
    // The CPU time each side's processes spend on its calls: the direct
    // server's (DIRECT_PID), and xfn's with its function server's
    // (XFN_PID; xfn's own apart).
    let mut pids = vec![
        std::env::var("DIRECT_PID").ok(),
        std::env::var("XFN_PID").ok(),
    ];
    for (name, _, _, _) in sides.iter().skip(2) {
        pids.push(std::env::var(format!("{}_PID", name.to_uppercase())).ok());
    }
    let mut cpu = vec![CpuTime::default(); sides.len()];
    // Each round's CPU per call of each side's hop (xfn's own, a peer's
    // tree), for the ratio of xfn's to each peer's round by round: the
    // machine's drift between rounds falls on both sides of a ratio alike.
    let mut hop_cpu: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    if let Some(pid) = &pids[1] {
        // What xfn spends with a server running and no call: the part of
        // the per-call CPU that is not the calls'.
        let before = cpu_time(pid)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle = cpu_time(pid)?.xfn.saturating_sub(before.xfn) / 2;
        println!("xfn_idle_cpu_us_per_s={:.1}", idle.as_secs_f64() * 1e6);
    }
    for round in 0..rounds {
        let mut p50s = Vec::new();
        for (side, (name, client, all, _)) in sides.iter_mut().enumerate() {
            let mut times = Vec::new();
            let pid = pids.get(side).and_then(Option::as_ref);
            let before = pid.map(|pid| cpu_time(pid)).transpose()?;
            for _ in 0..per_round {
                tokio::time::sleep(pace).await;
                times.push(call(client, &request).await?);
            }
            if let (Some(before), Some(pid)) = (before, pid) {
                let after = cpu_time(pid)?;
                let tree = after.tree.saturating_sub(before.tree);
                let xfn = after.xfn.saturating_sub(before.xfn);
                cpu[side].tree += tree;
                cpu[side].xfn += xfn;
                // A side's hop: xfn's own processes where it has any.
                let hop = if xfn.is_zero() { tree } else { xfn };
                let us = hop.as_secs_f64() * 1e6 / per_round as f64;
                // A round in which a thread ended is left out (NaN).
                let whole = before.threads.is_subset(&after.threads);
                let us = if whole { us } else { f64::NAN };
                println!("round{round}_{name}_hop_cpu_us={us:.1}");
                hop_cpu[side].push(us);
            }
            times.sort();
            let p50 = percentile(&times, 0.5);
            println!("round{round}_{name}_p50_ms={:.3}", ms(p50));
            p50s.push(ms(p50));
            all.extend(times);
        }
        for (i, (_, _, _, overheads)) in sides.iter_mut().enumerate() {
            overheads.push(p50s[i] - p50s[0]);
        }
        for _ in 0..per_round {
            tokio::time::sleep(pace).await;
            let started = Instant::now();
            health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await?;
            hop.push(started.elapsed());
        }
    }
    if !hop.is_empty() {
        report("hop", &mut hop);
    }
    let calls = u32::try_from((rounds * per_round).max(1))?;
    let per_call = |time: Duration| (time / calls).as_secs_f64() * 1e6;
    if pids[0].is_some() {
        println!("direct_cpu_us_per_call={:.1}", per_call(cpu[0].tree));
    }
    if pids[1].is_some() {
        println!("hosted_cpu_us_per_call={:.1}", per_call(cpu[1].tree));
        println!("xfn_cpu_us_per_call={:.1}", per_call(cpu[1].xfn));
    }
    for (side, (name, _, _, _)) in sides.iter().enumerate().skip(2) {
        if pids[side].is_some() {
            println!("{name}_cpu_us_per_call={:.1}", per_call(cpu[side].tree));
            // Another xfn host (a build to compare): its own apart.
            if !cpu[side].xfn.is_zero() {
                println!("{name}_xfn_cpu_us_per_call={:.1}", per_call(cpu[side].xfn));
            }
        }
    }
    // xfn's hop CPU over each peer's, round by round: the median round's,
    // and the lowest and highest.
    for (side, (name, _, _, _)) in sides.iter().enumerate().skip(2) {
        let mut ratios: Vec<f64> = hop_cpu[1]
            .iter()
            .zip(&hop_cpu[side])
            .filter(|(xfn, peer)| **peer > 0.0 && xfn.is_finite() && peer.is_finite())
            .map(|(xfn, peer)| xfn / peer)
            .collect();
        if ratios.is_empty() {
            continue;
        }
        ratios.sort_by(f64::total_cmp);
        println!("{name}_cpu_ratio_median={:.3}", ratios[ratios.len() / 2]);
        println!("{name}_cpu_ratio_min={:.3}", ratios[0]);
        println!("{name}_cpu_ratio_max={:.3}", ratios[ratios.len() - 1]);
    }
    for (name, _, all, overheads) in sides.iter_mut() {
        report(name, all);
        if name.as_str() == "direct" {
            continue;
        }
        overheads.sort_by(f64::total_cmp);
        // The median round's.
        let overhead = overheads[overheads.len() / 2];
        match name.as_str() {
            "hosted" => println!("overhead_p50_ms={overhead:.3}"),
            peer => println!("{peer}_overhead_p50_ms={overhead:.3}"),
        }
    }
    Ok(())
}

/// CPU time of a process tree.
#[derive(Debug, Default, Clone)]
struct CpuTime {
    /// All of its processes'.
    tree: Duration,
    /// Those whose command is `xfn host` (the supervisor, its PID
    /// namespace's init and xfn itself, not the containers).
    xfn: Duration,
    /// The threads counted: one gone between two readings took its CPU
    /// time with it (a blocking thread that made a container ahead, idle
    /// for 10 s), so their difference is not what the calls between cost.
    threads: std::collections::BTreeSet<String>,
}

/// Process `pid` and its descendants, each with whether it is one of xfn's
/// own (its command is `xfn host`: the supervisor, its PID namespace's
/// init and xfn itself, not the containers). A process that ends during
/// the walk is left out.
fn process_tree(pid: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut todo = vec![pid.to_string()];
    while let Some(pid) = todo.pop() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let mut words = cmdline.split(|b| *b == 0);
        let is_xfn =
            words.next().is_some_and(|w| w.ends_with(b"xfn")) && words.any(|w| w == b"host");
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                todo.extend(children.split_whitespace().map(str::to_string));
            }
        }
        found.push((pid, is_xfn));
    }
    found
}

/// The CPU time process `pid` and its descendants have run so far, from
/// each thread's `/proc/PID/task/TID/schedstat` (nanoseconds on a CPU).
fn cpu_time(pid: &str) -> Result<CpuTime, AnyError> {
    let (mut tree, mut xfn) = (0u64, 0u64);
    let mut threads = std::collections::BTreeSet::new();
    for (pid, is_xfn) in process_tree(pid) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
                let ns = stat
                    .split_whitespace()
                    .next()
                    .unwrap_or("0")
                    .parse::<u64>()?;
                tree += ns;
                if is_xfn {
                    xfn += ns;
                }
                threads.insert(task.file_name().to_string_lossy().into_owned());
            }
        }
    }
    Ok(CpuTime {
        tree: Duration::from_nanos(tree),
        xfn: Duration::from_nanos(xfn),
        threads,
    })
}

/// kB of `field` (`Rss`, `Pss`) in `/proc/PID/smaps_rollup` summed over
/// process `pid` and its descendants, or over xfn's own among them.
fn memory_kb(pid: &str, field: &str, own: bool) -> Result<u64, AnyError> {
    let prefix = format!("{field}:");
    let mut total = 0;
    for (pid, is_xfn) in process_tree(pid) {
        if own && !is_xfn {
            continue;
        }
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        for line in rollup.lines().filter_map(|l| l.strip_prefix(&prefix)) {
            total += line
                .split_whitespace()
                .next()
                .unwrap_or("0")
                .parse::<u64>()?;
        }
    }
    Ok(total)
}

async fn cold_native(calls: u64, port: u16, command: &[String]) -> Result<(), AnyError> {
    let request = request()?;
    let [program, args @ ..] = command else {
        return Err("no command".into());
    };
    let mut times = Vec::new();
    for _ in 0..calls {
        let started = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let answered = async {
            // A gRPC client's connection, as soon as one is taken: grpcio
            // (the Python SDK's) listens on a probe socket first and closes
            // it, so a bare connect that succeeds proves nothing yet.
            let channel = loop {
                if let Ok(channel) = connect(&format!("tcp:127.0.0.1:{port}")).await {
                    break channel;
                }
                if let Some(status) = child.try_wait()? {
                    return Err(format!("{program} exited: {status}").into());
                }
                if started.elapsed() > Duration::from_secs(60) {
                    return Err(format!("{program} never listened on {port}").into());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            let mut client = Client::new(channel);
            call(&mut client, &request).await?;
            Ok::<_, AnyError>(started.elapsed())
        }
        .await;
        let _ = child.kill();
        let _ = child.wait();
        times.push(answered?);
    }
    report("native_cold", &mut times);
    Ok(())
}

/// `xfn_host_servers_STATE{function="FUNCTION"}` (`running`, `prepared`)
/// of the xfn host whose metrics listen on `port` (0 when absent).
fn servers(port: u16, state: &str, function: &str) -> Result<u64, AnyError> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let series = format!("xfn_host_servers_{state}{{function=\"{function}\"}} ");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(Ok(0), |v| v.trim().parse())?)
}

async fn cold_host(hosted: &str, port: u16, function: &str, calls: u64) -> Result<(), AnyError> {
    let prepared = env_number("PREPARED", 0)? == 1;
    let request = request()?;
    let mut client = Client::new(connect(hosted).await?);
    let mut times = Vec::new();
    for _ in 0..calls {
        let waited = Instant::now();
        while servers(port, "running", function)? > 0 {
            if waited.elapsed() > Duration::from_secs(120) {
                return Err(format!("{function}'s server was never stopped").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // An xfn that creates the next server's container ahead has made
        // it (as it has long before a call after minutes idle).
        while prepared && servers(port, "prepared", function)? == 0 {
            if waited.elapsed() > Duration::from_secs(120) {
                return Err(format!("{function}'s next container was never prepared").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Its teardown (off the call path) done, as a server idle for
        // minutes is.
        tokio::time::sleep(Duration::from_millis(300)).await;
        times.push(call(&mut client, &request).await?);
    }
    report("host_cold", &mut times);
    Ok(())
}

/// What `count` asks perf for, per process, in two passes over as many
/// calls: first CPU and scheduling alone ([`UNTRACED`]), then every
/// syscall, those a hop makes by kind, and allocations (libc's, where
/// `perf probe` added `probe_libc:*`: benches/host.sh does). Each
/// tracepoint and probe hit costs the traced process CPU of its own (a
/// uprobe traps: ~1-3 µs a `malloc`), so CPU counted beside them was
/// charged per allocation and syscall: 1.52× haproxy's where a profile of
/// the same calls said 1.07× (benches/PROFILE.md).
const COUNTED: &[&str] = &[
    "task-clock",
    "context-switches",
    "cpu-migrations",
    "sched:sched_wakeup",
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_futex",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_epoll_pwait",
    "syscalls:sys_enter_read",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_readv",
    "syscalls:sys_enter_writev",
    "syscalls:sys_enter_recvfrom",
    "syscalls:sys_enter_sendto",
    "syscalls:sys_enter_recvmsg",
    "syscalls:sys_enter_sendmsg",
    "syscalls:sys_enter_waitid",
    "syscalls:sys_enter_mmap",
    "syscalls:sys_enter_munmap",
    "syscalls:sys_enter_madvise",
    "syscalls:sys_enter_mprotect",
    "syscalls:sys_enter_sched_yield",
    "probe_libc:malloc",
    "probe_libc:calloc",
    "probe_libc:realloc",
];

/// The events of [`COUNTED`] counted in a pass of their own, with no
/// tracepoint or probe beside them.
const UNTRACED: &[&str] = &["task-clock", "context-switches", "cpu-migrations"];

/// The I/O syscalls whose bytes `count` sums (strace).
const COPIED: &str = "read,write,readv,writev,recvfrom,sendto,recvmsg,sendmsg";

/// The processes a side's counts are of: xfn's own under `pid` (not the
/// function servers it runs), else `pid` and its descendants (a peer).
fn counted_pids(pid: &str) -> String {
    let tree = process_tree(pid);
    let own: Vec<&str> = tree
        .iter()
        .filter(|(_, is_xfn)| *is_xfn)
        .map(|(p, _)| p.as_str())
        .collect();
    match own.is_empty() {
        true => tree
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>()
            .join(","),
        false => own.join(","),
    }
}

/// Runs `tool` (perf or strace, attached to processes) while `during`
/// runs, then interrupts it; the seconds it was attached.
async fn attached<F: std::future::Future<Output = Result<(), AnyError>>>(
    tool: &mut Command,
    during: F,
) -> Result<f64, AnyError> {
    let mut child = tool.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let started = Instant::now();
    // Attached to every thread before the first call.
    tokio::time::sleep(Duration::from_millis(500)).await;
    during.await?;
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill(2) on the child spawned above, not yet waited for.
    if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    child.wait()?;
    Ok(started.elapsed().as_secs_f64())
}

/// `perf stat -x,`'s counts by event.
fn perf_counts(path: &std::path::Path) -> Result<Vec<(String, f64)>, AnyError> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(',').collect();
            let value = fields.first()?.parse::<f64>().ok()?;
            Some((fields.get(2)?.to_string(), value))
        })
        .collect())
}

/// Calls and bytes of each I/O syscall in an strace log.
fn strace_bytes(path: &std::path::Path) -> Result<Vec<(String, u64, u64)>, AnyError> {
    let mut sums: Vec<(String, u64, u64)> = Vec::new();
    for line in std::fs::read_to_string(path)?.lines() {
        if line.ends_with("<unfinished ...>") {
            continue;
        }
        // `PID name(...) = N` or `PID <... name resumed>...) = N`.
        let rest = line
            .split_once(' ')
            .map_or(line, |(_, rest)| rest)
            .trim_start();
        let name = match rest.strip_prefix("<... ") {
            Some(resumed) => resumed.split(' ').next(),
            None => rest.split('(').next(),
        };
        let returned = line
            .rsplit_once(" = ")
            .and_then(|(_, r)| r.split(' ').next())
            .and_then(|r| r.parse::<i64>().ok());
        let (Some(name), Some(returned)) = (name, returned) else {
            continue;
        };
        let bytes = u64::try_from(returned).unwrap_or(0);
        match sums.iter_mut().find(|(n, _, _)| n == name) {
            Some((_, calls, sum)) => {
                *calls += 1;
                *sum += bytes;
            }
            None => sums.push((name.to_string(), 1, bytes)),
        }
    }
    Ok(sums)
}

/// `count TARGET CALLS PID`: what CALLS paced calls to TARGET cost the
/// processes of PID (`counted_pids`), per call: perf's counts over the
/// calls less what the same processes count idle for as long (CPU and
/// scheduling, then the traced events: two passes of CALLS calls), then
/// the calls and bytes of each I/O syscall (strace, CALLS calls more).
async fn count(target: &str, calls: u64, pid: &str) -> Result<(), AnyError> {
    let pace = Duration::from_millis(env_number("PACE_MS", 20)?);
    let request = request()?;
    let mut client = Client::new(connect(target).await?);
    for _ in 0..10 {
        call(&mut client, &request).await?;
    }
    let pids = counted_pids(pid);
    // A tracepoint or probe this kernel lacks would fail the whole stat.
    let events: Vec<&str> = COUNTED
        .iter()
        .copied()
        .filter(|e| match e.split_once(':') {
            Some((group, name)) => {
                std::path::Path::new(&format!("/sys/kernel/tracing/events/{group}/{name}")).exists()
            }
            None => true,
        })
        .collect();
    println!("count_pids={pids}");
    let dir = tempfile::tempdir()?;
    let (untraced, traced): (Vec<&str>, Vec<&str>) =
        events.iter().partition(|e| UNTRACED.contains(e));
    let perf = |file: &str, events: &[&str]| {
        let mut perf = Command::new("perf");
        perf.args(["stat", "-x,", "--no-big-num", "-o"])
            .arg(dir.path().join(file))
            .args(["-e", &events.join(","), "-p", &pids]);
        perf
    };
    let window = pace * u32::try_from(calls)?;
    let calls_f = calls as f64;
    for (pass, events) in [("untraced", &untraced), ("traced", &traced)] {
        let idle_secs = attached(&mut perf(&format!("{pass}.idle"), events), async {
            tokio::time::sleep(window).await;
            Ok(())
        })
        .await?;
        let busy_secs = attached(
            &mut perf(&format!("{pass}.calls"), events),
            paced(&mut client, &request, calls, pace),
        )
        .await?;
        let idle = perf_counts(&dir.path().join(format!("{pass}.idle")))?;
        for (event, busy) in perf_counts(&dir.path().join(format!("{pass}.calls")))? {
            let at_rest = idle
                .iter()
                .find(|(e, _)| *e == event)
                .map_or(0.0, |(_, v)| *v);
            let key = event.replace([':', '-'], "_");
            let per_call = (busy - at_rest / idle_secs * busy_secs) / calls_f;
            println!("count_{key}={per_call:.3}");
            println!("count_{key}_idle_per_s={:.3}", at_rest / idle_secs);
        }
    }
    let log = dir.path().join("strace");
    let mut strace = Command::new("strace");
    strace
        .args([
            "-f",
            "-qq",
            "-e",
            &format!("trace={COPIED}"),
            "-e",
            "signal=none",
            "-s",
            "0",
            "-o",
        ])
        .arg(&log)
        .args(["-p", &pids]);
    attached(&mut strace, paced(&mut client, &request, calls, pace)).await?;
    for (name, n, bytes) in strace_bytes(&log)? {
        println!("bytes_{name}_calls={:.3}", n as f64 / calls_f);
        println!("bytes_{name}={:.1}", bytes as f64 / calls_f);
    }
    // Where the CPU goes: `perf record` with DWARF call stacks over CALLS
    // more, its report (by library and symbol) written to COUNT_PROFILE
    // (env) and its data beside it (`.data`), for `perf report --children`.
    if let Ok(report) = std::env::var("COUNT_PROFILE") {
        let data = PathBuf::from(format!("{report}.data"));
        let mut record = Command::new("perf");
        record
            .args(["record", "--call-graph", "dwarf,16384", "-q", "-o"])
            .arg(&data)
            .args(["-p", &pids]);
        attached(&mut record, paced(&mut client, &request, calls, pace)).await?;
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--sort",
                "dso,sym",
                "-g",
                "none",
                "-i",
            ])
            .arg(&data)
            .output()?;
        std::fs::write(report, out.stdout)?;
    }
    Ok(())
}

/// `calls` calls on `client`, each `pace` after the last answer.
async fn paced(
    client: &mut Client<Channel>,
    request: &v1::RunFunctionRequest,
    calls: u64,
    pace: Duration,
) -> Result<(), AnyError> {
    for _ in 0..calls {
        tokio::time::sleep(pace).await;
        call(client, request).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), AnyError> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.as_slice() {
        [mode, pid, field, whose] if mode == "memory" => {
            let own = match whose.as_str() {
                "all" => false,
                "own" => true,
                other => return Err(format!("{other:?}: all or own").into()),
            };
            println!("{}", memory_kb(pid, field, own)?);
            Ok(())
        }
        [mode, target] if mode == "once" => {
            let mut client = Client::new(connect(target).await?);
            let took = call(&mut client, &request()?).await?;
            println!("once_ms={:.3}", ms(took));
            Ok(())
        }
        [mode, direct, hosted, peers @ ..] if mode == "warm" => warm(direct, hosted, peers).await,
        [mode, calls, port, dashes, command @ ..] if mode == "cold-native" && dashes == "--" => {
            cold_native(calls.parse()?, port.parse()?, command).await
        }
        [mode, target, calls, pid] if mode == "count" => count(target, calls.parse()?, pid).await,
        [mode, hosted, port, function, calls] if mode == "cold-host" => {
            cold_host(hosted, port.parse()?, function, calls.parse()?).await
        }
        _ => Err("usage: host_load once TARGET | warm DIRECT HOSTED [NAME=PEER...] | cold-native CALLS PORT -- COMMAND... \
                  | cold-host HOSTED METRICS_PORT FUNCTION CALLS | count TARGET CALLS PID \
                  | memory PID Rss|Pss all|own"
            .into()),
    }
}
