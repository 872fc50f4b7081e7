//! `Runner::run` in-process, inside the namespace `tests/run_in_process.rs`
//! enters in `main` (still single-threaded then). What only an
//! in-process test sees: the per-run rootfs mounts (overlay and copy) live in
//! this process's mount namespace, so after a timeout or a dropped (cancelled)
//! call, /proc/self/mountinfo must show none of them, and no container
//! process, bundle or rootfs dir may be left; the same after a failure, an
//! output flood and concurrent runs.
//!
//! Needs: crun, docker-registry, busybox-static; run as root (maps a range)
//! or any user with a cache dir it owns.

use std::path::{Path, PathBuf};
use std::time::Duration;

use xfn::image::{ImageStore, StoreOptions};
use xfn::runner::{
    FunctionServer, FunctionServerOptions, Namespace, RootfsMode, RunConfig, RunError, Runner,
    RunnerOptions,
};
use xfn_testkit::*;

fn runner(ns: &Namespace, cache: &Path, rootfs: RootfsMode) -> Runner {
    let options = RunnerOptions {
        rootfs,
        ..RunnerOptions::default()
    };
    runner_with(ns, cache, options)
}

fn runner_with(ns: &Namespace, cache: &Path, options: RunnerOptions) -> Runner {
    let store = ImageStore::open(cache, StoreOptions::default()).unwrap();
    Runner::new(ns, store, options).unwrap()
}

/// `image` served by `runner`, `args` its command.
async fn serve(runner: &Runner, image: &str, args: &[String]) -> Result<FunctionServer, RunError> {
    let options = FunctionServerOptions {
        cmd: args,
        ..Default::default()
    };
    runner.serve(image, options, &RunConfig::default()).await
}

fn container_processes(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(marker))
        .collect()
}

fn assert_clean(cache: &Path, marker: &str) {
    let run = cache.join("run");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let run_str = run.to_string_lossy();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&*run_str)).collect();
    assert!(left.is_empty(), "mounts left: {left:#?}");
    for sub in ["bundles", "crun", "rootfs"] {
        let entries: Vec<PathBuf> = std::fs::read_dir(run.join(sub))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(entries.is_empty(), "{sub} left: {entries:?}");
    }
    let processes = container_processes(marker);
    assert!(processes.is_empty(), "processes left: {processes:?}");
}

async fn cases(ns: &Namespace, cache: &Path, registry: &Registry, mode: RootfsMode) {
    let tag = format!("{mode:?}").to_lowercase();
    let marker = format!("sleep 48{}", tag.len());
    let echo = script_image(registry, &format!("echo-{tag}:v1"), "cat; touch /written");
    let hang = script_image(
        registry,
        &format!("hang-{tag}:v1"),
        &format!("{marker} & {marker}"),
    );
    let runner = runner(ns, cache, mode);

    let out = runner
        .run(&echo, b"input", &RunConfig::default())
        .await
        .unwrap();
    assert_eq!(out.stdout, b"input");
    assert_clean(cache, &marker);
    println!("ok ({tag}): a run leaves nothing");

    let config = RunConfig {
        timeout: Duration::from_secs(1),
        ..RunConfig::default()
    };
    let err = runner.run(&hang, b"", &config).await.unwrap_err();
    assert!(matches!(err, RunError::Timeout(_)), "{err}");
    assert_clean(cache, &marker);
    println!("ok ({tag}): a timed-out run leaves nothing");

    // Cancel: drop the call once the function is running.
    let config = RunConfig {
        timeout: Duration::from_secs(60),
        ..RunConfig::default()
    };
    let running = async {
        while container_processes(&marker).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        result = runner.run(&hang, b"", &config) => panic!("the run ended: {result:?}"),
        () = running => {}
    }
    assert_clean(cache, &marker);
    println!("ok ({tag}): a dropped call leaves nothing");

    // Twenty at once: in copy mode each run writes its image's executables
    // while the others spawn crun (see `xfn::fork_lock`).
    let runs = (0..20).map(|i| {
        let (runner, echo, tag) = (&runner, &echo, &tag);
        async move {
            let input = format!("run {i}");
            let out = runner
                .run(echo, input.as_bytes(), &RunConfig::default())
                .await
                .unwrap_or_else(|err| panic!("run {i} of 20 at once ({tag}): {err}"));
            assert_eq!(out.stdout, input.as_bytes());
        }
    });
    futures::future::join_all(runs).await;
    assert_clean(cache, &marker);
    println!("ok ({tag}): 20 runs at once all succeed and leave nothing");
}

