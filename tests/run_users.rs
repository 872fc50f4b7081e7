//! Image users (`User` in the image config) end to end: the unprivileged
//! daemon (`xfn start` as uid 65532, no capabilities) and `xfn run`, both
//! unprivileged and as root (a 65536-id range), with images built here.
//! `src/sandbox/user.rs` says how the ids are mapped and what a function
//! sees.
//!
//! Needs: crun, docker-registry, busybox-static, util-linux (setpriv); root.

use std::path::Path;
use std::time::Duration;

use tonic::Code;
use xfn_testkit::*;

/// What each test function prints: its ids, the owner of its image's
/// files, its uid map and its effective capabilities, then its input.
const WHO_AM_I: &str = "id -u; id -g; stat -c %u:%g /bin/busybox; \
    cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'; \
    grep CapEff /proc/self/status | cut -f2; cat";

fn user_image(registry: &Registry, name: &str, user: &str) -> String {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", WHO_AM_I])
        .user(user)
        .push(registry, name)
        .reference
}

/// Each case's image (`user_image` of its name and user), pushed: (user,
/// image, what the case expects).
fn pushed<'a>(
    registry: &Registry,
    cases: &[(&str, &'a str, &'a str)],
) -> Vec<(&'a str, String, &'a str)> {
    cases
        .iter()
        .map(|(name, user, expected)| {
            (
                *user,
                user_image(registry, &format!("{name}:v1"), user),
                *expected,
            )
        })
        .collect()
}

/// What a function of `RUNNABLE` prints: the ids it `expected`, no
/// capabilities, its input.
fn printed(expected: &str) -> String {
    format!("{expected}0000000000000000\n{FUNCTION_IO}")
}

/// The users that run, and what the unprivileged daemon's function prints
/// for each (uid, gid, owner of its files, uid map): xfn's one id is the
/// image's user, so its files are the user's own, and (not root) it has
/// no capabilities.
const RUNNABLE: [(&str, &str, &str); 4] = [
    (
        "u65532g65532",
        "65532:65532",
        "65532\n65532\n65532:65532\n65532 0 1\n",
    ),
    (
        "u1000g1000",
        "1000:1000",
        "1000\n1000\n1000:1000\n1000 0 1\n",
    ),
    // A uid not in /etc/passwd runs with gid 0, as Docker does.
    ("u1000", "1000", "1000\n0\n1000:0\n1000 0 1\n"),
    // A name from the image's /etc/passwd (Layer::busybox: nonroot 65532).
    (
        "byname",
        "nonroot",
        "65532\n65532\n65532:65532\n65532 0 1\n",
    ),
];

