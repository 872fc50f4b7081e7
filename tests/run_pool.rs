//! Warm containers (`lifecycle/pool.rs`) with real crun, in-process (as
//! `run_runner.rs`: `tests/run_in_process.rs` enters the namespace in `main`, while still
//! single-threaded): a pooled call is a fresh container like a cold one,
//! calls with other settings take the cold path, the pool keeps to its
//! bounds, and nothing is left once it shut down, zombies included.
//!
//! Needs: crun, docker-registry, busybox-static; run as root (maps a range)
//! or any user with a cache dir it owns.

use std::path::{Path, PathBuf};
use std::time::Duration;

use xfn::image::{ImageStore, StoreOptions};
use xfn::runner::{
    Limits, Namespace, NetworkPolicy, PoolOptions, PoolStats, RootfsMode, RunConfig, RunError,
    Runner, RunnerOptions, WarmStart,
};
use xfn_testkit::*;

/// The busybox layer, built once (uncompressed: gzip in a test build costs
/// seconds a layer, and these tests are about containers, not pulls).
fn busybox() -> Layer {
    static BLOB: std::sync::OnceLock<xfn_testkit::layer::LayerBlob> = std::sync::OnceLock::new();
    Layer::from_blob(
        BLOB.get_or_init(|| {
            Layer::busybox()
                .compression(Compression::None)
                .blob(Format::Oci)
        })
        .clone(),
    )
}

/// A runner whose pool takes containers as far as the default does
/// (started ahead).
fn pooled_runner(ns: &Namespace, cache: &Path, rootfs: RootfsMode, size: usize) -> Runner {
    runner_with(ns, cache, rootfs, size, WarmStart::default())
}

fn runner_with(
    ns: &Namespace,
    cache: &Path,
    rootfs: RootfsMode,
    size: usize,
    start: WarmStart,
) -> Runner {
    let store = ImageStore::open(cache, StoreOptions::default()).unwrap();
    Runner::new(
        ns,
        store,
        RunnerOptions {
            rootfs,
            warm_pool: Some(PoolOptions {
                size,
                idle: Duration::from_secs(120),
                start,
            }),
            ..RunnerOptions::default()
        },
    )
    .unwrap()
}

fn stats(runner: &Runner) -> PoolStats {
    runner.pool_stats().expect("the runner has a pool")
}

/// Waits until the pool has `ready` containers ready (creation runs in the
/// background after a call). Not a timing threshold: the bound only turns
/// a hang into a failure naming what was awaited.
async fn wait_ready(runner: &Runner, ready: usize) {
    for _ in 0..1000 {
        if stats(runner).ready >= ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no {ready} warm containers within 10 s: {:?}",
        stats(runner)
    );
}

/// `name`, the busybox layer above running `script` under `/bin/sh -c`.
fn shell_image(registry: &Registry, name: &str, script: &str) -> String {
    ImageBuilder::new()
        .layer(busybox())
        .entrypoint(["/bin/sh", "-c", script])
        .push(registry, name)
        .reference
}

/// `name`, the busybox layer above running `cat`: echoes its input.
fn cat_image(registry: &Registry, name: &str) -> String {
    ImageBuilder::new()
        .layer(busybox())
        .entrypoint(["/bin/cat"])
        .push(registry, name)
        .reference
}

/// Entries of the per-run state dirs: bundles, crun state, rootfs dirs.
fn run_state(cache: &Path) -> Vec<PathBuf> {
    ["bundles", "crun", "rootfs"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(cache.join("run").join(sub)).unwrap())
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.ends_with("overlay-probe"))
        .collect()
}

/// This process's children (any thread's) that a run left: zombies,
/// container inits (in a pid namespace below this one's), crun processes.
/// The registry this test started is a child too, and none of those.
fn run_children() -> Vec<String> {
    let depth = |status: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map_or(0, |ids| ids.split_whitespace().count())
    };
    let own = depth(&std::fs::read_to_string("/proc/self/status").unwrap());
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in list.split_whitespace() {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            let name = status.lines().next().unwrap_or_default();
            if zombie || depth(&status) > own || name.contains("crun") {
                out.push(format!("{pid}: {name} zombie={zombie}"));
            }
        }
    }
    out
}

