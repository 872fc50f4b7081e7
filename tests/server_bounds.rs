//! What callers and functions cannot do to the real `xfn start` (as uid
//! 65532, no capabilities): deep input is refused before it is parsed
//! while other calls are served, a function's stderr cannot write lines of
//! its own into the daemon's log, a bad image and a full cache get the
//! codes that say so, a call's pull ends with the call, and a cache dir
//! another user owns is refused at start.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use tonic::Code;
use xfn_testkit::registry::hostile::{Fault, HostileRegistry, Target};
use xfn_testkit::*;

/// Every input the daemon accepts is at most this (`--max-input-bytes`'s
/// default).
const INPUT_CAP: usize = 4 << 20;

/// A FunctionIO of exactly [`INPUT_CAP`] bytes whose `observed` opens flow
/// sequences to its end: libyaml took 11.9 s for 100,000 of them before
/// the bound, and grows with their square.
fn deep_flow_input() -> String {
    let head = "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: ";
    format!("{head}{}", "[".repeat(INPUT_CAP - head.len()))
}

/// The same size, nested by indentation: `- - - …` on one line.
fn deep_block_input() -> String {
    let head = "observed:\n";
    let body = "- ".repeat((INPUT_CAP - head.len() - 1) / 2);
    let text = format!("{head}{body}x");
    let pad = " ".repeat(INPUT_CAP - text.len());
    text + &pad
}

#[tokio::test(flavor = "multi_thread")]
async fn deep_input_at_the_cap_is_refused_before_parsing_while_other_calls_are_served() {
    let registry = Registry::start();
    let echo = echo_image(&registry, "echo:v1");
    let daemon = Daemon::start(&[]).await;
    daemon.call_ok(&echo).await;
    let (flow, block) = (deep_flow_input(), deep_block_input());
    assert_eq!((flow.len(), block.len()), (INPUT_CAP, INPUT_CAP));

    let mut calls = Vec::new();
    for i in 0..8 {
        let input = if i % 2 == 0 {
            flow.clone()
        } else {
            block.clone()
        };
        let mut client = daemon.client().await;
        let image = echo.clone();
        calls.push(tokio::spawn(async move {
            let started = Instant::now();
            let answer = client.run_function(request(&image, &input)).await;
            (answer, started.elapsed())
        }));
    }
    // Served meanwhile: calls of other callers, one after another.
    for _ in 0..4 {
        daemon.call_ok(&echo).await;
    }
    for call in calls {
        let (answer, took) = call.await.unwrap();
        let status = answer.expect_err("deep input is refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        // Refused at the 65th level, on line 3 or 2: the scan stopped
        // there, not at the end of the 4 MiB.
        let message = status.message();
        assert!(
            message.contains("nested more than 64 levels deep (at line")
                && message.contains("refused before parsing"),
            "{status:?}"
        );
        eprintln!("deep call refused after {took:?}: {message}");
    }
    assert_eq!(daemon.runs("invalid_argument").await, 8.0);
    assert_eq!(daemon.runs("ok").await, 5.0);
}

/// A FunctionIO of [`INPUT_CAP`] bytes that is plain YAML: many small
/// objects, as a large composite's observed resources are.
fn large_input() -> String {
    let mut text = String::from("observed:\n");
    let mut i = 0;
    while text.len() < INPUT_CAP - 64 {
        text += &format!("  r{i}: {{a: [1, 2, {{b: c}}], d: text}}\n");
        i += 1;
    }
    let pad = "#".repeat(INPUT_CAP - text.len());
    text + &pad
}

#[tokio::test(flavor = "multi_thread")]
async fn large_inputs_at_once_are_parsed_within_the_memory_budget() {
    let daemon = Daemon::start(&[]).await;
    let input = large_input();
    assert_eq!(input.len(), INPUT_CAP);
    let req = never_pulled(&input);
    let mut calls = Vec::new();
    for _ in 0..6 {
        let mut client = daemon.client().await;
        let req = req.clone();
        calls.push(tokio::spawn(async move { client.run_function(req).await }));
    }
    for call in calls {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    }
    // yaml_serde holds about 80 times a document while it parses it: six
    // at once would peak past 1.9 GiB; the budget lets 8 MiB of input be
    // parsed at a time.
    let peak = peak_memory(daemon.xfn_pid());
    eprintln!("peak resident memory of xfn: {} MiB", peak >> 20);
    assert!(peak < 1 << 30, "xfn peaked at {} MiB", peak >> 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn alias_bombs_are_invalid_arguments_that_cost_the_daemon_no_copies() {
    let mut grown = Vec::new();
    for (name, bomb) in alias_bombs() {
        let (answer, growth) = bomb_call(name, &bomb).await;
        grown.push((name, answer, growth));
    }
    // Accepted just within the bound: 198 copies of a 20 KB anchored
    // scalar (one more is refused, src/nesting/aliases.rs), about 4 MB.
    let edge = format!(
        "{{a: &a {}, b: [{}]}}",
        "x".repeat(20_000),
        ["*a"; 198].join(",")
    );
    for (name, bomb) in [("edge", edge)] {
        let (answer, growth) = bomb_call(name, &bomb).await;
        // Accepted: past the parse, the pull is refused.
        let status = answer.expect_err(name);
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{name}: {status:?}"
        );
        assert!(growth < 32 << 20, "{name}: +{} MiB", growth >> 20);
    }
    for (name, answer, growth) in grown {
        let status = answer.expect_err(name);
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(
            status
                .message()
                .contains("input is not a FunctionIO: its aliases expand too far"),
            "{name}: {status:?}"
        );
        // Without the bound the wide bomb took +300 MiB and the list +480.
        assert!(growth < 32 << 20, "{name}: +{} MiB", growth >> 20);
    }
}

/// A call of `input` for an image never pulled: it ends once its input is
/// checked and parsed.
fn never_pulled(input: &str) -> pb::RunFunctionRequest {
    let mut req = request("registry.invalid/absent:v1", input);
    req.image_pull_config = Some(pb::ImagePullConfig {
        pull_policy: pb::ImagePullPolicy::Never as i32,
        auth: None,
    });
    req
}

/// The answer to a call whose input's config is `bomb`, and how much it
/// grew the peak memory of a daemon of its own (so each bomb's peak is its
/// own) past that of a call whose input is parsed and whose pull is
/// refused: the daemon's peak without the bomb.
async fn bomb_call(
    name: &str,
    bomb: &str,
) -> (
    Result<tonic::Response<pb::RunFunctionResponse>, tonic::Status>,
    u64,
) {
    let daemon = Daemon::start(&[]).await;
    let mut client = daemon.client().await;
    let status = client
        .run_function(never_pulled(FUNCTION_IO))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let before = peak_memory(daemon.xfn_pid());
    let input = format!("{FUNCTION_IO}config: {bomb}\n");
    let answer = client.run_function(never_pulled(&input)).await;
    let after = peak_memory(daemon.xfn_pid());
    eprintln!(
        "{name} ({} bytes): daemon peak {:.1} -> {:.1} MiB (+{:.1}): {answer:?}",
        input.len(),
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        (after - before) as f64 / 1048576.0
    );
    (answer, after - before)
}

/// A JSON value whose objects never repeat a key (serde_json would keep
/// the last of two silently).
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("key {key:?} twice")));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
}

