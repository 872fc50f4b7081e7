//! The sandbox API in-process, inside a namespace this test binary enters
//! itself (so it has `harness = false`: `main` is single-threaded when it
//! unshares). Checks what only an in-process test can see: after success,
//! failure, timeout, output flood and a dropped (cancelled) run, no bundle,
//! crun state, mount or container process is left in xfn's own namespace.
//!
//! Needs crun and /bin/busybox (Debian: crun, busybox-static). Runs as
//! whoever runs `cargo test`: as root it maps a 65536-id range.
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_spec::image::{Config, ConfigBuilder};
use xfn::sandbox::{userns, CrunError, Limits, RunRequest, Sandbox, SandboxError, SandboxOptions};

fn busybox_rootfs(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::copy("/bin/busybox", dir.join("bin/busybox")).expect("/bin/busybox (busybox-static)");
    for applet in [
        "sh", "cat", "echo", "sleep", "id", "yes", "head", "ls", "touch",
    ] {
        symlink("busybox", dir.join("bin").join(applet)).unwrap();
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
    std::fs::write(dir.join("etc/group"), "root:x:0:\n").unwrap();
}

fn sh(script: &str) -> Config {
    ConfigBuilder::default()
        .entrypoint(vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            script.to_string(),
        ])
        .build()
        .unwrap()
}

struct Env {
    ns: userns::Namespace,
    run_dir: PathBuf,
    rootfs: PathBuf,
}

impl Env {
    fn sandbox(&self, max_output_bytes: usize) -> Sandbox {
        Sandbox::new(
            &self.ns,
            SandboxOptions {
                runtime: PathBuf::from("crun"),
                run_dir: self.run_dir.clone(),
                max_output_bytes,
                require_limits: false,
                pids_limit: xfn::sandbox::spec::PIDS_LIMIT,
                instance: xfn::instance::of_cache(&self.run_dir).expect("claim an instance id"),
                tmp_size_bytes: xfn::sandbox::spec::TMP_SIZE,
            },
        )
        .unwrap()
    }

    fn request<'a>(
        &'a self,
        image: &'a Config,
        input: &'a [u8],
        timeout: Duration,
    ) -> RunRequest<'a> {
        RunRequest {
            rootfs: &self.rootfs,
            image: Some(image),
            input,
            timeout,
            host_network: false,
            limits: Limits::default(),
        }
    }

    /// Nothing of any run is left: bundles, crun state, mounts, processes.
    fn assert_clean(&self, marker: &str) {
        let bundles: Vec<_> = std::fs::read_dir(self.run_dir.join("bundles"))
            .unwrap()
            .collect();
        assert!(bundles.is_empty(), "bundles left: {bundles:?}");
        let state: Vec<_> = std::fs::read_dir(self.run_dir.join("crun"))
            .unwrap()
            .collect();
        assert!(state.is_empty(), "crun state left: {state:?}");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let rootfs = self.rootfs.to_string_lossy();
        let run_dir = self.run_dir.to_string_lossy();
        assert!(
            !mounts
                .lines()
                .any(|l| l.contains(&*rootfs) || l.contains(&*run_dir)),
            "mounts left:\n{mounts}"
        );
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            assert!(!cmdline.contains(marker), "process left: {cmdline}");
        }
    }
}

async fn cases(env: &Env) {
    let sandbox = env.sandbox(1 << 20);

    // stdin → stdout, exactly.
    let input = b"apiVersion: v1\nkind: FunctionIO\n".repeat(1000);
    let image = sh("cat");
    let out = sandbox
        .run(&env.request(&image, &input, Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(out.stdout, input);
    println!("ok: stdin is echoed exactly");

    // The function runs as uid 0 in its own pid namespace.
    let image = sh("id -u; echo $$");
    let out = sandbox
        .run(&env.request(&image, b"", Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n1\n");
    println!("ok: uid 0, pid 1");

    // Non-zero exit: code and the stderr tail.
    let image = sh("echo starting >&2; head -c 10000 /dev/zero | tr '\\0' x >&2; echo ' the reason' >&2; exit 3");
    let err = sandbox
        .run(&env.request(&image, b"", Duration::from_secs(20)))
        .await
        .unwrap_err();
    match err {
        SandboxError::Crun(CrunError::Failed { code, stderr_tail }) => {
            assert_eq!(code, 3);
            assert_eq!(stderr_tail.len(), 4096);
            assert!(String::from_utf8_lossy(&stderr_tail).ends_with("x the reason\n"));
        }
        other => panic!("expected Failed, got {other}"),
    }
    println!("ok: non-zero exit carries code and stderr tail");
    env.assert_clean("sleep 4242");

    // Timeout: the whole container is killed, including a background child.
    let image = sh("sleep 4242 & sleep 4242");
    let err = sandbox
        .run(&env.request(&image, b"", Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SandboxError::Crun(CrunError::Timeout(_))),
        "{err}"
    );
    assert!(err.to_string().contains("did not finish within"), "{err}");
    env.assert_clean("sleep 4242");
    println!("ok: timeout kills everything and cleans up");

    // Output flood.
    let image = sh("yes flood");
    let err = sandbox
        .run(&env.request(&image, b"", Duration::from_secs(20)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            SandboxError::Crun(CrunError::OutputTooLarge {
                stream: "stdout",
                ..
            })
        ),
        "{err}"
    );
    env.assert_clean("yes flood");
    println!("ok: output flood is cut off");

    // Cancel: the future is dropped mid-run.
    let image = sh("sleep 4343");
    let request = env.request(&image, b"", Duration::from_secs(60));
    let run = sandbox.run(&request);
    let dropped = tokio::time::timeout(Duration::from_millis(500), run).await;
    assert!(dropped.is_err(), "the run should still have been going");
    env.assert_clean("sleep 4343");
    println!("ok: a dropped run leaves nothing");

    // Concurrency.
    let image = sh("cat; echo # concurrent-4545");
    let runs = (0..20).map(|i| {
        let input = format!("run {i}");
        let sandbox = &sandbox;
        let image = &image;
        async move {
            let out = sandbox
                .run(&env.request(image, input.as_bytes(), Duration::from_secs(60)))
                .await
                .unwrap();
            assert_eq!(out.stdout, format!("run {i}\n").into_bytes());
        }
    });
    futures::future::join_all(runs).await;
    env.assert_clean("concurrent-4545");
    println!("ok: 20 concurrent runs");
}

fn main() {
    let base = tempfile::Builder::new()
        .prefix("xfn-sandbox-")
        .tempdir()
        .unwrap();
    // The mapped root must be able to reach the cache dir.
    std::fs::set_permissions(
        base.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cache = base.path().join("cache");
    let ns = userns::enter(&userns::UsernsOptions {
        map_root_uid: 100_000,
        map_root_gid: 100_000,
        cache_dir: cache.clone(),
    })
    .expect("enter the user namespace");
    println!("entered: {:?}", ns.mapping());
    // Made inside the namespace so its files are owned by (mapped) root.
    let rootfs = cache.join("rootfs");
    busybox_rootfs(&rootfs);
    let env = Env {
        ns,
        run_dir: cache.join("run"),
        rootfs,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(cases(&env));
    println!("all sandbox cases passed");
}
