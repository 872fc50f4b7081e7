//! Garbage collection of the image cache, end to end with the real binary,
//! a real registry and real crun: `xfn cache rm` removes images, then what
//! no image left uses; `xfn cache gc --max-size` evicts the least recently
//! used images first until the cache fits; neither ever removes what a run,
//! a warm container or a pull in flight uses, and those finish whole; `xfn
//! start` keeps its cache under `--cache-max-size` (10Gi unless told).
//! xfn runs as the sidecar's user (uid 65532) unless a test says otherwise.

use std::collections::HashSet;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use xfn_testkit::child::{output_within, ChildGuard};
use xfn_testkit::registry::hostile::{Fault, HostileRegistry, Target};
use xfn_testkit::*;

/// How long a wait for a state may take before the test gives up on xfn
/// (a bound on a hang, not a measurement).
const PATIENCE: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

/// `xfn ARGS --cache-dir CACHE` as uid 65532 without capabilities.
fn sidecar(args: &[&str], cache: &Path) -> Command {
    let mut cmd = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")));
    cmd.args(args).arg("--cache-dir").arg(cache);
    cmd
}

/// [`sidecar`], run to its end (bounded).
fn xfn(cache: &Path, args: &[&str]) -> Output {
    output_within(
        &mut sidecar(args, cache),
        &format!("xfn {}", args.join(" ")),
        PATIENCE,
    )
}

/// `xfn ARGS --cache-dir CACHE` as root (the full id range mapped).
fn xfn_as_root(cache: &Path, args: &[&str]) -> Output {
    let mut cmd = xfn_command();
    cmd.args(args).arg("--cache-dir").arg(cache);
    output_within(&mut cmd, &format!("xfn {}", args.join(" ")), PATIENCE)
}

/// `xfn run IMAGE -` (plus `extra`) as uid 65532 with `input` on stdin,
/// started: the caller waits for it with [`ChildGuard::output_within`].
fn start_run(cache: &Path, image: &str, extra: &[&str], input: &str) -> ChildGuard {
    let mut args = vec!["run", image, "-"];
    args.extend(extra);
    ChildGuard::spawn_with_input(&mut sidecar(&args, cache), input.as_bytes())
}

/// What a run of `image` with `input` printed (it must succeed).
fn run(cache: &Path, image: &str, input: &str) -> String {
    let out = start_run(cache, image, &[], input).output_within("xfn run", PATIENCE);
    stdout(&out)
}

/// A cache dir uid 65532 owns, in a temp dir removed with the guard.
fn sidecar_cache() -> (tempfile::TempDir, PathBuf) {
    let base = world_traversable_tempdir();
    let cache = nonroot_cache(&base);
    (base, cache)
}

/// A function image: busybox, and a layer of its own with `kib` KiB of
/// incompressible bytes (`seed` makes them unique) and `/fn.sh`, which
/// runs `script`, then copies its input out.
fn function_image(script: &str, seed: u64, kib: usize) -> ImageBuilder {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(
            Layer::new()
                .file("/fn.sh", 0o755, format!("#!/bin/sh\n{script}\ncat\n"))
                .file("/payload", 0o644, pseudo_random_bytes(seed, kib << 10)),
        )
        .entrypoint(["/fn.sh"])
}

fn hex(digest: &str) -> String {
    digest.trim_start_matches("sha256:").to_string()
}

/// The layer dirs in the cache (hex names).
fn layers(cache: &Path) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(cache.join("layers"))
        .expect("layers/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

/// The image's own (top) layer, by hex.
fn own_layer(image: &PushedImage) -> String {
    hex(&image.image.layers.last().expect("a layer").digest)
}

/// The references `xfn cache ls` lists (which, unlike a use, leaves their
/// last use alone).
fn listed(cache: &Path) -> Vec<String> {
    let rows: serde_json::Value =
        serde_json::from_str(&stdout(&xfn(cache, &["cache", "ls", "--format", "json"])))
            .expect("cache ls --format json");
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|row| row["reference"].as_str().expect("a reference").to_string())
        .collect()
}

/// The references a `cache gc` or `cache rm` reports evicted, in order.
fn evicted(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("evicted "))
        .map(|l| l.trim_end_matches(" (least recently used)").to_string())
        .collect()
}

/// Disk the store's entries take (allocated blocks, a hard-linked file
/// once), as the collector counts them: not `tmp/`, `run/` or locks.
fn store_bytes(cache: &Path) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0;
    let mut stack: Vec<PathBuf> = ["manifests", "configs", "blobs/sha256", "layers", "rootfs"]
        .iter()
        .filter_map(|dir| std::fs::read_dir(cache.join(dir)).ok())
        .flat_map(|entries| entries.map(|e| e.expect("entry").path()))
        .collect();
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        if !meta.is_dir() && meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            stack.extend(
                std::fs::read_dir(&path)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    total
}