/// A function that fails after writing to its stderr what would be log
/// lines of its own: a newline, a forged record, CR, NUL and a terminal
/// escape.
fn forging_image(registry: &Registry) -> String {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint([
            "/bin/sh",
            "-c",
            r"cat >/dev/null; printf 'oops\n2026-11-25T00:00:00.000000Z ERROR xfn: FORGED-LINE\r\000\033[2Jend' >&2; exit 3",
        ])
        .push(registry, "forger:v1")
        .reference
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_function_s_stderr_cannot_write_lines_into_the_text_log() {
    let registry = Registry::start();
    let image = forging_image(&registry);
    let daemon = Daemon::start(&[]).await;
    let status = daemon
        .client()
        .await
        .run_function(request(&image, FUNCTION_IO))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    // The caller gets the stderr as it was written.
    assert!(status.message().contains("oops\n2026"), "{status:?}");
    assert!(status.message().contains("FORGED-LINE\r\0"), "{status:?}");
    daemon.wait_for_log("call failed", 1).await;
    let log = daemon.log();
    assert!(log.contains("FORGED-LINE"), "{log}");
    assert!(
        log.lines()
            .all(|line| !line.contains("ERROR xfn: FORGED-LINE") || line.contains("call failed")),
        "a forged line:\n{log}"
    );
    assert!(!log.contains(['\r', '\0', '\u{1b}']), "{log:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_json_log_has_one_message_key_and_the_error_beside_it() {
    let registry = Registry::start();
    let image = forging_image(&registry);
    let daemon = Daemon::start(&["--log-format", "json"]).await;
    daemon
        .client()
        .await
        .run_function(request(&image, FUNCTION_IO))
        .await
        .unwrap_err();
    daemon.wait_for_log("call failed", 1).await;
    let log = daemon.log();
    let mut failed = 0;
    for line in log.lines() {
        serde_json::from_str::<UniqueKeys>(line).unwrap_or_else(|e| panic!("{e}: {line}\n{log}"));
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        if record["fields"]["message"] == "call failed" {
            failed += 1;
            let error = record["fields"]["error"].as_str().unwrap_or_default();
            assert!(error.contains("oops\n2026"), "{line}");
            assert!(error.contains("FORGED-LINE\r\0"), "{line}");
        }
    }
    assert_eq!(failed, 1, "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_image_is_an_invalid_argument() {
    let registry = Registry::start();
    let escaping = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::verbatim().entry(tar::EntryType::Regular, "../escape", "", 0o644, b"x"))
        .entrypoint(["/bin/cat"])
        .push(&registry, "escaping:v1")
        .reference;
    let not_a_tar = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::verbatim().raw(vec![0xab; 512]))
        .entrypoint(["/bin/cat"])
        .push(&registry, "not-a-tar:v1")
        .reference;
    let daemon = Daemon::start(&[]).await;
    let mut client = daemon.client().await;
    for (image, says) in [
        (&escaping, "refused"),
        (&not_a_tar, "reading the layer tar"),
    ] {
        let status = client
            .run_function(request(image, FUNCTION_IO))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
}

/// A tmpfs of `size` mounted at `dir` for uid 65532, unmounted when dropped.
struct SmallDisk<'a>(&'a Path);

impl<'a> SmallDisk<'a> {
    fn mount(dir: &'a Path, size: &str) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "mounting a small cache disk needs root (the tests run as root)"
        );
        std::fs::create_dir_all(dir).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size},mode=0700,uid={NONROOT},gid={NONROOT}").as_str()),
        )
        .expect("mount a tmpfs");
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk<'_> {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_cache_is_resource_exhausted() {
    let registry = Registry::start();
    let big = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/big", 0o644, pseudo_random_bytes(7, 24 << 20)))
        .entrypoint(["/bin/cat"])
        .push(&registry, "big:v1")
        .reference;
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    let _disk = SmallDisk::mount(&cache, "16m");
    let daemon = Daemon::start_with_cache(Some(&cache), &[]).await;
    let status = daemon
        .client()
        .await
        .run_function(request(&big, FUNCTION_IO))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("No space left on device"),
        "{status:?}"
    );
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_s_pull_ends_with_the_call_s_timeout() {
    let registry = HostileRegistry::start();
    let image = registry.serve(
        &ImageBuilder::new()
            .layer(Layer::busybox())
            .entrypoint(["/bin/cat"]),
        "fn:v1",
    );
    let layer = image.image.layers[0].digest.clone();
    registry.fault(
        Target::Blob(layer),
        Fault::Drip {
            every: Duration::from_secs(1),
        },
    );
    // --pull-timeout stays at its default, 10 minutes.
    let daemon = Daemon::start(&[]).await;
    let status = daemon
        .client()
        .await
        .run_function(request_with_timeout(
            &image.reference,
            FUNCTION_IO,
            Duration::from_secs(3),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("took longer than 3s")
            && status.message().contains("the time the call had"),
        "{status:?}"
    );
    // The pull let go of its connection when the call ended.
    let r = &registry;
    tokio::task::block_in_place(|| {
        r.wait_until("the drip's client hung up", Duration::from_secs(60), |r| {
            r.drips_abandoned() == 1
        })
    });
}

/// `xfn start` as uid 65532 on `cache`, which must exit: its exit status
/// and stderr (a daemon that serves instead is killed, and the test fails).
fn start_refused(cache: &Path) -> (std::process::ExitStatus, String) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        .arg("start")
        .arg("--address")
        .arg(format!("@xfn-test/{}/owner", std::process::id()))
        .arg("--metrics-address")
        .arg("127.0.0.1:0")
        .arg("--cache-dir")
        .arg(cache)
        .arg("--allow-shared-uid")
        .stdin(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("spawn xfn start");
    for _ in 0..300 {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, std::fs::read_to_string(log.path()).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "xfn start served on {}:\n{}",
        cache.display(),
        std::fs::read_to_string(log.path()).unwrap()
    );
}

/// Issue 31, item 7: a cache dir another uid can rename entries in is
/// refused before anything is put in it. A root-owned 0777 dir (what an
/// emptyDir or a shared /var/tmp path looks like) was accepted with a
/// warning; another uid renamed `layers`, xfn pulled into the replacement,
/// and that uid rewrote the function the next calls ran.
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_dir_another_uid_can_rename_entries_in_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |path: &Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let base = world_traversable_tempdir();
    // Writable by xfn, so nothing but the check keeps xfn from using it.
    let foreign = base.path().join("foreign");
    dir_owned_by(&foreign, 4322);
    chmod(&foreign, 0o777);
    // An emptyDir: root's, mode 0777; and xfn's own dir inside one.
    let empty_dir = base.path().join("empty-dir");
    std::fs::create_dir(&empty_dir).unwrap();
    chmod(&empty_dir, 0o777);
    let inside = empty_dir.join("xfn");
    dir_owned_by(&inside, NONROOT);
    for (cache, dir, why) in [
        (
            &empty_dir,
            &empty_dir,
            "is writable by its group and others (mode 777) without the sticky bit",
        ),
        (
            &inside,
            &empty_dir,
            "is writable by its group and others (mode 777) without the sticky bit",
        ),
        (
            &foreign,
            &foreign,
            "is owned by uid 4322, not by root or xfn",
        ),
    ] {
        let before = std::fs::read_dir(cache).unwrap().count();
        let (status, stderr) = start_refused(cache);
        assert!(!status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "the cache dir {} is not xfn's alone: {} {why}",
                cache.display(),
                dir.display()
            )) && stderr.contains("Use a cache dir that only xfn's uid 65532 (or root) can write"),
            "{stderr}"
        );
        assert_eq!(
            std::fs::read_dir(cache).unwrap().count(),
            before,
            "nothing is put in it"
        );
    }

    // One not made yet, which xfn would make there (and its neighbours
    // then rename): refused before it is made.
    let later = empty_dir.join("later");
    let (status, stderr) = start_refused(&later);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the cache dir {} is not xfn's alone: {} is writable",
            later.display(),
            empty_dir.display()
        )),
        "{stderr}"
    );
    assert!(!later.exists(), "nothing is made");

    // What passes: xfn's own dir in a sticky one (others cannot rename
    // it), and a dir xfn creates under root's dirs others cannot write.
    let registry = Registry::start();
    let sticky = base.path().join("shared");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    let own = sticky.join("xfn");
    dir_owned_by(&own, NONROOT);
    chmod(&own, 0o700);
    let daemon = Daemon::start_with_cache(Some(&own), &[]).await;
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
    drop(daemon);
    let parent = base.path().join("var-cache");
    dir_owned_by(&parent, NONROOT);
    let daemon = Daemon::start_with_cache(Some(&parent.join("xfn")), &[]).await;
    daemon.call_ok(&echo_image(&registry, "echo:v1")).await;
}