/// The users that are refused, and what the refusal must say.
const REFUSED: [(&str, &str, &str); 2] = [
    (
        "unknown",
        "nosuchuser",
        "image user \"nosuchuser\" is not in the image's /etc/passwd",
    ),
    (
        "overflow",
        "4294967295",
        "4294967295 is not a user or group id",
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn the_unprivileged_daemon_runs_image_users_as_themselves_and_refuses_unknown_ones() {
    let registry = Registry::start();
    let daemon = Daemon::start(&[]).await;
    let mut client = daemon.client().await;
    for (user, image, expected) in pushed(&registry, &RUNNABLE) {
        // Twice: the first call may be cold, the second finds a warm
        // container made for the image (the pool builds the same spec).
        for _ in 0..2 {
            let out = client
                .run_function(request(&image, FUNCTION_IO))
                .await
                .unwrap_or_else(|s| panic!("{user}: {s:?}\n{}", daemon.log()));
            let out = String::from_utf8(out.into_inner().output).unwrap();
            assert_eq!(out, printed(expected), "{user}");
        }
    }
    for (user, image, reason) in pushed(&registry, &REFUSED) {
        let status = client
            .run_function(request(&image, FUNCTION_IO))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{user}: {status:?}");
        assert!(status.message().contains(reason), "{user}: {status:?}");
    }
    // The daemon keeps serving after the refusals.
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
}

fn xfn_run(cache: &Path, uid: Option<u32>, image: &str) -> std::process::Output {
    let mut cmd = match uid {
        Some(uid) => unprivileged(uid, Path::new(env!("CARGO_BIN_EXE_xfn"))),
        None => xfn_command(),
    };
    cmd.arg("run")
        .arg("--cache-dir")
        .arg(cache)
        .arg(image)
        .arg("-");
    run_with_input(cmd, FUNCTION_IO.as_bytes())
}

#[test]
fn xfn_run_unprivileged_runs_image_users_as_themselves_and_refuses_unknown_ones() {
    let registry = Registry::start();
    let dir = world_traversable_tempdir();
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    for (user, image, expected) in pushed(&registry, &RUNNABLE) {
        let out = stdout(&xfn_run(&cache, Some(NONROOT), &image));
        assert_eq!(out, printed(expected), "{user}");
    }
    for (user, image, reason) in pushed(&registry, &REFUSED) {
        let err = failure(&xfn_run(&cache, Some(NONROOT), &image));
        assert!(err.contains(reason), "{user}: {err}");
    }
}

/// As root xfn maps a 65536-id range, keeps its first id for itself and
/// gives functions the 65535 after it: the image's ids are themselves
/// (files keep their owners: root's), container 0 is xfn's id 1, never
/// its own 0, and an id past them is refused with the count named, as is
/// `(uid_t)-1`.
#[test]
fn xfn_run_with_an_id_range_maps_image_users_one_to_one_and_refuses_ids_past_it() {
    let registry = Registry::start();
    let dir = world_traversable_tempdir();
    let cache = dir.path().join("cache");
    for (name, user, uid_gid) in [
        ("u65532g65532", "65532:65532", "65532\n65532\n"),
        ("u1000", "1000", "1000\n0\n"),
        ("byname", "nonroot", "65532\n65532\n"),
    ] {
        let image = user_image(&registry, &format!("{name}:v1"), user);
        let out = stdout(&xfn_run(&cache, None, &image));
        assert_eq!(
            out,
            format!("{uid_gid}0:0\n0 1 65535\n0000000000000000\n{FUNCTION_IO}"),
            "{user}"
        );
    }
    for (name, user, reason) in [
        REFUSED[0],
        REFUSED[1],
        (
            "u100000",
            "100000",
            "id 100000 is outside the 65535 ids xfn maps",
        ),
    ] {
        let image = user_image(&registry, &format!("{name}:v1"), user);
        let err = failure(&xfn_run(&cache, None, &image));
        assert!(err.contains(reason), "{user}: {err}");
    }
}

/// With subordinate ids (65532's 65536 in /etc/subuid and /etc/subgid,
/// `newuidmap`) the unprivileged daemon maps the image's ids one to one
/// onto them, past its own: each user is itself, its image's files keep
/// their owners (root's, and the user's own home, which it can write), and
/// an id past the 65536 is refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_with_subordinate_ids_runs_image_users_as_themselves_over_ids_not_its_own() {
    let registry = Registry::start();
    let first = subordinate_range(1);
    let daemon = Daemon::start_with_subordinate_ids(first, &[]).await;
    let mut client = daemon.client().await;
    for (name, user, uid_gid) in [
        ("u65532g65532", "65532:65532", "65532\n65532\n"),
        ("u1000", "1000", "1000\n0\n"),
        ("byname", "nonroot", "65532\n65532\n"),
        ("root", "", "0\n0\n"),
    ] {
        let image = ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(Layer::new().owner(65532, 65532).dir("/home/nonroot", 0o700))
            .entrypoint([
                "/bin/sh",
                "-c",
                &format!("{WHO_AM_I_BRIEF}; echo mine >/home/nonroot/f 2>/dev/null; cat /home/nonroot/f 2>/dev/null; cat"),
            ])
            .user(user)
            .push(&registry, &format!("sub-{name}:v1"))
            .reference;
        let out = client
            .run_function(request(&image, FUNCTION_IO))
            .await
            .unwrap_or_else(|s| panic!("{user}: {s:?}\n{}", daemon.log()));
        let out = String::from_utf8(out.into_inner().output).unwrap();
        // Only root and the home's owner write to it.
        let home = if ["65532:65532", "nonroot", ""].contains(&user) {
            "mine\n"
        } else {
            ""
        };
        assert_eq!(
            out,
            format!("{uid_gid}0:0\n0 1 65536\n{home}{FUNCTION_IO}"),
            "{user}\n{}",
            daemon.log()
        );
    }
    let image = user_image(&registry, "sub-u65536:v1", "65536");
    let status = client
        .run_function(request(&image, FUNCTION_IO))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("id 65536 is outside the 65536 ids xfn maps"),
        "{status:?}"
    );
}

/// What [`the_daemon_with_subordinate_ids_runs_image_users_as_themselves_over_ids_not_its_own`]'s
/// functions print: ids, owner of the image's files, uid map.
const WHO_AM_I_BRIEF: &str = "id -u; id -g; stat -c %u:%g /bin/busybox; \
    cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'";