/// The namespaces this process holds open: xfn holds each container's
/// mount, IPC and network namespaces from its creation to its teardown,
/// and must let go of every one.
fn held_namespaces() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| {
            ["mnt:[", "ipc:[", "net:["]
                .iter()
                .any(|k| target.starts_with(k))
        })
        .collect()
}

fn assert_nothing_left(cache: &Path) {
    let held = held_namespaces();
    assert!(
        held.is_empty(),
        "containers' namespaces still held: {held:?}"
    );
    let state = run_state(cache);
    assert!(state.is_empty(), "run state left: {state:?}");
    let run = cache.join("run");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(&*run.to_string_lossy()))
        .collect();
    assert!(left.is_empty(), "mounts left: {left:#?}");
    let children = run_children();
    assert!(
        children.is_empty(),
        "children (containers, zombies) left: {children:?}"
    );
}

/// What the isolation function prints about the container it runs in.
const PROBE: &str = r#"
read -r input
echo "input=$input"
echo "pid=$$"
echo "hostname=$(hostname)"
echo "mnt=$(readlink /proc/self/ns/mnt)"
echo "pidns=$(readlink /proc/self/ns/pid)"
echo "net=$(readlink /proc/self/ns/net)"
echo "netdevs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)"
echo "leftovers=$(grep -l '36[2]5' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
echo "seen=$(cat /left-behind /tmp/left-behind /dev/shm/left-behind 2>/dev/null | tr '\n' ,)"
echo "env=$(env | grep -c LEFT_BEHIND)"
listening() { cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -c ':1E61 0*:0000 0A'; }
echo "listening=$(listening)"
echo "$input" > /left-behind && echo "$input" > /tmp/left-behind && echo "$input" > /dev/shm/left-behind && echo "wrote=3"
export LEFT_BEHIND="$input"
n=36; sleep ${n}25 &
nc -l -p 7777 >/dev/null 2>&1 &
for i in 1 2 3 4 5 6 7 8 9 10; do [ "$(listening)" = 1 ] && break; sleep 0.05; done
echo "own_listening=$(listening)"
"#;

fn field<'a>(output: &'a str, key: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {output}"))
}

async fn a_warm_call_gets_a_fresh_container_and_sees_nothing_of_the_last(
    ns: &Namespace,
    cache: &Path,
    registry: &Registry,
    start: WarmStart,
) {
    let probe = shell_image(registry, "probe:v1", PROBE);
    let runner = runner_with(ns, cache, RootfsMode::Overlay, 2, start);
    let own = |ns: &str| std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
    let mut outputs = Vec::new();
    for call in 0..4 {
        if call > 0 {
            wait_ready(&runner, 1).await;
        }
        let held = held_namespaces();
        let before = stats(&runner);
        let out = runner
            .run(
                &probe,
                format!("call-{call}\n").as_bytes(),
                &RunConfig::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("call {call}: {e}"));
        let after = stats(&runner);
        // The first call is cold (nothing in demand yet); each later one
        // takes the container the one before it had created.
        let warm = u64::from(call > 0);
        assert_eq!(after.warm_calls, before.warm_calls + warm, "{after:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        if warm == 1 {
            // xfn held the waiting container's namespaces, so that its
            // exit did not tear them down on the call's path.
            for key in ["mnt", "net"] {
                assert!(
                    held.iter().any(|h| h == field(&text, key)),
                    "{key} {} not among the namespaces held while it waited: {held:?}",
                    field(&text, key)
                );
            }
        }
        assert_eq!(field(&text, "input"), format!("call-{call}"));
        assert_eq!(field(&text, "pid"), "1", "its own pid namespace: {text}");
        assert_eq!(field(&text, "hostname"), "function");
        assert_eq!(
            field(&text, "leftovers"),
            "0",
            "no process of an earlier call: {text}"
        );
        assert_eq!(
            field(&text, "netdevs"),
            "lo,",
            "an empty network namespace: {text}"
        );
        assert_eq!(
            field(&text, "seen"),
            "",
            "a fresh rootfs upper, /tmp and /dev/shm: {text}"
        );
        // What each call leaves, so that the next one could see it.
        assert_eq!(field(&text, "wrote"), "3", "{text}");
        assert_eq!(field(&text, "own_listening"), "1", "{text}");
        assert_eq!(field(&text, "env"), "0", "the image's environment: {text}");
        assert_eq!(
            field(&text, "listening"),
            "0",
            "no socket an earlier call listened on: {text}"
        );
        for (key, ns) in [("mnt", "mnt"), ("pidns", "pid"), ("net", "net")] {
            assert_ne!(
                Path::new(field(&text, key)),
                own(ns),
                "{key}: not the runner's own namespace"
            );
        }
        outputs.push(text);
    }
    assert_eq!(outputs.len(), 4);
    runner.shutdown().await;
    assert_nothing_left(cache);
    println!("ok ({start:?}): a warm call gets a fresh rootfs, mount, pid and network namespace and sees nothing of the last");
}

