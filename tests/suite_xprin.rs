//! `xfn test` against xprin (issue 44). Suites as xprin's users write them
//! run unchanged (tests/suite/compat_xprin.yaml); xprin's flags are taken;
//! SIGINT and SIGTERM stop a run leaving nothing behind; and the suites of
//! tests/suite/ run side by side by xprin itself (v0.2.0, forking the
//! `crossplane` CLI with Crossplane's render engine, all three built by
//! scripts/peers.sh) and by `xfn test` give the same verdict for every test
//! and assertion, and the same counts in JUnit.
use super::*;

use std::time::{Duration, Instant};

use xfn_testkit::child::ChildGuard;
use xfn_testkit::peers;

/// An XBucket CRD that takes any spec: validation passes for the XR, so
/// only the kinds no CRD defines can fail it.
const OPEN_CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: xbuckets.example.org}
spec:
  group: example.org
  names: {kind: XBucket, plural: xbuckets, singular: xbucket, listKind: XBucketList}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
";

#[test]
fn a_suite_brought_from_xprin_runs_unchanged() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let out = suites.test(&["-v", "compat_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "--- PASS: hooks run in the suite's directory (",
            "[✓] pre-test hook relative paths: passed",
            "[✓] a float count: found 5 resources (as expected)",
            "[✓] post-test hook count {{ .Outputs.RenderCount }}: passed",
            "--- PASS: a hyphenated id through index and a template as a number (",
            "[✓] as many as the first: found 5 resources (as expected)",
            "[✓] quoted as many: found 5 resources (as expected)",
            "--- FAIL: a failing post-test hook stops the rest (",
            "[x] post-test hook fails: exit status: 1",
            "--- FAIL: a connection secret name needs connection-secret (",
            "[!] patch: connection-secret must be set to true when using connection-secret-name",
            "[!] setup: inputs.xr: {{ .Tests.early.Outputs.XR }}: test early failed before its outputs",
        ],
    );
    for placeholder in ["__OPEN__", "Some(", "Number(", "no earlier test has id"] {
        assert!(!all.contains(placeholder), "{placeholder} in:\n{all}");
    }
    // The hooks ran in the suite file's directory, in order, and the one
    // after a failing post-test hook did not run.
    let pwd = std::fs::read_to_string(suites.path("scratch/compat-pwd")).unwrap();
    assert_eq!(
        Path::new(pwd.trim()).canonicalize().unwrap(),
        suites.dir.path().canonicalize().unwrap()
    );
    let count = std::fs::read_to_string(suites.path("scratch/compat-count")).unwrap();
    assert_eq!(count.trim(), "5");
    assert!(!suites.path("scratch/compat-never").exists());
}