/// Issue 31, item 8: an image with no user database of its own, only
/// `/etc -> /etc`, and `User: daemon`, a name the host's /etc/passwd has
/// (uid 1). Resolved through the symlink from the daemon, the name was the
/// host's and the function ran as uid 1; inside the rootfs the link leads
/// to itself, so the image has no `daemon` and is refused.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_whose_etc_links_to_etc_cannot_name_a_user_of_the_hosts_passwd() {
    let host = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(host.lines().any(|l| l.starts_with("daemon:x:1:")), "{host}");
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let image = ImageBuilder::new()
        .layer(
            Layer::new()
                .dir("/bin", 0o755)
                .file("/bin/busybox", 0o755, busybox)
                .symlink("/bin/sh", "busybox")
                .symlink("/bin/id", "busybox")
                .symlink("/bin/cat", "busybox")
                .symlink("/etc", "/etc")
                .dir("/tmp", 0o1777)
                .dir("/proc", 0o555)
                .dir("/sys", 0o555)
                .dir("/dev", 0o755),
        )
        .entrypoint(["/bin/sh", "-c", "id -u; cat"])
        .user("daemon")
        .push(&registry, "etc-loop:v1")
        .reference;
    let daemon = Daemon::start(&[]).await;
    let status = daemon
        .client()
        .await
        .run_function(request(&image, FUNCTION_IO))
        .await
        .map(|out| String::from_utf8_lossy(&out.into_inner().output).into_owned())
        .expect_err("ran under a user of the host's /etc/passwd");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("image user \"daemon\" is not in the image's /etc/passwd"),
        "{status:?}"
    );
}

/// How large the hostile /etc/passwd of
/// [`an_image_passwd_past_the_bound_is_refused_without_the_daemon_reading_it`] is.
const HOSTILE_PASSWD_BYTES: usize = 32 << 20;

/// Issue 31, item 3: an image whose /etc/passwd is 32 MiB of entries, the
/// user asked for last. Read whole and parsed into a list, it cost the
/// daemon a few times its size (a 256 MiB one, +516 MiB); refused past
/// 4 MiB before a byte of it is read, the call costs a few MiB, and the
/// daemon keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_passwd_past_the_bound_is_refused_without_the_daemon_reading_it() {
    let registry = Registry::start();
    let mut passwd = String::with_capacity(HOSTILE_PASSWD_BYTES + 64);
    let mut i = 0u32;
    while passwd.len() < HOSTILE_PASSWD_BYTES {
        passwd += &format!("u{i}:x:{i}:{i}::/:/bin/sh\n");
        i += 1;
    }
    passwd += "last:x:4242:4242::/:/bin/sh\n";
    let layers = || {
        ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(Layer::new().file("/etc/passwd", 0o644, passwd.as_bytes()))
    };
    let image = layers()
        .entrypoint(["/bin/sh", "-c", "id -u; cat"])
        .user("last")
        .push(&registry, "big-passwd:v1")
        .reference;
    // Its layers, in an image with nothing to run: refused before its
    // user is looked up, so that what the measured call costs is reading
    // the user database, not extracting the layer.
    let layers_only = layers()
        .user("last")
        .push(&registry, "big-passwd-layers:v1");
    let daemon = Daemon::start(&[]).await;
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
    let mut client = daemon.client().await;
    let pulled = client
        .run_function(request_with_timeout(
            &layers_only.reference,
            FUNCTION_IO,
            Duration::from_secs(600),
        ))
        .await
        .expect_err("nothing to run");
    assert_eq!(pulled.code(), Code::InvalidArgument, "{pulled:?}");
    let before = peak_memory(daemon.xfn_pid());
    let result = client.run_function(request(&image, FUNCTION_IO)).await;
    let after = peak_memory(daemon.xfn_pid());
    eprintln!(
        "peak resident memory of xfn: {} MiB before the call, {} MiB after",
        before >> 20,
        after >> 20
    );
    let status = result
        .map(|out| String::from_utf8_lossy(&out.into_inner().output).into_owned())
        .expect_err("a hostile /etc/passwd was read");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("the image's /etc/passwd is larger than 4194304 bytes"),
        "{status:?}"
    );
    assert!(
        after - before < 8 << 20,
        "reading the image's /etc/passwd took xfn from {} to {} MiB",
        before >> 20,
        after >> 20
    );
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
}
