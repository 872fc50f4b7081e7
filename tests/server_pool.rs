//! End to end: `xfn start` with its default warm pool, as the sidecar runs
//! (uid 65532, no capabilities): repeat calls are served by containers
//! created ahead of them, SIGTERM removes every one of them, and a daemon
//! SIGKILLed with warm containers waiting (or xfn in it) takes them with it,
//! and their state, which was in memory, goes with it too.

use std::path::Path;
use std::time::Duration;

use xfn_testkit::*;

/// Processes of containers created under `cache` (a waiting container's
/// init is a crun process whose command line names its bundle).
fn container_processes(cache: &Path) -> Vec<u32> {
    processes_rooted_under(cache)
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_repeat_calls_run_in_warm_containers_and_sigterm_removes_them_all() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let mut daemon = Daemon::start(&[]).await;
    let cache = daemon.cache_dir.clone();
    let mut client = daemon.client().await;
    for call in 0..3 {
        if call > 0 {
            daemon.wait_for_log("warm container ready", call).await;
        }
        let out = client
            .run_function(request(&echo, FUNCTION_IO))
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
        assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
    }
    let log = daemon.log();
    assert_eq!(log.matches("warm run phases").count(), 2, "{log}");
    daemon.wait_for_log("warm container ready", 3).await;
    // The metrics endpoint tells the same story: one cold call, two warm
    // ones, three containers made, one waiting.
    assert_eq!(pool_calls(&daemon).await, (1.0, 2.0));
    assert_eq!(
        daemon.metric("xfn_warm_containers_created_total").await,
        3.0
    );
    assert_eq!(daemon.metric("xfn_warm_containers_ready").await, 1.0);
    assert_eq!(daemon.metric("xfn_warm_pool_size").await, 2.0 * cpus());
    assert!(!container_processes(&cache).is_empty(), "a container waits");
    // Its state is in the daemon's memory (with, under load, the last
    // call's if its teardown has not run yet), none of it on the disk.
    let live = live_run_state(daemon.xfn_pid(), &cache);
    for dir in ["bundles", "crun", "rootfs"] {
        let dir = format!("run/live/{dir}/");
        assert!(
            live.iter().any(|e| e.starts_with(&dir)),
            "nothing in {dir}: {live:?}"
        );
    }
    assert_eq!(run_state(&cache), Vec::<String>::new(), "{}", daemon.log());
    daemon.sigterm();
    let status = daemon.wait().await;
    assert!(status.success(), "{status}\n{}", daemon.log());
    assert!(daemon.log().contains("removing warm containers"));
    assert_eq!(run_state(&cache), Vec::<String>::new(), "{}", daemon.log());
    assert_eq!(container_processes(&cache), Vec::<u32>::new());
}

/// The daemon's calls as its pool counted them: (cold, warm).
async fn pool_calls(daemon: &Daemon) -> (f64, f64) {
    let calls = |path| format!("xfn_warm_pool_calls_total{{path=\"{path}\"}}");
    (
        daemon.metric(&calls("cold")).await,
        daemon.metric(&calls("warm")).await,
    )
}