/// The longest line of the daemon's log.
fn longest_log_line(daemon: &Daemon) -> usize {
    daemon.log().lines().map(str::len).max().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn megabyte_inputs_are_refused_as_invalid_with_a_short_echo_in_the_status_and_the_log() {
    let daemon = Daemon::start(&[]).await;
    let long = "a".repeat(1 << 20);
    // Through grpcio (C-core): a status message past its metadata limit
    // became RESOURCE_EXHAUSTED there, whatever the daemon's code.
    let image = format!("registry.invalid/fn:{long}");
    let refused = grpcio_run_function(
        &daemon,
        &daemon.grpcio_target(),
        &request(&image, FUNCTION_IO),
    )
    .expect_err("a 1 MiB image reference is refused");
    eprintln!("grpcio: {} bytes: {}", refused.len(), refused.trim());
    assert!(
        refused.starts_with("INVALID_ARGUMENT: invalid image reference \"registry.invalid/fn:aaa")
            && refused.contains(&format!("…[{} more bytes]", image.len() - 256)),
        "{refused}"
    );
    assert!(refused.len() < 1024, "{} bytes", refused.len());

    // Every other field a request echoes, through tonic.
    let mut client = daemon.client().await;
    let mut limits = request("registry.invalid/fn:v1", FUNCTION_IO);
    limits.run_function_config = Some(xfn_testkit::pb::RunFunctionConfig {
        resources: Some(xfn_testkit::pb::ResourceConfig {
            limits: Some(xfn_testkit::pb::ResourceLimits {
                memory: long.clone(),
                cpu: String::new(),
            }),
        }),
        ..Default::default()
    });
    for (what, req) in [
        (
            "image",
            request(&format!("registry.invalid/{long}:v1"), FUNCTION_IO),
        ),
        (
            "apiVersion",
            request(
                "registry.invalid/fn:v1",
                &format!("apiVersion: {long}\nkind: FunctionIO\n"),
            ),
        ),
        (
            "kind",
            request(
                "registry.invalid/fn:v1",
                &format!("apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: {long}\n"),
            ),
        ),
        ("memory limit", limits),
    ] {
        let status = client.run_function(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let message = status.message();
        assert!(
            message.contains("aaaa\"…[") && message.contains(" more bytes]"),
            "{what}: {message}"
        );
        assert!(message.len() < 1024, "{what}: {} bytes", message.len());
    }
    // The log said each refusal, none with the megabyte.
    daemon.wait_for_log("call failed", 5).await;
    let longest = longest_log_line(&daemon);
    assert!(longest < 4096, "a log line of {longest} bytes");
}