async fn calls_with_other_settings_take_the_cold_path(
    ns: &Namespace,
    cache: &Path,
    registry: &Registry,
) {
    let echo = cat_image(registry, "echo:v1");
    let runner = pooled_runner(ns, cache, RootfsMode::Overlay, 4);
    let plain = RunConfig::default();
    runner.run(&echo, b"first", &plain).await.unwrap();
    wait_ready(&runner, 1).await;
    let others = [
        RunConfig {
            network: NetworkPolicy::Runner,
            ..RunConfig::default()
        },
        RunConfig {
            limits: Limits {
                cpu_millis: Some(100),
                ..Limits::default()
            },
            ..RunConfig::default()
        },
        RunConfig {
            limits: Limits {
                memory_bytes: Some(64 << 20),
                ..Limits::default()
            },
            ..RunConfig::default()
        },
    ];
    for (n, config) in others.iter().enumerate() {
        let before = stats(&runner);
        let out = runner.run(&echo, b"other", config).await.unwrap();
        assert_eq!(out.stdout, b"other");
        let after = stats(&runner);
        assert_eq!(
            after.warm_calls, before.warm_calls,
            "settings {n}: {after:?}"
        );
        assert_eq!(after.cold_calls, before.cold_calls + 1, "settings {n}");
    }
    // A timeout is no setting of a container: the plain container serves
    // a call with another one.
    wait_ready(&runner, 1).await;
    let before = stats(&runner);
    let timeout = RunConfig {
        timeout: Duration::from_secs(7),
        ..RunConfig::default()
    };
    let out = runner.run(&echo, b"again", &timeout).await.unwrap();
    assert_eq!(out.stdout, b"again");
    assert_eq!(stats(&runner).warm_calls, before.warm_calls + 1);
    runner.shutdown().await;
    assert_nothing_left(cache);
    println!("ok: calls with another network policy or limits take the cold path");
}

async fn warm_failures_and_timeouts_are_reported_as_cold_ones(
    ns: &Namespace,
    cache: &Path,
    registry: &Registry,
) {
    let fail = shell_image(
        registry,
        "fail:v1",
        "cat >/dev/null; echo broken >&2; exit 3",
    );
    let hang = shell_image(registry, "hang:v1", "sleep 3626 & sleep 3626");
    let runner = pooled_runner(ns, cache, RootfsMode::Overlay, 2);
    let quick = RunConfig {
        timeout: Duration::from_millis(500),
        ..RunConfig::default()
    };
    for warm in [false, true] {
        if warm {
            wait_ready(&runner, 2).await;
        }
        let before = stats(&runner);
        let err = runner.run(&fail, b"x", &quick).await.unwrap_err();
        assert!(
            matches!(&err, RunError::FunctionFailed { code: 3, stderr_tail } if stderr_tail.ends_with(b"broken\n")),
            "{err}"
        );
        let err = runner.run(&hang, b"x", &quick).await.unwrap_err();
        assert!(matches!(err, RunError::Timeout(_)), "{err}");
        assert_eq!(
            stats(&runner).warm_calls,
            before.warm_calls + if warm { 2 } else { 0 }
        );
    }
    runner.shutdown().await;
    assert_nothing_left(cache);
    assert!(
        std::fs::read_dir("/proc").unwrap().flatten().all(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            !String::from_utf8_lossy(&cmdline).contains("3626")
        }),
        "a timed-out warm call left processes"
    );
    println!("ok: warm failures and timeouts are reported as cold ones and leave nothing");
}