/// Asserts `reference` is gone from the cache: a run that may not pull
/// says so.
fn assert_not_cached(cache: &Path, reference: &str) {
    let err = failure(&xfn(
        cache,
        &["pull", "--image-pull-policy", "Never", reference],
    ));
    assert!(err.contains("not in the cache"), "{reference}: {err}");
}

#[test]
fn cache_rm_removes_an_image_and_only_the_layers_no_other_image_uses_and_names_one_not_in_the_cache(
) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test pulls in the range mapping, which needs root"
    );
    let registry = Registry::start();
    // Image a's own layer is hard to remove: a read-only dir of a file
    // owned by another of the image's users.
    let a = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(
            Layer::new()
                .file("/fn.sh", 0o755, "#!/bin/sh\ncat\n")
                .owner(1000, 1000)
                .dir("/ro", 0o555)
                .file("/ro/file", 0o400, pseudo_random_bytes(1, 64 << 10)),
        )
        .entrypoint(["/fn.sh"])
        .push(&registry, "a:v1");
    let b = function_image("", 2, 64).push(&registry, "b:v1");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path();
    stdout(&xfn_as_root(cache, &["pull", &a.reference]));
    stdout(&xfn_as_root(cache, &["pull", &b.reference]));
    let base = hex(&a.image.layers[0].digest);
    assert_eq!(
        base,
        hex(&b.image.layers[0].digest),
        "one shared base layer"
    );
    assert_eq!(layers(cache), {
        let mut all = vec![base.clone(), own_layer(&a), own_layer(&b)];
        all.sort();
        all
    });

    let out = stdout(&xfn_as_root(cache, &["cache", "rm", &a.reference]));
    assert!(out.contains(&format!("removed {}", a.reference)), "{out}");
    assert!(out.contains("freed") && out.contains("(1 layer)"), "{out}");
    let mut kept = vec![base.clone(), own_layer(&b)];
    kept.sort();
    assert_eq!(layers(cache), kept, "only a's own layer goes");
    assert!(!cache.join("blobs/sha256").join(own_layer(&a)).exists());
    assert!(!cache.join("manifests").join(hex(&a.digest)).exists());
    let err = failure(&xfn_as_root(
        cache,
        &["pull", "--image-pull-policy", "Never", &a.reference],
    ));
    assert!(err.contains("not in the cache"), "{err}");
    stdout(&xfn_as_root(
        cache,
        &["pull", "--image-pull-policy", "Never", &b.reference],
    ));

    // Images not in the cache are named, the others removed, and the
    // command fails; a malformed reference is refused as one.
    let never = registry.reference("never:pulled");
    let out = xfn_as_root(cache, &["cache", "rm", &a.reference, &never, &b.reference]);
    let err = failure(&out);
    for missing in [&a.reference, &never] {
        assert!(
            err.contains(&format!("{missing} is not in the cache")),
            "{err}"
        );
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(&format!("removed {}", b.reference)),
        "{printed}"
    );
    let err = failure(&xfn_as_root(cache, &["cache", "rm", "Not A Reference"]));
    assert!(err.contains("invalid image reference"), "{err}");

    assert_eq!(layers(cache), Vec::<String>::new());
    for dir in [
        "manifests",
        "configs",
        "blobs/sha256",
        "refs",
        "rootfs",
        "tmp",
    ] {
        let left: Vec<_> = std::fs::read_dir(cache.join(dir)).unwrap().collect();
        assert!(left.is_empty(), "{dir} still holds {left:?}");
    }
}

