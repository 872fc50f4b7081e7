//! End to end: `xfn start` as a pod runs it. PID 1 of its container (its
//! init reaps orphans and passes SIGTERM on to the drain), killed with
//! SIGKILL mid-call and started again, PID 1 again, on the same cache (the
//! killed one's run state was in memory and went with it; the new one
//! sweeps the rest, and what a killed one-shot `xfn run` left on the disk),
//! and next to another xfn on the same cache (neither touches the other's
//! live work).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use xfn_testkit::registry::hostile::{Fault, HostileRegistry, Target};
use xfn_testkit::*;

/// Polls `what` until it holds (a state the test waits for, not a time).
async fn wait_until(what: &str, mut holds: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if holds() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread")]
async fn as_pid_1_xfn_reaps_orphans_and_drains_on_sigterm() {
    let registry = Registry::start();
    let hang = sleeper_image(&registry, "hang:v1", 3627);
    let slow = script_image(&registry, "slow:v1", "sleep 1; cat");
    let dir = world_traversable_tempdir();
    let cache = nonroot_cache(&dir);

    // On a fresh cache xfn compiles its seccomp filter with `crun create`,
    // which exits and leaves the created container's init to PID 1 (xfn
    // becomes a child subreaper only after): an orphan at every start, a
    // zombie for good unless PID 1 reaps it.
    let mut daemon = Daemon::start_as_pid1(&cache, &["--warm-pool", "0"]).await;
    let init = daemon.pid1();
    assert_ne!(init, daemon.xfn_pid(), "xfn runs under an init");
    wait_until_no_zombies(init).await;

    // Every container's init is xfn's own child once `crun create` exits
    // (xfn is a child subreaper, pool or not): a cancelled call's function
    // is killed and reaped by xfn, and no zombie is left in the namespace.
    let mut client = daemon.client().await;
    let call = tokio::spawn(async move { client.run_function(request(&hang, FUNCTION_IO)).await });
    wait_until("the function runs", || {
        processes_with("sleep 3627").len() == 1
    })
    .await;
    let [function] = processes_with("sleep 3627").try_into().unwrap();
    assert_eq!(
        parent_of(function),
        Some(daemon.xfn_pid()),
        "the function's init is xfn's child"
    );
    call.abort();
    wait_until("the function is reaped", || parent_of(function).is_none()).await;
    wait_until_no_zombies(init).await;
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;

    // SIGTERM to PID 1, as a container runtime stops the container, reaches
    // xfn's drain: the run in flight finishes, then everything exits 0.
    daemon.sigterm_drains_a_call_in_flight(&slow).await;
}

/// Run cgroups of `instance` next to xfn's own (`<cgroup>/xfn-run-…`),
/// where limits are enforced.
fn run_cgroups_of(xfn: u32, instance: &str) -> Vec<String> {
    let own = std::fs::read_to_string(format!("/proc/{xfn}/cgroup")).unwrap_or_default();
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Vec::new();
    };
    // xfn sits in `<cgroup>/supervisor`; runs are its siblings.
    let parent = std::path::Path::new("/sys/fs/cgroup")
        .join(path.trim_start_matches('/'))
        .join("..");
    std::fs::read_dir(parent)
        .map(|list| {
            list.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("xfn-run-") && name.contains(instance))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_restarted_as_pid_1_sweeps_what_killed_xfns_left_on_the_disk() {
    let registry = Registry::start();
    let hang = sleeper_image(&registry, "hang:v1", 3623);
    let orphan = sleeper_image(&registry, "orphan:v1", 3628);
    // An image whose second layer a registry drips, a byte every 100 ms: its
    // pull is in tmp/ until the kill, however fast the machine (a large
    // layer from an honest registry could finish between the look and the
    // kill).
    let dripping = HostileRegistry::start();
    let slow = dripping.serve(
        &ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(Layer::new().file("/big", 0o644, pseudo_random_bytes(12, 64 << 10)))
            .entrypoint(["/bin/cat"]),
        "big:v1",
    );
    dripping.fault(
        Target::Blob(slow.image.layers[1].digest.clone()),
        Fault::Drip {
            every: Duration::from_millis(100),
        },
    );
    let big = slow.reference;
    let dir = world_traversable_tempdir();
    let cache = nonroot_cache(&dir);

    // The first incarnation, PID 1 as in a pod, is killed with three runs in
    // flight and a fourth call pulling an image (in a run slot of its own:
    // a call pulls once admitted).
    let mut first = Daemon::start_as_pid1(&cache, &["--max-concurrent-runs", "4"]).await;
    let [dead] = instances(&cache).try_into().expect("one instance");
    let mut calls = Vec::new();
    for _ in 0..3 {
        let mut client = first.client().await;
        let hang = hang.clone();
        calls.push(tokio::spawn(async move {
            client.run_function(request(&hang, FUNCTION_IO)).await
        }));
    }
    wait_until("three functions run", || {
        processes_with("sleep 3623").len() == 3
    })
    .await;
    // Their state is in the daemon's memory, not on the disk.
    let live = live_run_state(first.xfn_pid(), &cache);
    for dir in ["bundles", "crun", "rootfs"] {
        let dir = format!("run/live/{dir}/");
        assert!(
            live.iter().filter(|e| e.starts_with(&dir)).count() >= 3,
            "{live:?}"
        );
    }
    let mut client = first.client().await;
    calls.push(tokio::spawn(async move {
        client.run_function(request(&big, FUNCTION_IO)).await
    }));
    // Once the dripping layer's download has begun (not only the config's
    // or the other layer's, which end at once), the pull is in tmp/ for good.
    wait_until("the dripping layer's download begins", || {
        dripping.drips_started() >= 1
    })
    .await;
    let pulling = format!("tmp/{dead}.");
    wait_until("the pull works in tmp/", || {
        run_state(&cache).iter().any(|e| e.starts_with(&pulling))
    })
    .await;
    first.kill();
    for call in calls {
        assert!(call.await.unwrap().is_err());
    }
    wait_until_gone("sleep 3623").await;

    // What the killed xfn really left, named by its instance id (not by its
    // pid: xfn is PID 2, under its init, in every incarnation): the pull,
    // and no run state (that went with its mount namespace).
    let left = run_state(&cache);
    assert!(
        left.iter().any(|e| e.starts_with(&pulling)),
        "no {pulling}* left: {left:?}"
    );
    assert!(
        left.iter().all(|e| e.starts_with(&pulling)),
        "more than the pull left: {left:?}"
    );
    // Its mounts (overlay rootfs, sized tmpfs) died with its mount namespace.
    assert_eq!(
        mounts_under(std::process::id(), &cache),
        Vec::<String>::new()
    );
    // What a death during the start-up probes leaves (too brief a window to
    // be caught by a kill here): the probes' temp entries in run/.
    for probe in [".seccomp-probe-x", ".runtime-version", ".overlay-probe"] {
        let path = cache.join("run").join(format!(".{dead}{probe}"));
        std::fs::write(&path, "cut short").unwrap();
        std::os::unix::fs::chown(&path, Some(NONROOT), Some(NONROOT)).unwrap();
    }

    // A one-shot `xfn run` keeps its run state on the disk (its containers
    // have no PID namespace to end with it): killed mid-run, it leaves its
    // bundle, crun's state and its rootfs dir there.
    let mut one_shot = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["run", "--cache-dir"])
        .arg(&cache)
        .args([orphan.as_str(), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut input = one_shot.stdin.take().unwrap();
        input.write_all(FUNCTION_IO.as_bytes()).unwrap();
    }
    wait_until("the one-shot run's function runs", || {
        processes_with("sleep 3628").len() == 1
    })
    .await;
    let [one_shot_id] = instances(&cache)
        .into_iter()
        .filter(|id| *id != dead)
        .collect::<Vec<_>>()
        .try_into()
        .expect("one more instance");
    one_shot.kill().unwrap();
    one_shot.wait().unwrap();
    // Its function outlives it, reparented outside any xfn: ended here, as
    // the host would, so that only its state is left to sweep.
    for pid in processes_with("sleep 3628") {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait_until_gone("sleep 3628").await;
    let left = run_state(&cache);
    for kind in [
        format!("run/bundles/xfn-{one_shot_id}-"),
        format!("run/crun/xfn-{one_shot_id}-"),
        format!("run/rootfs/{one_shot_id}-"),
    ] {
        assert!(
            left.iter().any(|e| e.starts_with(&kind)),
            "no {kind}* left: {left:?}"
        );
    }

    // The next incarnation: PID 1 again, same cache, once the killed ones
    // are dead to the kernel.
    wait_until_instance_dead(&cache, &dead).await;
    wait_until_instance_dead(&cache, &one_shot_id).await;
    let second = Daemon::start_as_pid1(&cache, &[]).await;
    let swept = run_state(&cache);
    assert!(
        swept
            .iter()
            .all(|e| !e.contains(&dead) && !e.contains(&one_shot_id)),
        "left over: {swept:?}\n{}",
        second.log()
    );
    assert!(
        !instances(&cache).contains(&dead) && !instances(&cache).contains(&one_shot_id),
        "{:?}",
        instances(&cache)
    );
    let crun_list = std::process::Command::new("crun")
        .arg("--root")
        .arg(cache.join("run/crun"))
        .arg("list")
        .arg("--quiet")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&crun_list.stdout).trim(), "");
    // Under run/ only the second's own tmpfs is mounted.
    assert_eq!(
        mounts_under(second.xfn_pid(), &cache.join("run")),
        [cache.join("run/live").display().to_string()]
    );
    if second.metric("xfn_limits_enforced").await == 1.0 {
        assert_eq!(
            run_cgroups_of(second.xfn_pid(), &dead),
            Vec::<String>::new()
        );
    } else {
        eprintln!(
            "NOT CHECKED here: run cgroups (limits are not enforced on this host; \
             scripts/vm/run-checks.sh checks that a dead xfn's cgroups are removed)"
        );
    }
    second.call_ok(&echo_image(&registry, "echo:v1")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_daemons_as_pid_1_on_one_cache_leave_each_others_runs_alone() {
    let registry = Registry::start();
    let hang = sleeper_image(&registry, "hang:v1", 3624);
    let echo = echo_image(&registry, "echo:v1");
    let dir = world_traversable_tempdir();
    let cache = nonroot_cache(&dir);
    let first = Daemon::start_as_pid1(&cache, &[]).await;
    let mut client = first.client().await;
    let running = live_run_state(first.xfn_pid(), &cache);
    let call = tokio::spawn(async move { client.run_function(request(&hang, FUNCTION_IO)).await });
    first.wait_for_metric("xfn_runs_in_flight", 1.0).await;
    wait_until("the function runs", || {
        !processes_with("sleep 3624").is_empty()
    })
    .await;
    let live: Vec<String> = live_run_state(first.xfn_pid(), &cache)
        .into_iter()
        .filter(|e| !running.contains(e))
        .collect();
    assert!(!live.is_empty());
    let live_mounts = mounts_under(first.xfn_pid(), &cache.join("run/live/rootfs"));
    assert!(!live_mounts.is_empty(), "the run's rootfs is mounted");

    // Another xfn, PID 1 in its own namespace too, starts on the same cache
    // and serves: the first one's run state, mounts and process are
    // untouched, and the first one serves on.
    let second = Daemon::start_as_pid1(&cache, &[]).await;
    assert_eq!(instances(&cache).len(), 2);
    second.call_ok(&echo).await;
    let state = live_run_state(first.xfn_pid(), &cache);
    for entry in &live {
        assert!(state.contains(entry), "{entry} was removed: {state:?}");
    }
    assert_eq!(
        mounts_under(first.xfn_pid(), &cache.join("run/live/rootfs")),
        live_mounts
    );
    assert!(!processes_with("sleep 3624").is_empty());
    first.call_ok(&echo).await;
    call.abort();
    wait_until_gone("sleep 3624").await;
}
