//! The kernel's per-uid counts that functions share with xfn and the
//! host's processes of its uid (`src/sandbox/ucounts.rs`), against the
//! real `xfn start` as uid 65532 without capabilities: a function taking
//! every inotify instance it can gets its run's share, its neighbours
//! theirs, and the host's processes of the uid keep half; what cannot be
//! bounded (epoll watches) is said at start. The process count too: one
//! function's fork bomb holds its run's limit and fails no neighbour's
//! fork (`src/sandbox/nproc.rs`), in each id shape.
//!
//! Needs: crun, docker-registry, busybox-static, rustc with static glibc,
//! util-linux (setpriv); root.

use std::path::Path;
use std::time::Duration;

use xfn_testkit::*;

/// The end of a hog's `main`: execs its arguments, if any, with what it
/// took held (not close-on-exec).
macro_rules! exec_args {
    () => {
        r#"    let rest: Vec<CString> = std::env::args().skip(1).map(|a| CString::new(a).unwrap()).collect();
    if let Some(program) = rest.first() {
        let mut argv: Vec<*const c_char> = rest.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        unsafe { execv(program.as_ptr(), argv.as_ptr()) };
    }
}
"#
    };
}

/// Takes inotify instances until the kernel refuses one and prints how
/// many it got; with an argument, then execs it, the instances held (not
/// close-on-exec).
const INOTIFY_HOG: &str = concat!(
    r#"
use std::ffi::CString;
use std::os::raw::{c_char, c_int};
extern "C" {
    fn inotify_init1(flags: c_int) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
}
fn main() {
    let mut taken = 0;
    while unsafe { inotify_init1(0) } >= 0 {
        taken += 1;
    }
    println!("took {taken}: {}", std::io::Error::last_os_error());
"#,
    exec_args!()
);

/// The host's per-uid limit of inotify instances.
fn host_inotify_instances() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// How many inotify instances `pid` holds, as the host sees its fds.
fn inotify_instances_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy() == "anon_inode:inotify")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_function_taking_every_inotify_instance_gets_its_runs_share_and_leaves_the_rest() {
    let dir = world_traversable_tempdir();
    let hog = static_rust_binary(dir.path(), "inotify_hog", INOTIFY_HOG);
    let registry = Registry::start();
    let image = |name: &str, entrypoint: &[&str]| {
        ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(Layer::new().file("/hog", 0o755, std::fs::read(&hog).unwrap()))
            .entrypoint(entrypoint.iter().copied())
            .push(&registry, name)
            .reference
    };
    // Reads its input first, so that a warm container takes nothing
    // before its call; then holds what it took while it sleeps.
    let holding = image(
        "holding:v1",
        &[
            "/bin/sh",
            "-c",
            "cat >/dev/null; n=47; exec /hog /bin/busybox sleep ${n}18",
        ],
    );
    let counting = image(
        "counting:v1",
        &["/bin/sh", "-c", "cat >/dev/null; exec /hog"],
    );
    let host = host_inotify_instances();
    let (per_run, functions) = (host / 8, host / 2);

    // Room for the neighbour's run beside the two holding theirs.
    let daemon = Daemon::start(&["--max-concurrent-runs", "3"]).await;
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut client = daemon.client().await;
        let request = request_with_timeout(&holding, FUNCTION_IO, Duration::from_secs(120));
        holders.push(tokio::spawn(
            async move { client.run_function(request).await },
        ));
    }
    // Both hold their run's share, all they could take.
    let pids = loop {
        let pids = processes_with("sleep 4718");
        if pids.len() == 2 {
            break pids;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for pid in &pids {
        // The exec happened once the taking was done.
        assert_eq!(inotify_instances_of(*pid), per_run, "{}", daemon.log());
    }
    // A neighbour's call gets its share in full while they hold theirs.
    let out = daemon
        .client()
        .await
        .run_function(request(&counting, FUNCTION_IO))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    let out = String::from_utf8(out.into_inner().output).unwrap();
    assert!(out.starts_with(&format!("took {per_run}: ")), "{out}");
    // The host's processes of the daemon's uid keep what the functions
    // together cannot take.
    let out = tokio::task::block_in_place(|| {
        unprivileged(NONROOT, Path::new(&hog))
            .output()
            .expect("run the hog on the host")
    });
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let took: usize = out
        .strip_prefix("took ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(took >= host - functions, "{out}");
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for holder in holders {
        let _ = holder.await;
    }
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
}

/// Adds epoll watches (every eventfd it makes, to one epoll instance after
/// another) until the kernel refuses one, writes how many it got and why
/// to /tmp/took, then execs its arguments, the watches held.
const EPOLL_HOG: &str = concat!(
    r#"
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_uint};
#[repr(C, packed)]
struct Event { events: u32, data: u64 }
extern "C" {
    fn eventfd(initval: c_uint, flags: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut Event) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
}
fn main() {
    let fds: Vec<c_int> = (0..4000).map(|_| unsafe { eventfd(0, 0) }).filter(|&fd| fd >= 0).collect();
    let mut taken = 0u64;
    let error = 'taking: loop {
        let epoll = unsafe { epoll_create1(0) };
        if epoll < 0 {
            break 'taking std::io::Error::last_os_error();
        }
        for &fd in &fds {
            let mut event = Event { events: 1, data: 0 };
            if unsafe { epoll_ctl(epoll, 1, fd, &mut event) } != 0 {
                break 'taking std::io::Error::last_os_error();
            }
            taken += 1;
        }
    };
    std::fs::write("/tmp/took", format!("took {taken}: {error}")).unwrap();
"#,
    exec_args!()
);

/// Issue 22's case: a function adds epoll watches until `epoll_ctl` fails
/// with ENOSPC (`fs.epoll.max_user_watches`, counted per host uid). Under
/// xfn's uid that left the gatekeeper unable to adopt a connection and
/// every new call UNAVAILABLE; with subordinate ids the function runs
/// under a host uid of its own (read from the host) and other callers'
/// calls, each on a new connection, keep succeeding while it holds them.
#[tokio::test(flavor = "multi_thread")]
async fn a_function_taking_every_epoll_watch_of_its_uid_leaves_the_daemon_serving_others() {
    let registry = Registry::start();
    let first = subordinate_range(0);
    let daemon = Daemon::start_with_subordinate_ids(first, &["--max-concurrent-runs", "3"]).await;
    assert!(
        daemon
            .log()
            .contains("functions run under host uids that are not xfn's"),
        "{}",
        daemon.log()
    );
    // The image root's host uid is the first subordinate id, not xfn's.
    epoll_hog_leaves_others_served(&daemon, &registry, first, NONROOT).await;
}

/// The epoll attack against `daemon`, which must allow 3 runs at once: a
/// function (run as its image's root) takes every epoll watch its host uid
/// may have and holds them; its host uid must be `function_uid` and
/// xfn's `xfn_uid` (as the host sees them), and other callers' calls, each
/// on a new connection the gatekeeper adopts, keep succeeding meanwhile.
pub(crate) async fn epoll_hog_leaves_others_served(
    daemon: &Daemon,
    registry: &Registry,
    function_uid: u32,
    xfn_uid: u32,
) {
    let dir = world_traversable_tempdir();
    let hog = static_rust_binary(dir.path(), "epoll_hog", EPOLL_HOG);
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/hog", 0o755, std::fs::read(&hog).unwrap()))
        // It sleeps as many seconds as its expected uid: a name no other
        // test's hog has.
        .entrypoint([
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!("cat >/dev/null; u={function_uid}; exec /hog /bin/busybox sleep $u"),
        ])
        .push(registry, "epoll-hog:v1")
        .reference;
    let sleeping = format!("/bin/busybox sleep {function_uid}");
    let echo = echo_image(registry, "echo:v1");
    daemon.call_ok(&echo).await;
    let mut hogger = daemon.client().await;
    let hogging = tokio::spawn(async move {
        hogger
            .run_function(request_with_timeout(
                &image,
                FUNCTION_IO,
                Duration::from_secs(300),
            ))
            .await
    });
    // The exec happens once the taking is done.
    let pid = loop {
        if let Some(pid) = process_where(|cmdline| cmdline == sleeping) {
            break pid;
        }
        assert!(!hogging.is_finished(), "{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = std::fs::read_to_string(format!("/proc/{pid}/root/tmp/took")).unwrap();
    let limit: u64 = std::fs::read_to_string("/proc/sys/fs/epoll/max_user_watches")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(took.ends_with("(os error 28)"), "ENOSPC: {took}");
    assert!(
        took.starts_with(&format!("took {limit}:")),
        "every watch of its uid: {took}"
    );
    assert_eq!(status_field(pid, "Uid"), u64::from(function_uid));
    assert_eq!(status_field(daemon.xfn_pid(), "Uid"), u64::from(xfn_uid));
    // Other callers, each on a new connection the gatekeeper adopts.
    for _ in 0..10 {
        daemon.call_ok(&echo).await;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = hogging.await;
    daemon.call_ok(&echo).await;
}

/// Epoll watches are counted per host uid, not per namespace: without
/// other ids for its functions xfn cannot bound a function's share without
/// a memory limit, and says so at start, with how to give it other ids.
#[tokio::test(flavor = "multi_thread")]
async fn xfn_start_warns_that_epoll_watches_are_shared_with_its_functions() {
    let daemon = Daemon::start(&[]).await;
    let log = daemon.log();
    let limit = std::fs::read_to_string("/proc/sys/fs/epoll/max_user_watches").unwrap();
    assert!(
        log.contains("functions share xfn's host uid")
            && log.contains("fs.epoll.max_user_watches")
            && log.contains(&format!("max_user_watches={}", limit.trim()))
            && log.contains("/etc/subuid"),
        "{log}"
    );
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md")).unwrap();
    assert!(
        readme.contains("fs.epoll.max_user_watches"),
        "docs/design.md says so too"
    );
}

/// Issue 31, item 6: with functions on xfn's own uid, one holding every
/// epoll watch of that uid left 0 of 10 other calls served, and nothing
/// can be registered ahead for them. So `xfn start` as 65532 without
/// capabilities or subordinate ids refuses to start unless
/// `--allow-shared-uid` accepts it, saying why and how to give it ids.
#[test]
fn xfn_start_on_its_own_uid_without_ids_refuses_to_start_unless_the_shared_uid_is_allowed() {
    let dir = world_traversable_tempdir();
    let cache = nonroot_cache(&dir);
    let mut start = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")));
    start
        .arg("start")
        .arg("--address")
        .arg(format!("@xfn-test/{}/shared-uid", std::process::id()))
        .arg("--metrics-address")
        .arg("127.0.0.1:0")
        .arg("--cache-dir")
        .arg(&cache);
    // A daemon that serves instead is killed at the limit, and fails this.
    let out = child::output_within(&mut start, "xfn start", Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("functions would run under xfn's own host uid")
            && stderr.contains("fs.epoll.max_user_watches")
            && stderr.contains("/etc/subuid")
            && stderr.contains("--allow-shared-uid"),
        "{stderr}"
    );
}

/// `xfn run` bounds its runs alike, unprivileged (its own id) and as root
/// (a 65536-id range): the run's namespace shows its share.
#[test]
fn xfn_run_bounds_each_runs_inotify_and_fanotify_counts_with_either_mapping() {
    let registry = Registry::start();
    let image = script_image(
        &registry,
        "counts:v1",
        "cat /proc/sys/user/max_inotify_instances /proc/sys/fs/inotify/max_user_instances",
    );
    let dir = world_traversable_tempdir();
    let cache = dir.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    let host = host_inotify_instances();
    for unprivileged_run in [true, false] {
        let mut cmd = if unprivileged_run {
            unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        } else {
            xfn_command()
        };
        let cache = if unprivileged_run {
            cache.clone()
        } else {
            dir.path().join("root-cache")
        };
        cmd.arg("run")
            .arg("--cache-dir")
            .arg(&cache)
            .arg(&image)
            .arg("-");
        let out = stdout(&run_with_input(cmd, FUNCTION_IO.as_bytes()));
        assert_eq!(out, format!("{}\n{host}\n", host / 8), "{unprivileged_run}");
    }
}

/// `/setuid ID PROGRAM ARGS…`: runs PROGRAM as uid and gid ID (groups
/// dropped where the run may).
const SETUID: &str = r#"
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_uint};
extern "C" {
    fn setgroups(size: usize, list: *const c_uint) -> c_int;
    fn setresgid(r: c_uint, e: c_uint, s: c_uint) -> c_int;
    fn setresuid(r: c_uint, e: c_uint, s: c_uint) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
}
fn main() {
    let args: Vec<CString> = std::env::args().skip(1).map(|a| CString::new(a).unwrap()).collect();
    let id: c_uint = args[0].to_str().unwrap().parse().unwrap();
    unsafe {
        setgroups(0, std::ptr::null());
        assert_eq!(setresgid(id, id, id), 0, "setresgid {id}");
        assert_eq!(setresuid(id, id, id), 0, "setresuid {id}");
        let mut argv: Vec<*const c_char> = args[1..].iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        execv(argv[0], argv.as_ptr());
    }
    panic!("exec {:?}", args[1]);
}
"#;

/// Issue 31's fork bomb, against the daemon in each id shape: a function
/// forks sleepers until the kernel refuses (as each of `uids`, which its
/// run maps: the run's limit holds for all its uids together) and holds
/// them; meanwhile 10 calls of another image and a neighbour forking 200
/// children succeed, then the bomb's call reports its refused fork. Before
/// the fix every run's tasks were counted against one shared limit, and 9
/// of 10 other calls failed with `clone: Resource temporarily unavailable`.
async fn a_fork_bomb_leaves_its_neighbours_forking(daemon: Daemon, uids: &str, marker: u32) {
    let dir = world_traversable_tempdir();
    let setuid = static_rust_binary(dir.path(), "setuid", SETUID);
    let registry = Registry::start();
    let (sleeper, holder) = (format!("sleep {marker}1"), format!("sleep {marker}2"));
    let bomb = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/setuid", 0o755, std::fs::read(&setuid).unwrap()))
        .entrypoint([
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!(
                "cat >/dev/null; for u in {uids}; do /setuid $u /bin/sh -c \
                 'i=0; while [ $i -lt 2048 ]; do {sleeper} </dev/null >/dev/null 2>&1 & \
                 i=$((i+1)); done; echo forked 2048 times >&2' & p=\"$p $!\"; done; wait $p; \
                 exec {holder}"
            ),
        ])
        .push(&registry, "fork-bomb:v1")
        .reference;
    let neighbour = script_image(
        &registry,
        "neighbour:v1",
        "cat >/dev/null; for i in $(seq 200); do sleep 1 & done; wait && echo forked 200",
    );
    let echo = echo_image(&registry, "echo:v1");
    daemon.call_ok(&echo).await;
    let mut client = daemon.client().await;
    let bomb_request = request_with_timeout(&bomb, FUNCTION_IO, Duration::from_secs(300));
    let bombing = tokio::spawn(async move { client.run_function(bomb_request).await });
    let held = loop {
        if let Some(pid) = process_where(|cmdline| cmdline == holder) {
            break pid;
        }
        assert!(!bombing.is_finished(), "{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The run holds its limit, all its uids together. The kernel counts a
    // task from its fork, so a child still between its fork and its exec
    // of `sleep` is counted though its command line is its shell's yet:
    // under load, 623 of 1,020 children had exec'd when the holder
    // started. The count: the run's tasks (its PID namespace), refused a
    // fork at the limit; then each loop's shell ended, one task for each
    // of `uids`, whose place another loop may have taken before it ended.
    let limit = xfn::runner::DEFAULT_PIDS_LIMIT as usize;
    let loops = uids.split_whitespace().count();
    let tasks = tasks_in_pid_namespace_of(held);
    let bounded = tasks < limit && tasks >= limit - loops;
    // Every one of them but the holder is a sleeper, once each has exec'd
    // (bounded against a child that never does, not a time check).
    let execd = processes_where(|cmdline| cmdline == sleeper).len();
    let mut sleepers = execd;
    for _ in 0..1200 {
        if sleepers + 1 >= tasks {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        sleepers = processes_where(|cmdline| cmdline == sleeper).len();
    }
    // Other callers, each on a new connection, and a neighbour that forks.
    let mut failed = Vec::new();
    for _ in 0..10 {
        if let Err(status) = daemon
            .client()
            .await
            .run_function(request(&echo, FUNCTION_IO))
            .await
        {
            failed.push(status.message().to_string());
        }
    }
    let forked = daemon
        .client()
        .await
        .run_function(request(&neighbour, FUNCTION_IO))
        .await
        .map(|out| String::from_utf8_lossy(&out.into_inner().output).into_owned());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(held as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let bombed = bombing.await.unwrap();
    println!(
        "{uids}: the bomb's run held {tasks} tasks, {sleepers} sleepers ({execd} had exec'd \
         as the holder started; limit {limit}); {} of 10 other calls failed; the neighbour: \
         {forked:?}",
        failed.len()
    );
    assert!(
        bounded,
        "the bomb's run holds {tasks} tasks, the limit is {limit} and it had {loops} loops"
    );
    assert_eq!(sleepers + 1, tasks, "the sleepers and the holder");
    assert_eq!(failed, Vec::<String>::new(), "{}", daemon.log());
    assert_eq!(forked.as_deref().ok(), Some("forked 200\n"), "{forked:?}");
    let status = bombed.expect_err("the bomb's holder was killed");
    assert!(
        status
            .message()
            .contains("can't fork: Resource temporarily unavailable"),
        "{status:?}"
    );
    // Killing the function's first process ended its run and every
    // process the bomb made.
    for _ in 0..1200 {
        if processes_where(|cmdline| cmdline == sleeper).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        processes_where(|cmdline| cmdline == sleeper),
        Vec::<u32>::new()
    );
    daemon.call_ok(&echo).await;
}

/// xfn unprivileged with its own id only (functions under xfn's uid).
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_under_xfns_own_id_leaves_other_calls_and_a_forking_neighbour_served() {
    let daemon = Daemon::start(&["--max-concurrent-runs", "3"]).await;
    a_fork_bomb_leaves_its_neighbours_forking(daemon, "0", 3741).await;
}

/// xfn unprivileged with subordinate ids: the bomb switches between three
/// of its uids, and its run's limit holds for them together.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_over_three_subordinate_ids_leaves_other_calls_and_a_forking_neighbour_served()
{
    let first = subordinate_range(3);
    let daemon = Daemon::start_with_subordinate_ids(first, &["--max-concurrent-runs", "3"]).await;
    a_fork_bomb_leaves_its_neighbours_forking(daemon, "0 1 2", 3751).await;
}

/// xfn as root, mapping a 65536-id range: as with subordinate ids.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_over_three_ids_of_roots_range_leaves_other_calls_and_a_forking_neighbour_served(
) {
    let daemon = Daemon::start_as_root(&["--max-concurrent-runs", "3"]).await;
    a_fork_bomb_leaves_its_neighbours_forking(daemon, "0 1 2", 3761).await;
}