#[test]
fn cache_gc_evicts_the_least_recently_used_images_first_until_the_cache_fits_its_budget() {
    let registry = Registry::start();
    let images: Vec<PushedImage> = (0..3)
        .map(|i| function_image("", 10 + i, 2048).push(&registry, &format!("lru{i}:v1")))
        .collect();
    let (_base, cache) = sidecar_cache();
    for image in &images {
        stdout(&xfn(&cache, &["pull", &image.reference]));
    }
    // Image 0 is used again, by a run: 1 is now the least recently used,
    // then 2, then 0.
    assert_eq!(run(&cache, &images[0].reference, FUNCTION_IO), FUNCTION_IO);
    let out = stdout(&xfn(&cache, &["cache", "gc"]));
    assert!(out.contains("freed 0 B"), "nothing is garbage yet: {out}");
    assert_eq!(
        evicted(&out),
        Vec::<String>::new(),
        "no budget, no eviction"
    );

    // A budget 1 MiB short: one image's own layer (2 MiB, and its blob)
    // must go, the least recently used one.
    let budget = store_bytes(&cache) - MIB;
    let out = stdout(&xfn(
        &cache,
        &["cache", "gc", "--max-size", &budget.to_string()],
    ));
    assert_eq!(evicted(&out), [images[1].reference.as_str()], "{out}");
    assert!(store_bytes(&cache) <= budget, "{out}");
    assert_eq!(
        listed(&cache),
        [images[0].reference.as_str(), images[2].reference.as_str()]
    );
    assert!(!layers(&cache).contains(&own_layer(&images[1])));
    assert_not_cached(&cache, &images[1].reference);

    // A budget of nothing evicts the rest, least recently used first, and
    // leaves nothing behind.
    let out = stdout(&xfn(&cache, &["cache", "gc", "--max-size", "0"]));
    assert_eq!(
        evicted(&out),
        [images[2].reference.as_str(), images[0].reference.as_str()],
        "{out}"
    );
    assert_eq!(store_bytes(&cache), 0, "{out}");
    assert_eq!(listed(&cache), Vec::<String>::new());
}