#[test]
fn a_suite_without_tests_says_so_and_passes_and_duplicate_ids_are_refused() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    std::fs::write(suites.path("empty_xprin.yaml"), "tests: []\n").unwrap();
    let out = suites.test(&["empty_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("?   \tempty_xprin.yaml\t[no test cases found]"),
        "{}",
        text(&out)
    );
    let quiet = suites.test(&["-q", "empty_xprin.yaml"]);
    assert_eq!(quiet.status.code(), Some(0), "{}", text(&quiet));
    assert!(!text(&quiet).contains("no test cases"), "{}", text(&quiet));

    std::fs::write(
        suites.path("twice_xprin.yaml"),
        "tests:\n- {name: a, id: same, inputs: {xr: data/xr.yaml}}\n\
         - {name: b, id: same, inputs: {xr: data/xr.yaml}}\n",
    )
    .unwrap();
    let out = suites.test(&["twice_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_has(
        &text(&out),
        &[
            "FAIL\ttwice_xprin.yaml [setup failed]",
            "duplicate test case ID \"same\" found",
        ],
    );
}

#[test]
fn xprin_s_flags_are_taken_and_show_what_they_name() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let out = xfn_command()
        .args(["test", "--cache-dir"])
        .arg(suites.path("cache"))
        // xprin's `-c FILE`: its configuration.
        .arg("-c")
        .arg(suites.path("xprin-config.yaml"))
        .args([
            "-v",
            "-q",
            "--color",
            "on",
            "--show-render",
            "--show-validate",
            "--show-hooks",
            "--show-assertions",
            "chain_xprin.yaml",
        ])
        .current_dir(suites.dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("spawn xfn");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_has(
        &all,
        &[
            // --color on: the marks and verdicts in colour, even in a pipe.
            "\x1b[32m[✓]\x1b[0m three buckets",
            "--- \x1b[32mPASS\x1b[0m: first loop (",
            // --show-render: the rendered resources under the render.
            "render: 5 resources\n        XBucket/demo\n        Deployment/my-app\n",
        ],
    );
    let off = suites.test(&["-v", "--color", "off", "--show-hooks", "compat_xprin.yaml"]);
    assert!(!text(&off).contains('\x1b'), "{}", text(&off));
    // --show-* without -v: said to need it, as xprin says.
    let alone = suites.test(&["--show-render", "chain_xprin.yaml"]);
    assert_has(&text(&alone), &["--show-render requires -v"]);
}

#[test]
fn a_kind_no_crd_defines_fails_validation_unless_the_configuration_leaves_out_the_flag() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    std::fs::write(suites.path("data/open-crd.yaml"), OPEN_CRD).unwrap();
    // The composed Deployment as a kind nothing defines (a Deployment is
    // judged against Kubernetes' own schema, as the CLI judges it).
    let composition = std::fs::read_to_string(suites.path("data/composition.yaml"))
        .unwrap()
        .replace(
            "apiVersion: apps/v1\n        kind: Deployment",
            "apiVersion: example.org/v1\n        kind: Widget",
        );
    assert!(composition.contains("kind: Widget"));
    std::fs::write(suites.path("data/widget-composition.yaml"), composition).unwrap();
    std::fs::write(
        suites.path("validate_xprin.yaml"),
        "tests:\n- name: validated\n  inputs:\n    xr: data/xr.yaml\n    \
         composition: data/widget-composition.yaml\n    functions: functions.yaml\n    \
         crds: [data/open-crd.yaml]\n",
    )
    .unwrap();
    // xprin's default configuration validates with --error-on-missing-schemas.
    let out = suites.test(&["validate_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_has(
        &text(&out),
        &[
            "[x] validate: Widget/my-app (example.org/v1, document ",
            "no CRD or XRD given defines this kind and version",
        ],
    );
    // A configuration whose validate command leaves it out: a warning.
    let config = suites.path("lenient.yaml");
    std::fs::write(
        &config,
        "subcommands:\n  validate: beta validate --cache-dir /tmp/nowhere\n",
    )
    .unwrap();
    let out = suites
        .command(&config)
        .arg("validate_xprin.yaml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Pids of the live processes in process group `group`, as /proc/PID/stat
/// says (a zombie is dead: its parent, here init, has yet to reap it).
fn processes_in_group(group: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's `)`: state, ppid, pgrp.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let live = fields.first().is_some_and(|state| *state != "Z");
        if live && fields.get(2).and_then(|g| g.parse().ok()) == Some(group) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn sigint_and_sigterm_stop_hooks_servers_and_containers_and_remove_the_run_s_directories() {
    // The Function as a Docker-runtime server: a container the run starts
    // for its first test and keeps for the next, whose hook is stopped.
    let registry = Registry::start();
    let image = function_server_image(&registry, "fn-server:v1", &[]);
    let suites = Suites::new(&xfn_testkit::render::function_object(
        "fn",
        &image,
        &["render.crossplane.io/runtime: Docker"],
    ));
    let cache = suites.path("cache");
    for (signal, code) in [
        (nix::sys::signal::Signal::SIGTERM, 143),
        (nix::sys::signal::Signal::SIGINT, 130),
    ] {
        let marker = format!("xfn-signal-{}-{code}", std::process::id());
        let group_file = suites.path(&format!("scratch/{marker}"));
        // A hook that would run for minutes, with a child of its own.
        std::fs::write(
            suites.path("signal_xprin.yaml"),
            format!(
                "common:\n  inputs:\n    composition: data/composition.yaml\n    \
                 functions: functions.yaml\ntests:\n- name: renders\n  id: first\n  \
                 inputs: {{xr: data/xr.yaml}}\n- name: stopped\n  inputs:\n    \
                 xr: {{{{ .Tests.first.Outputs.XR }}}}\n  hooks:\n    pre-test:\n    \
                 - run: \"sh -c 'sleep 300; : {marker}' & echo $$ > scratch/{marker}; \
                 sleep 300\"\n"
            ),
        )
        .unwrap();
        // The run's temporary directories go here (as xfn's mapped uid
        // when root: writable by all).
        let tmp = suites.path(&format!("tmp-{code}"));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut command = suites.command(&suites.path("xprin-config.yaml"));
        command
            .arg("signal_xprin.yaml")
            .env("TMPDIR", &tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn(&mut command);
        // The hook's shell names its group once `echo` has written the
        // whole line: the file exists (created by the redirection) before.
        // Generous: the hook starts within seconds even on a loaded machine.
        let started = Instant::now();
        let group: u32 = loop {
            let line = std::fs::read_to_string(&group_file).unwrap_or_default();
            if let Some(group) = line.strip_suffix('\n').and_then(|g| g.parse().ok()) {
                break group;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the hook never started: {line:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // Before: the hook, the container and the run's directory are there.
        assert!(
            !processes_in_group(group).is_empty(),
            "the hook is not running"
        );
        assert!(
            !xfn_testkit::proc::processes_rooted_under(&cache).is_empty(),
            "the Function's container is not running"
        );
        assert!(std::fs::read_dir(&tmp).unwrap().next().is_some());
        let pid = nix::unistd::Pid::from_raw(child.child().id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        let out = child.output_within("xfn test", Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(code), "{signal}: {}", text(&out));
        assert_has(&text(&out), &[&format!("{signal} received: stopped")]);
        // After: none of them.
        assert_eq!(processes_in_group(group), Vec::<u32>::new(), "{signal}");
        assert_eq!(
            xfn_testkit::proc::processes_with(&marker),
            Vec::<u32>::new()
        );
        assert_eq!(
            xfn_testkit::proc::processes_rooted_under(&cache),
            Vec::<u32>::new(),
            "{signal}: the Function's container outlived the run"
        );
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
        assert!(left.is_empty(), "{signal}: left {left:?}");
    }
}

/// One run's verdicts: each test's, in order, with its assertions'
/// (`name`, mark) in order.
type Verdicts = Vec<(String, String, Vec<(String, String)>)>;

/// The verdicts in xprin's `-v --show-assertions` output.
fn xprin_verdicts(out: &str) -> Verdicts {
    let mut verdicts: Verdicts = Vec::new();
    let mut in_assertions = false;
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("--- ") {
            let (verdict, rest) = rest.split_once(": ").unwrap_or((rest, ""));
            let name = rest.rsplit_once(" (").map_or(rest, |(n, _)| n);
            verdicts.push((name.into(), verdict.into(), Vec::new()));
            in_assertions = false;
        } else if line.starts_with("    ") && !line.starts_with("     ") {
            in_assertions = line.trim() == "Assertions:";
        } else if in_assertions {
            let Some((mark, rest)) = line.trim().split_once("] ") else {
                continue;
            };
            if !["[✓", "[x", "[!", "[s"].contains(&mark) {
                continue; // a line of a diff
            }
            // `[x] NAME - MESSAGE`, or `[x] NAME` above a diff.
            let name = rest.split_once(" - ").map_or(rest, |(name, _)| name);
            if let Some(last) = verdicts.last_mut() {
                last.2.push((name.into(), format!("{mark}]")));
            }
        }
    }
    verdicts
}

/// The verdicts in `xfn test -v`'s output: its checks but the phases'.
fn xfn_verdicts(out: &str) -> Verdicts {
    let phase = |name: &str| {
        ["render", "validate", "setup", "patch", "hook"].contains(&name)
            || name.starts_with("pre-test hook ")
            || name.starts_with("post-test hook ")
    };
    let mut verdicts: Verdicts = Vec::new();
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("--- ") {
            let (verdict, rest) = rest.split_once(": ").unwrap_or((rest, ""));
            let name = rest.rsplit_once(" (").map_or(rest, |(n, _)| n);
            verdicts.push((name.into(), verdict.into(), Vec::new()));
        } else if let Some(check) = line.strip_prefix("    [") {
            let (mark, rest) = check.split_once("] ").unwrap_or(("", check));
            let name = rest.split_once(": ").map_or(rest, |(n, _)| n);
            if let (false, Some(last)) = (phase(name), verdicts.last_mut()) {
                last.2.push((name.into(), format!("[{mark}]")));
            }
        }
    }
    verdicts
}

/// `name="N"`'s N on the first element of `xml` that has it.
fn attribute(xml: &str, name: &str) -> u64 {
    let key = format!(" {name}=\"");
    xml.split_once(&key)
        .and_then(|(_, rest)| rest.split_once('"'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {xml}"))
}

#[test]
fn xprin_and_xfn_test_give_the_same_verdict_for_every_test_and_assertion() {
    let xprin = peers::binary("xprin");
    let crossplane = peers::binary("crossplane");
    let core = peers::binary("crossplane-core");
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    // `crossplane render` with Crossplane's engine (no Docker), `crossplane
    // resource validate` offline: its built-in schemas' image stands
    // cached, empty (the Kubernetes kinds it knows are built in).
    let cache = suites.path("validate-cache");
    std::fs::create_dir_all(cache.join("xpkg.crossplane.io/crossplane/crossplane@stable")).unwrap();
    let repositories = std::fs::read_to_string(suites.path("xprin-config.yaml")).unwrap();
    let config = suites.path("xprin-peer.yaml");
    std::fs::write(
        &config,
        format!(
            "dependencies:\n  crossplane: {}\n{repositories}subcommands:\n  \
             render: render --include-full-xr --crossplane-binary {}\n  \
             validate: resource validate --error-on-missing-schemas --cache-dir {}\n",
            crossplane.display(),
            core.display(),
            cache.display()
        ),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        crossplane.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Of xprin's tests and assertions, how many xfn test gave alike.
    let (mut tests, mut assertions) = (0, 0);
    let (mut tests_alike, mut assertions_alike) = (0, 0);
    let mut differences = Vec::new();
    // The golden files as xfn test writes them; then xprin's `diff` reads
    // them byte for byte (its whole render and one resource's file).
    let update = suites
        .command(&config)
        .args(["--update", "golden_xprin.yaml"])
        .output()
        .unwrap();
    assert_eq!(update.status.code(), Some(0), "{}", text(&update));
    for suite in [
        "assertions_xprin.yaml",
        "chain_xprin.yaml",
        "failures_xprin.yaml",
        "golden_xprin.yaml",
        "compat_xprin.yaml",
    ] {
        // xfn test first: as root its hooks are uid 100000, which may not
        // overwrite what xprin's (root's) wrote.
        let junit = suites.path(&format!("{suite}.xml"));
        let ours = suites
            .command(&config)
            .args(["-v", "--junit"])
            .arg(&junit)
            .arg(suite)
            .output()
            .expect("spawn xfn");
        let peer = std::process::Command::new(&xprin)
            .arg("-c")
            .arg(&config)
            .args(["test", "-v", "--show-assertions", "--color", "off", suite])
            .env("PATH", &path)
            .current_dir(suites.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run xprin");
        let (peer_text, ours_text) = (text(&peer), text(&ours));
        let (want, got) = (xprin_verdicts(&peer_text), xfn_verdicts(&ours_text));
        assert!(
            !want.is_empty(),
            "xprin ran no test of {suite}:\n{peer_text}"
        );
        if peer.status.success() != ours.status.success() {
            differences.push(format!(
                "{suite}: xprin exited {}, xfn test {}",
                peer.status, ours.status
            ));
        }
        for (i, w) in want.iter().enumerate() {
            tests += 1;
            assertions += w.2.len();
            let g = got.get(i);
            let alike = |j: &usize| g.and_then(|g| g.2.get(*j)) == w.2.get(*j);
            assertions_alike += (0..w.2.len()).filter(alike).count();
            if g == Some(w) {
                tests_alike += 1;
            } else {
                differences.push(format!("{suite}: xprin {w:?}\n  xfn test {g:?}"));
            }
        }
        // The same counts in JUnit as xprin printed.
        let xml = std::fs::read_to_string(&junit).unwrap_or_default();
        let failed = want.iter().filter(|t| t.1 == "FAIL").count() as u64;
        let counts = |xml: &str| {
            (
                attribute(xml, "tests"),
                attribute(xml, "failures") + attribute(xml, "errors"),
            )
        };
        if !xml.contains(" tests=\"") || counts(&xml) != (want.len() as u64, failed) {
            differences.push(format!(
                "{suite}: JUnit counts differ from xprin's {} tests, {failed} failed: {xml}",
                want.len()
            ));
        }
    }
    eprintln!(
        "xprin and xfn test alike: {tests_alike} of {tests} tests, \
         {assertions_alike} of {assertions} assertions"
    );
    assert!(
        differences.is_empty(),
        "{} of {tests} tests differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
    assert!(
        tests >= 17 && assertions >= 38,
        "{tests} tests, {assertions} assertions"
    );
}