async fn the_pool_keeps_to_its_size_over_images_and_callers(
    ns: &Namespace,
    cache: &Path,
    registry: &Registry,
) {
    let images: Vec<String> = (0..3)
        .map(|n| cat_image(registry, &format!("bounded-{n}:v1")))
        .collect();
    let size = 2;
    let runner = std::sync::Arc::new(pooled_runner(ns, cache, RootfsMode::Overlay, size));
    let crun_containers = || {
        std::fs::read_dir(cache.join("run/crun"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .count()
    };
    // Three images, round after round, and 8 callers of one image at once:
    // never more than `size` containers beyond the calls running.
    for round in 0..3 {
        for image in &images {
            runner
                .run(image, b"x", &RunConfig::default())
                .await
                .unwrap();
            let stats = stats(&runner);
            assert!(stats.total <= size, "round {round}: {stats:?}");
        }
    }
    let mut calls = Vec::new();
    for _ in 0..8 {
        let runner = runner.clone();
        let image = images[0].clone();
        calls.push(tokio::spawn(async move {
            runner.run(&image, b"y", &RunConfig::default()).await
        }));
    }
    while !calls.iter().all(|c| c.is_finished()) {
        let stats = stats(&runner);
        assert!(stats.total <= size, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().stdout, b"y");
    }
    // Seen from outside: once the calls' containers are torn down (in the
    // background), crun holds only the pool's, at most `size`.
    let mut containers = crun_containers();
    for _ in 0..1000 {
        if containers <= size {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        containers = crun_containers();
    }
    assert!(
        containers <= size,
        "{containers} containers left beside no call"
    );
    let stats = stats(&runner);
    assert!(stats.total <= size && stats.ready <= size, "{stats:?}");
    runner.shutdown().await;
    assert_nothing_left(cache);
    println!(
        "ok: the pool keeps to its size over 3 images and 8 concurrent callers ({} created, {} discarded)",
        stats.created, stats.discarded
    );
}

async fn idle_containers_expire(ns: &Namespace, cache: &Path, registry: &Registry) {
    let echo = cat_image(registry, "idle:v1");
    let store = ImageStore::open(cache, StoreOptions::default()).unwrap();
    let runner = Runner::new(
        ns,
        store,
        RunnerOptions {
            rootfs: RootfsMode::Overlay,
            warm_pool: Some(PoolOptions {
                size: 2,
                idle: Duration::from_millis(600),
                start: WarmStart::default(),
            }),
            ..RunnerOptions::default()
        },
    )
    .unwrap();
    runner
        .run(&echo, b"x", &RunConfig::default())
        .await
        .unwrap();
    wait_ready(&runner, 1).await;
    for _ in 0..1000 {
        if stats(&runner).total == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = stats(&runner);
    assert_eq!((stats.total, stats.discarded), (0, 1), "{stats:?}");
    runner.shutdown().await;
    assert_nothing_left(cache);
    println!("ok: warm containers of an image nobody calls expire");
}

/// Waits for the pool's ready containers to be started ahead (by default)
/// and lets them wait a while before their call.
async fn wait_ready_a_while(runner: &Runner, ready: usize) {
    wait_ready(runner, ready).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

async fn a_function_started_ahead_may_write_or_exit_before_its_input_arrives(
    ns: &Namespace,
    cache: &Path,
    registry: &Registry,
) {
    let early_stderr = shell_image(
        registry,
        "early-stderr:v1",
        "echo starting >&2; cat; echo done >&2",
    );
    let early_exit = shell_image(registry, "early-exit:v1", "echo constant; echo gone >&2");
    let early_failure = shell_image(
        registry,
        "early-failure:v1",
        "echo cannot start >&2; exit 5",
    );
    let runner = pooled_runner(ns, cache, RootfsMode::Overlay, 3);
    let config = RunConfig::default();
    for image in [&early_stderr, &early_exit, &early_failure] {
        let _ = runner.run(image, b"warming", &config).await;
    }
    // What it wrote before its input is the call's, in order.
    wait_ready_a_while(&runner, 3).await;
    let before = stats(&runner);
    let out = runner.run(&early_stderr, b"input", &config).await.unwrap();
    assert_eq!(out.stdout, b"input");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr_tail),
        "starting\ndone\n"
    );
    // Gone before its input arrived: the call gets what it wrote and its
    // exit, as a cold call of the same function does.
    let out = runner.run(&early_exit, b"ignored", &config).await.unwrap();
    assert_eq!(out.stdout, b"constant\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr_tail), "gone\n");
    let err = runner
        .run(&early_failure, b"ignored", &config)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RunError::FunctionFailed { code: 5, stderr_tail } if stderr_tail == b"cannot start\n"),
        "{err}"
    );
    assert_eq!(stats(&runner).warm_calls, before.warm_calls + 3);
    runner.shutdown().await;
    assert_nothing_left(cache);
    println!("ok: a function started ahead may write to stderr or exit before its input arrives");
}

async fn a_call_timeout_starts_at_the_call_not_at_the_container_start(
    ns: &Namespace,
    cache: &Path,
    registry: &Registry,
) {
    let echo = cat_image(registry, "late-call:v1");
    let runner = pooled_runner(ns, cache, RootfsMode::Overlay, 2);
    let short = RunConfig {
        timeout: Duration::from_millis(800),
        ..RunConfig::default()
    };
    runner.run(&echo, b"first", &short).await.unwrap();
    wait_ready(&runner, 1).await;
    // The started function waits longer than the call's timeout before
    // its call comes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = stats(&runner);
    let out = runner.run(&echo, b"late", &short).await.unwrap();
    assert_eq!(out.stdout, b"late");
    assert_eq!(stats(&runner).warm_calls, before.warm_calls + 1);
    runner.shutdown().await;
    assert_nothing_left(cache);
    println!("ok: a call's timeout starts at the call, not when its container was started");
}

async fn copy_mode_keeps_no_warm_containers(ns: &Namespace, cache: &Path) {
    let runner = pooled_runner(ns, cache, RootfsMode::Copy, 2);
    assert!(runner.pool_stats().is_none());
    println!("ok: copy mode keeps no warm containers (each would hold an image copy in memory)");
}

/// Every case of this file, in the namespace the binary entered (see
/// `tests/run_in_process.rs`).
pub async fn all(ns: &Namespace, cache: &Path, registry: &Registry) {
    for start in [WarmStart::Started, WarmStart::Created] {
        a_warm_call_gets_a_fresh_container_and_sees_nothing_of_the_last(ns, cache, registry, start)
            .await;
    }
    a_function_started_ahead_may_write_or_exit_before_its_input_arrives(ns, cache, registry).await;
    a_call_timeout_starts_at_the_call_not_at_the_container_start(ns, cache, registry).await;
    calls_with_other_settings_take_the_cold_path(ns, cache, registry).await;
    warm_failures_and_timeouts_are_reported_as_cold_ones(ns, cache, registry).await;
    the_pool_keeps_to_its_size_over_images_and_callers(ns, cache, registry).await;
    idle_containers_expire(ns, cache, registry).await;
    copy_mode_keeps_no_warm_containers(ns, cache).await;
    println!("all pool cases passed");
}