/// Accepts the first connection to `listener` (bounded); fails at once,
/// with what it printed, if `run` ends first.
fn accept_from(listener: &TcpListener, run: &mut ChildGuard) -> TcpStream {
    listener.set_nonblocking(true).expect("non-blocking");
    let deadline = Instant::now() + PATIENCE;
    loop {
        match listener.accept() {
            Ok((conn, _)) => return conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(status) = run.child().try_wait().expect("try_wait") {
            let mut err = String::new();
            if let Some(mut stderr) = run.child().stderr.take() {
                let _ = stderr.read_to_string(&mut err);
            }
            panic!("the run ended ({status}) before its function connected: {err}");
        }
        assert!(Instant::now() < deadline, "the function never connected");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cache_gc_never_removes_what_a_run_or_a_pull_in_flight_uses_and_both_finish_whole() {
    let registry = Registry::start();
    let hostile = HostileRegistry::start();
    // The held function connects to the test and waits until the test
    // hangs up (it shares the host's network with `--network-policy
    // Runner`): it is surely running while the cache is collected.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = function_image(&format!("busybox nc 127.0.0.1 {port} </dev/null"), 1, 256)
        .push(&registry, "held:v1");
    let idle = function_image("", 2, 256).push(&registry, "idle:v1");
    // The pulled image's own layer drips until the test heals the registry.
    let pulling = hostile.serve(&function_image("", 3, 1), "pulling:v1");
    let base = hex(&held.image.layers[0].digest);
    assert_eq!(base, hex(&pulling.image.layers[0].digest));
    let (_base, cache) = sidecar_cache();
    stdout(&xfn(&cache, &["pull", &held.reference]));
    stdout(&xfn(&cache, &["pull", &idle.reference]));

    let mut running = start_run(
        &cache,
        &held.reference,
        &["--network-policy", "Runner", "--timeout", "10m"],
        FUNCTION_IO,
    );
    let conn = accept_from(&listener, &mut running);
    hostile.fault(
        Target::Blob(pulling.image.layers[1].digest.clone()),
        Fault::Drip {
            every: Duration::from_secs(1),
        },
    );
    let mut pull = sidecar(&["pull", &pulling.reference], &cache);
    pull.stdout(Stdio::piped()).stderr(Stdio::piped());
    let pulling_now = ChildGuard::spawn(&mut pull);
    hostile.wait_until("the pull's own layer drips", PATIENCE, |r| {
        r.drips_open() == 1
    });

    let out = stdout(&xfn(&cache, &["cache", "gc", "--max-size", "0"]));
    assert_eq!(evicted(&out), [idle.reference.as_str()], "{out}");
    assert!(out.contains("2 image(s) in use"), "{out}");
    // The premise held: the run and the pull were in flight throughout.
    assert_eq!(hostile.drips_open(), 1, "the pull ended before the gc did");
    assert!(running.child().try_wait().unwrap().is_none());
    let left = layers(&cache);
    assert!(
        left.contains(&base),
        "the base layer both need went: {left:?}"
    );
    assert!(left.contains(&own_layer(&held)), "{left:?}");
    assert!(!left.contains(&own_layer(&idle)), "{left:?}");

    // Both finish, and what they made runs.
    hostile.heal();
    stdout(&pulling_now.output_within("the pull", PATIENCE));
    drop(conn);
    let ran = running.output_within("the held run", PATIENCE);
    assert_eq!(stdout(&ran), FUNCTION_IO);
    assert_eq!(run(&cache, &pulling.reference, FUNCTION_IO), FUNCTION_IO);

    // Done, they are evicted like any other.
    let out = stdout(&xfn(&cache, &["cache", "gc", "--max-size", "0"]));
    let mut gone = evicted(&out);
    gone.sort();
    let mut done = [held.reference.as_str(), pulling.reference.as_str()];
    done.sort();
    assert_eq!(gone, done, "{out}");
    assert_eq!(layers(&cache), Vec::<String>::new());
}

/// The log lines of the daemon's collections that evicted something.
fn collections(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("image cache collected") && !l.contains("evicted=[]"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn xfn_start_drops_idle_warm_containers_of_images_over_its_budget_and_evicts_them() {
    let registry = Registry::start();
    // Two images, each fitting the budget alone, not together: each has
    // 2 MiB of its own (4 MiB in the cache: its blob and its layer dir).
    let first = function_image("", 2, 2048).push(&registry, "first:v1");
    let second = function_image("", 3, 2048).push(&registry, "second:v1");
    let (_base, cache) = sidecar_cache();
    tokio::task::block_in_place(|| stdout(&xfn(&cache, &["pull", &first.reference])));
    let budget = store_bytes(&cache) + 2 * MIB;
    let daemon =
        Daemon::start_with_cache(Some(&cache), &["--cache-max-size", &budget.to_string()]).await;

    // The first image gets a warm container, waiting and idle.
    daemon.call_ok(&first.reference).await;
    daemon.wait_for_log("warm container ready", 1).await;
    // A call of the second pulls it, over the budget with the first: the
    // first's idle warm container goes, and the first with it, while the
    // second's call is served.
    daemon.call_ok(&second.reference).await;
    daemon.wait_for_log("image cache collected", 1).await;
    let log = daemon.log();
    let evicted = collections(&log);
    assert!(
        evicted.len() == 1 && evicted[0].contains(&first.reference),
        "{log}"
    );
    assert!(!layers(&cache).contains(&own_layer(&first)), "{log}");
    assert!(layers(&cache).contains(&own_layer(&second)), "{log}");
    let held = store_bytes(&cache);
    assert!(held <= budget, "{held} bytes held, budget {budget}\n{log}");
    assert!(
        !log.contains("over --cache-max-size with the images in use"),
        "{log}"
    );
    // Both images still serve: the first is pulled again.
    daemon.call_ok(&second.reference).await;
    daemon.call_ok(&first.reference).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collection_by_another_process_never_removes_the_image_of_a_daemons_warm_containers() {
    let registry = Registry::start();
    let warm = function_image("", 2, 256).push(&registry, "warm:v1");
    let (_base, cache) = sidecar_cache();
    // The daemon's own budget (10Gi) holds: its warm container stays.
    let daemon = Daemon::start_with_cache(Some(&cache), &[]).await;
    daemon.call_ok(&warm.reference).await;
    daemon.wait_for_log("warm container ready", 1).await;
    let out =
        tokio::task::block_in_place(|| stdout(&xfn(&cache, &["cache", "gc", "--max-size", "0"])));
    assert_eq!(evicted(&out), Vec::<String>::new(), "{out}");
    assert!(out.contains("1 image(s) in use"), "{out}");
    assert!(layers(&cache).contains(&own_layer(&warm)));

    // The waiting container, whose layers were never touched, serves.
    daemon.call_ok(&warm.reference).await;
    daemon.wait_for_log("warm run phases", 1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn xfn_start_by_default_keeps_a_10gi_budget_and_collects_what_no_image_uses_at_start() {
    let registry = Registry::start();
    let (_base, cache) = sidecar_cache();
    // fn:v1 is pushed again as another image: what only the first used is
    // garbage once the tag is pulled again.
    let first = function_image("", 1, 256).push(&registry, "fn:v1");
    tokio::task::block_in_place(|| stdout(&xfn(&cache, &["pull", &first.reference])));
    let second = function_image("", 2, 256).push(&registry, "fn:v1");
    tokio::task::block_in_place(|| {
        stdout(&xfn(
            &cache,
            &["pull", "--image-pull-policy", "Always", &second.reference],
        ))
    });
    assert!(layers(&cache).contains(&own_layer(&first)));

    let daemon = Daemon::start_with_cache(Some(&cache), &[]).await;
    daemon.wait_for_log("image cache collected", 1).await;
    let log = daemon.log();
    assert!(log.contains("cache_max_bytes=10737418240"), "{log}");
    assert!(
        log.contains("evicted=[]"),
        "nothing evicted under 10Gi: {log}"
    );
    let left = layers(&cache);
    assert!(!left.contains(&own_layer(&first)), "{left:?}");
    assert!(left.contains(&own_layer(&second)), "{left:?}");
    daemon.call_ok(&second.reference).await;
}