/// The CPU count, as the daemon sees it.
fn cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_container_not_called_for_expires_and_the_metrics_say_so() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&["--warm-pool-idle", "1s"]).await;
    let cache = daemon.cache_dir.clone();
    let out = daemon
        .client()
        .await
        .run_function(request(&echo, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
    // The cold call's refill makes one container, which then waits for a
    // call that never comes, and is removed.
    daemon
        .wait_for_metric("xfn_warm_containers_created_total", 1.0)
        .await;
    daemon
        .wait_for_metric("xfn_warm_containers_discarded_total", 1.0)
        .await;
    daemon.wait_for_metric("xfn_warm_containers", 0.0).await;
    assert_eq!(daemon.metric("xfn_warm_containers_ready").await, 0.0);
    assert_eq!(pool_calls(&daemon).await, (1.0, 0.0));
    let live = || live_run_state(daemon.xfn_pid(), &cache);
    for _ in 0..250 {
        if container_processes(&cache).is_empty() && live().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(container_processes(&cache), Vec::<u32>::new());
    assert_eq!(live(), Vec::<String>::new(), "{}", daemon.log());
    assert_eq!(run_state(&cache), Vec::<String>::new(), "{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_daemon_takes_its_warm_containers_and_their_state_with_it() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let dir = world_traversable_tempdir();
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    // Default flags, not PID 1: as on a laptop, in CI or under systemd.
    let mut first = Daemon::start_with_cache(Some(&cache), &[]).await;
    first
        .client()
        .await
        .run_function(request(&echo, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", first.log()));
    first.wait_for_log("warm container ready", 1).await;
    assert!(!container_processes(&cache).is_empty(), "a container waits");
    // Its state is in the daemon's memory (a tmpfs in its mount namespace).
    assert!(!live_run_state(first.xfn_pid(), &cache).is_empty());
    // SIGKILL to the process that was started, alone, as `kill -9`, a CI
    // timeout or systemd's last resort sends it: the kernel ends its PID
    // namespace, the waiting container's init (blocked in crun's
    // exec.fifo) included, and the gatekeeper follows.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    first.wait().await;
    // No process names the cache: not the daemon's (its flags), nor its
    // containers' (crun's state root and bundle are under it).
    wait_until_gone(&cache.display().to_string()).await;
    // Its state went with its mount namespace: nothing on the disk for the
    // next xfn to sweep.
    assert_eq!(run_state(&cache), Vec::<String>::new());
    for id in instances(&cache) {
        wait_until_instance_dead(&cache, &id).await;
    }

    let second = Daemon::start_with_cache(Some(&cache), &["--warm-pool", "0"]).await;
    assert_eq!(run_state(&cache), Vec::<String>::new(), "{}", second.log());
    // With the pool off, calls still run (the cold path), and leave nothing.
    let out = second
        .client()
        .await
        .run_function(request(&echo, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", second.log()));
    assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
    assert!(!second.log().contains("warm container"), "{}", second.log());
    // The run's teardown follows the reply (src/lifecycle/teardown.rs).
    let live = || live_run_state(second.xfn_pid(), &cache);
    for _ in 0..250 {
        if live().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(live(), Vec::<String>::new(), "{}", second.log());
    assert_eq!(run_state(&cache), Vec::<String>::new(), "{}", second.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn when_xfn_itself_is_sigkilled_its_runs_and_warm_containers_end_and_the_daemon_exits_137() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let marker = "sleep 4747";
    let slow = script_image(&registry, "slow:v1", &format!("cat >/dev/null; {marker}"));
    let mut daemon = Daemon::start(&[]).await;
    let cache = daemon.cache_dir.clone();
    let mut client = daemon.client().await;
    client
        .run_function(request(&echo, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    daemon.wait_for_log("warm container ready", 1).await;
    // A cold run in flight too: its crun and function must end as well.
    let call = tokio::spawn(async move { client.run_function(request(&slow, FUNCTION_IO)).await });
    while processes_with(marker).is_empty() {
        assert!(!call.is_finished(), "the slow call ended: {:?}", call.await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // As the OOM killer would pick it: xfn, not the process that was
    // started (its supervisor, outside the namespace).
    let xfn = daemon.xfn_pid();
    assert_ne!(xfn, daemon.pid());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(xfn as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = daemon.wait().await;
    assert_eq!(status.code(), Some(137), "{status}\n{}", daemon.log());
    wait_until_gone(&cache.display().to_string()).await;
    assert_eq!(processes_with(marker), Vec::<u32>::new());
    assert!(call.await.unwrap().is_err(), "the call in flight fails");
}

/// (nice, scheduling policy) of a `/proc/<pid>/stat` line (fields 19 and
/// 41; the command name, field 2, has no spaces here).
fn nice_and_policy(stat: &str) -> (i64, u32) {
    let fields: Vec<&str> = stat.split_whitespace().collect();
    (
        fields[18].parse().expect("nice"),
        fields[40].parse().expect("policy"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn functions_from_warm_containers_run_at_normal_priority_while_teardowns_run_idle() {
    let registry = Registry::start();
    // The function prints its own scheduling state.
    let stat = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/cat", "/proc/self/stat"])
        .push(&registry, "stat:v1")
        .reference;
    let daemon = Daemon::start(&[]).await;
    let mut client = daemon.client().await;
    for call in 0..3 {
        if call > 0 {
            daemon.wait_for_log("warm container ready", call).await;
        }
        let out = client
            .run_function(request(&stat, FUNCTION_IO))
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
        let out = String::from_utf8(out.into_inner().output).expect("utf-8");
        // SCHED_OTHER at nice 0, warm or cold.
        assert_eq!(nice_and_policy(&out), (0, 0), "call {call}: {out}");
    }
    assert_eq!(pool_calls(&daemon).await, (1.0, 2.0));
    // The daemon's teardown thread, and it alone, is SCHED_IDLE (5).
    let mut policies = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", daemon.xfn_pid())).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
        if !stat.is_empty() {
            policies.push((name.trim().to_string(), nice_and_policy(&stat).1));
        }
    }
    let idle: Vec<_> = policies.iter().filter(|(_, policy)| *policy == 5).collect();
    assert_eq!(idle, [&("xfn-teardown".to_string(), 5)], "{policies:?}");
}