/// What every run must be, and leave, whatever way it ends (these went
/// to the sandbox directly before it became private to the crate).
async fn run_cases(ns: &Namespace, cache: &Path, registry: &Registry, mode: RootfsMode) {
    let tag = format!("{mode:?}").to_lowercase();
    let image =
        |name: &str, script: &str| script_image(registry, &format!("{name}-{tag}:v1"), script);
    let options = RunnerOptions {
        rootfs: mode,
        max_output_bytes: 1 << 20,
        ..RunnerOptions::default()
    };
    let runner = runner_with(ns, cache, options);
    let config = RunConfig::default();

    // stdin → stdout, exactly.
    let input = b"apiVersion: v1\nkind: FunctionIO\n".repeat(1000);
    let out = runner
        .run(&image("cat", "cat"), &input, &config)
        .await
        .unwrap();
    assert_eq!(out.stdout, input);
    println!("ok ({tag}): stdin is echoed exactly");

    // The function runs as uid 0 in its own pid namespace.
    let out = runner
        .run(&image("id", "id -u; echo $$"), b"", &config)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n1\n");
    println!("ok ({tag}): uid 0, pid 1");

    // Non-zero exit: code and the stderr tail.
    let failing = image(
        "fail",
        "echo starting >&2; head -c 10000 /dev/zero | tr '\\0' x >&2; echo ' the reason' >&2; exit 3",
    );
    match runner.run(&failing, b"", &config).await.unwrap_err() {
        RunError::FunctionFailed { code, stderr_tail } => {
            assert_eq!(code, 3);
            assert_eq!(stderr_tail.len(), xfn::runner::STDERR_TAIL_BYTES);
            assert!(String::from_utf8_lossy(&stderr_tail).ends_with("x the reason\n"));
        }
        other => panic!("expected FunctionFailed, got {other}"),
    }
    assert_clean(cache, "the reason");
    println!("ok ({tag}): a non-zero exit carries code and stderr tail, and leaves nothing");

    // Output flood: cut off at the cap.
    let err = runner
        .run(&image("flood", "yes flood"), b"", &config)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RunError::OutputTooLarge {
                stream: "stdout",
                limit: 1048576
            }
        ),
        "{err}"
    );
    assert_clean(cache, "yes flood");
    println!("ok ({tag}): an output flood is cut off and leaves nothing");
}

/// `Runner::serve`: a function image kept running as a server, reached only
/// inside its own network namespace, and gone without a trace when stopped
/// or dropped.
async fn serve_cases(ns: &Namespace, cache: &Path, registry: &Registry, mode: RootfsMode) {
    use std::net::{Ipv4Addr, SocketAddr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let tag = format!("{mode:?}").to_lowercase();
    // Also what `assert_clean` looks for: exec'd, nc's own command line.
    let marker = "nc -ll -p 9443 -e /bin/cat";
    // `sh -c SCRIPT sh` + the cmd override: the override arrives as "$@".
    let script = format!("echo \"args: $*\" >&2; exec {marker}");
    let echo = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", &script, "sh"])
        .cmd(["--not-this"])
        .push(registry, &format!("serve-echo-{tag}:v1"))
        .reference;
    let runner = runner(ns, cache, mode);
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, 9443));
    let args = ["--insecure".to_string()];
    let host_port_taken = std::net::TcpStream::connect(address).is_ok();

    let mut server = serve(&runner, &echo, &args).await.unwrap();
    server
        .wait_listening(address, Duration::from_secs(30))
        .await
        .unwrap();
    let mut stream = server.network().connect(address).await.unwrap();
    stream.write_all(b"ping\n").await.unwrap();
    let mut answer = [0u8; 5];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"ping\n");
    let output = String::from_utf8_lossy(&server.output_tail()).into_owned();
    assert!(output.contains("args: --insecure"), "{output}");
    if host_port_taken {
        println!("note: 127.0.0.1:9443 is in use on the host; isolation not checked");
    } else {
        assert!(
            std::net::TcpStream::connect(address).is_err(),
            "the server must not be reachable in the host's network"
        );
    }
    drop(stream);
    server.stop().await;
    assert_clean(cache, marker);
    println!("ok ({tag}): a served function answers in its namespace only; stop leaves nothing");

    let server = serve(&runner, &echo, &args).await.unwrap();
    drop(server);
    assert_clean(cache, marker);
    println!("ok ({tag}): a dropped served function leaves nothing");

    let exits = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint([
            "/bin/sh",
            "-c",
            "echo no certificates given >&2; exit 3",
            "sh",
        ])
        .push(registry, &format!("serve-exits-{tag}:v1"))
        .reference;
    // Reported by `serve` or by `wait_listening`, as the race goes.
    let err = match serve(&runner, &exits, &args).await {
        Err(err) => err,
        Ok(mut server) => {
            let err = server
                .wait_listening(address, Duration::from_secs(30))
                .await
                .unwrap_err();
            server.stop().await;
            err
        }
    };
    match &err {
        RunError::FunctionFailed {
            code: 3,
            stderr_tail,
        } => assert!(
            String::from_utf8_lossy(stderr_tail).contains("no certificates given"),
            "{err}"
        ),
        other => panic!("expected exit code 3, got {other}"),
    }
    assert_clean(cache, marker);
    println!("ok ({tag}): a server that exits is reported with its exit code and output");

    let silent = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint([
            "/bin/sh",
            "-c",
            &format!("echo starting; exec {marker}"),
            "sh",
        ])
        .push(registry, &format!("serve-silent-{tag}:v1"))
        .reference;
    let mut server = serve(&runner, &silent, &args).await.unwrap();
    let err = server
        .wait_listening(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 9444)),
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, RunError::NotServing(_))
            && message.contains("127.0.0.1:9444")
            && message.contains("starting"),
        "{message}"
    );
    server.stop().await;
    assert_clean(cache, marker);
    println!("ok ({tag}): a server that never listens is reported, with its output");
}

/// Every case of this file, in the namespace the binary entered (see
/// `tests/run_in_process.rs`), in both rootfs modes.
pub async fn all(ns: &Namespace, cache: &Path, registry: &Registry) {
    for mode in [RootfsMode::Overlay, RootfsMode::Copy] {
        cases(ns, cache, registry, mode).await;
        run_cases(ns, cache, registry, mode).await;
        serve_cases(ns, cache, registry, mode).await;
    }
    println!("all runner cases passed");
}
