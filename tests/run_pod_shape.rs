//! The shipped sidecar's shape (deploy/) without Kubernetes: `xfn start`
//! with its default id flags as the root of a pod with `hostUsers: false`
//! (a user namespace of its own whose 65536 ids are unprivileged host ids),
//! with only the capabilities the manifests add (SETUID, SETGID, SETFCAP)
//! and `no_new_privs` (`Daemon::start_as_pod_root`). It maps the pod's
//! whole range itself (`src/sandbox/userns.rs`: xfn at the pod's 0,
//! functions at its 1..65535), so a function's host uid is neither the
//! pod's root nor xfn's, and issue 22's epoll attack leaves other callers
//! served, as with subordinate ids on a host (`run_kernel_counts.rs`).
//!
//! What this does not show: Kubernetes itself (the kubelet's choice of the
//! range, idmapped volume mounts, the container runtime's capability and
//! seccomp handling): docs/deploy.md says what was not exercised.
//!
//! Needs: crun, docker-registry, busybox-static, rustc with static glibc,
//! util-linux (unshare with --map-users, setpriv), uidmap (newuidmap, which
//! `unshare --map-users` runs); root.
use crate::run_kernel_counts::epoll_hog_leaves_others_served;

use xfn_testkit::*;

/// Capabilities in a `/proc/<pid>/status` set (`CapBnd` etc.) as a mask.
fn capability_set(pid: u32, set: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(set)?.strip_prefix(':'))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no {set} in\n{status}"))
}

/// CAP_SETGID (6), CAP_SETUID (7), CAP_SETFCAP (31): what deploy/ adds
/// (`xfn_testkit::POD_CAPABILITIES`).
const POD_CAPABILITY_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 31);

#[tokio::test(flavor = "multi_thread")]
async fn the_pods_root_runs_functions_under_the_pods_other_ids_and_serves_others_through_an_epoll_attack(
) {
    let registry = Registry::start();
    let base = subordinate_range(1);
    // Crossplane's own container in the pod runs as 65532 (deploy/: --allow-uid).
    let daemon = Daemon::start_as_pod_root(
        base,
        &["--max-concurrent-runs", "3", "--allow-uid", "65532"],
    )
    .await;
    // The shape held: the gatekeeper stays in the pod's namespace with
    // exactly the pod's capabilities, and no_new_privs.
    let gatekeeper = daemon.gatekeeper_pid();
    assert_eq!(status_field(gatekeeper, "Uid"), u64::from(base));
    assert_eq!(capability_set(gatekeeper, "CapBnd"), POD_CAPABILITY_MASK);
    assert_eq!(capability_set(gatekeeper, "CapEff"), POD_CAPABILITY_MASK);
    assert_eq!(capability_set(gatekeeper, "CapInh"), 0);
    assert_eq!(status_field(gatekeeper, "NoNewPrivs"), 1);
    // Default flags: the pod's own range, xfn at its first id, as the
    // node sees them.
    let log = daemon.log();
    assert!(
        log.contains("functions run under host uids that are not xfn's")
            && log.contains(&format!("xfn_uid={base} "))
            && log.contains(&format!("function_uids={}-{} ", base + 1, base + 65535)),
        "{log}"
    );
    // Crossplane's container (the pod's 65532) calls it.
    let echo = echo_image(&registry, "echo:v1");
    let crossplane = daemon
        .channel_as(Some(base + NONROOT))
        .await
        .expect("dial as the pod's 65532");
    let out = Client::new(crossplane)
        .run_function(request(&echo, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    assert_eq!(out.into_inner().output, FUNCTION_IO.as_bytes());
    // The image's root is the pod's 1: neither the pod's root nor xfn.
    epoll_hog_leaves_others_served(&daemon, &registry, base + 1, base).await;
}

/// Mapping the pod's uid 0 (xfn itself) into xfn's namespace takes
/// CAP_SETFCAP besides CAP_SETUID/CAP_SETGID (Linux 5.12+): with only the
/// latter two xfn refuses to start, saying which capability and why,
/// before it unshares (and so before a half-made namespace).
#[test]
fn the_pods_root_without_setfcap_refuses_to_start_and_names_it() {
    let dir = world_traversable_tempdir();
    let base = subordinate_range(2);
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, base);
    let mut xfn = as_pod_root(
        dir.path(),
        base,
        "+setuid,+setgid",
        std::path::Path::new(env!("CARGO_BIN_EXE_xfn")),
    );
    let socket = format!("@xfn-test/{}/no-setfcap", std::process::id());
    xfn.args(["start", "--address", &socket, "--cache-dir"])
        .arg(&cache)
        .stdin(std::process::Stdio::null());
    let out = xfn.output().expect("run xfn start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("xfn is uid 0 where it starts, and mapping that uid into its own user namespace takes CAP_SETFCAP there")
            && stderr.contains("add SETFCAP to the container's capabilities"),
        "{stderr}"
    );
}
