//! A suite as an attacker writes it (a pull request's author, in a CI job
//! that may run as root): golden files out of the suite's tree, symlinks
//! committed to root-only files, a device as a golden file, hooks as host
//! root. Each test reproduces the attack and shows the refusal or bound.
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use xfn_testkit::*;

use super::{assert_has, development, text, RootOwnedSuite, Suites};

/// A directory of root's that only root may enter (0700), holding
/// `victim` with `root's`: what xfn as root must not write for a suite.
fn root_only(parent: &Path) -> std::path::PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test runs xfn as root against a root-only file: run it as root"
    );
    let dir = parent.join("root-only");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.join("victim"), "root's\n").unwrap();
    dir
}

/// A suite `escape/escape_xprin.yaml` of one test rendering tests/suite's
/// data, whose golden files are `goldens` (`expected: …` values).
fn escaping_suite(suites: &Suites, goldens: &[&str]) {
    let mut diff = String::new();
    for (n, expected) in goldens.iter().enumerate() {
        diff += &format!("    - {{name: golden {n}, expected: \"{expected}\"}}\n");
    }
    std::fs::create_dir_all(suites.path("escape")).unwrap();
    std::fs::write(
        suites.path("escape/escape_xprin.yaml"),
        format!(
            "common:\n  inputs: {{xr: ../data/xr.yaml, composition: ../data/composition.yaml, \
             functions: ../functions.yaml}}\ntests:\n- name: escapes\n  assertions:\n    diff:\n{diff}"
        ),
    )
    .unwrap();
}

#[test]
fn golden_files_out_of_the_suite_s_tree_are_refused_read_and_written() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    // Three targets outside the suite's directory: by `..`, by an absolute
    // path, and through a symlink committed in the suite's tree.
    std::fs::create_dir(suites.path("victims")).unwrap();
    for victim in ["outside.yaml", "absolute.yaml", "victims/render.yaml"] {
        std::fs::write(suites.path(victim), "victim: kept\n").unwrap();
    }
    std::fs::create_dir(suites.path("escape")).unwrap();
    std::os::unix::fs::symlink("../victims", suites.path("escape/golden")).unwrap();
    let absolute = suites.path("absolute.yaml");
    escaping_suite(
        &suites,
        &[
            "../outside.yaml",
            absolute.to_str().unwrap(),
            "golden/render.yaml",
        ],
    );
    let root = std::fs::canonicalize(suites.path("escape")).unwrap();
    for args in [&["--update"][..], &[]] {
        let out = suites.test(&[args, &["-v", "escape/escape_xprin.yaml"]].concat());
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{all}");
        assert_has(
            &all,
            &[
                &format!(
                    "[!] golden 0: golden file ../outside.yaml: it climbs out of {} (--root names a wider root)",
                    root.display()
                ),
                &format!(
                    "[!] golden 1: golden file {}: an absolute path: name it relative to the suite, beneath {}",
                    absolute.display(),
                    root.display()
                ),
                &format!(
                    "[!] golden 2: cannot write {}: {} is a symlink, and xfn follows none in a suite's files",
                    root.join("golden/render.yaml").display(),
                    root.join("golden").display()
                )
                .replace(
                    "cannot write",
                    if args.is_empty() {
                        "cannot read golden file"
                    } else {
                        "cannot write"
                    },
                ),
            ],
        );
        // Neither written nor read (a diff would print what they hold).
        assert!(!all.contains("victim: kept"), "{all}");
        for victim in ["outside.yaml", "absolute.yaml", "victims/render.yaml"] {
            assert_eq!(
                std::fs::read_to_string(suites.path(victim)).unwrap(),
                "victim: kept\n",
                "{victim} was written"
            );
        }
    }
    // `--root` above the suite lets its `..` reach a file beneath that
    // root; the absolute path and the symlink stay refused.
    let out = suites.test(&["--update", "--root", ".", "escape/escape_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let outside = std::fs::read_to_string(suites.path("outside.yaml")).unwrap();
    assert!(outside.contains("kind: XBucket"), "{outside}");
    assert_has(
        &all,
        &["[!] golden 1: golden file ", "[!] golden 2: cannot write "],
    );
    let out = suites.test(&["--root", "data", "escape/escape_xprin.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_has(
        &text(&out),
        &["escape/escape_xprin.yaml: not beneath --root "],
    );
}

#[test]
fn as_root_a_golden_file_or_report_committed_as_a_symlink_to_a_root_only_file_is_not_written() {
    // Through an Exec Function: xfn enters its namespace and opens what it
    // writes before, as root.
    let suite = RootOwnedSuite::new();
    let victims = root_only(suite.fx.dir.path());
    std::fs::write(victims.join("report"), "root's\n").unwrap();
    std::os::unix::fs::symlink(victims.join("victim"), suite.fx.path("xr-golden.yaml")).unwrap();
    std::os::unix::fs::symlink(victims.join("report"), suite.fx.path("report.xml")).unwrap();
    let out = suite.test(&["-v", "--update", "--junit", "report.xml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "[w] full render: written ",
            &format!(
                "[!] the XR: cannot write {0}: {0} is a symlink, and xfn follows none in a suite's files",
                suite.fx.path("xr-golden.yaml").display()
            ),
        ],
    );
    for victim in ["victim", "report"] {
        assert_eq!(
            std::fs::read_to_string(victims.join(victim)).unwrap(),
            "root's\n",
            "{victim} was written"
        );
    }
    // The report is made afresh where the symlink was.
    let report = suite.fx.path("report.xml");
    assert!(
        std::fs::symlink_metadata(&report).unwrap().is_file(),
        "report.xml is still a symlink"
    );
    let xml = std::fs::read_to_string(&report).unwrap();
    assert!(xml.contains("<testcase name=\"two buckets\""), "{xml}");
    // A --junit path through a committed symlinked directory is refused
    // before any test runs.
    std::os::unix::fs::symlink(&victims, suite.fx.path("reports")).unwrap();
    let out = suite.test(&["--junit", "reports/victim"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[&format!(
            "{} is a symlink, and xfn follows none",
            suite.fx.path("reports").display()
        )],
    );
    assert!(!all.contains("--- "), "tests ran: {all}");
    assert_eq!(
        std::fs::read_to_string(victims.join("victim")).unwrap(),
        "root's\n"
    );
}

#[test]
fn as_root_hooks_of_a_run_without_containers_run_as_the_mapped_uid_not_as_host_root() {
    // Development Functions only: no container runs here, yet a hook must
    // not be host root.
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    let victims = root_only(suites.dir.path());
    let victim = victims.join("victim");
    std::fs::write(
        suites.path("hooks_xprin.yaml"),
        format!(
            "common:\n  inputs: {{xr: data/xr.yaml, composition: data/composition.yaml, \
             functions: functions.yaml}}\ntests:\n- name: a hook appends to a root-only file\n  \
             hooks:\n    pre-test:\n    - {{name: append, run: \"echo hooked >> {}\"}}\n",
            victim.display()
        ),
    )
    .unwrap();
    let out = suites.test(&["-v", "hooks_xprin.yaml"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_has(
        &all,
        &[
            "[x] pre-test hook append: exit status: ",
            "Permission denied",
        ],
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's\n");
}

#[test]
fn a_golden_file_that_is_a_device_or_a_fifo_is_refused_unread_in_bounded_memory() {
    let server = FunctionServer::start(&[]);
    let suites = Suites::new(&development(&server));
    // `zero` is /dev/zero's device (1, 5); `fifo` has no writer.
    let zero = suites.path("zero");
    nix::sys::stat::mknod(
        &zero,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 5),
    )
    .expect("mknod (as root)");
    nix::unistd::mkfifo(&suites.path("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::fs::write(
        suites.path("device_xprin.yaml"),
        "common:\n  inputs: {xr: data/xr.yaml, composition: data/composition.yaml, \
         functions: functions.yaml}\ntests:\n- name: a device\n  assertions:\n    diff:\n\
         \x20   - {name: zero, expected: zero}\n    dyff:\n    - {name: fifo, expected: fifo}\n",
    )
    .unwrap();
    // The old read of /dev/zero grew without end (1 GiB in 0.65 s): an
    // address-space cap ends it at 4 GiB rather than the machine's memory.
    let xfn = xfn_binary();
    let mut command = std::process::Command::new("prlimit");
    command
        .arg(format!("--as={}", 4u64 << 30))
        .arg(&xfn)
        .args(["test", "-v", "--cache-dir"])
        .arg(suites.path("cache"))
        .arg("--config")
        .arg(suites.path("xprin-config.yaml"))
        .arg("device_xprin.yaml")
        .current_dir(suites.dir.path())
        .stdin(Stdio::null());
    let measured = child::measure(&mut command, &xfn);
    let all = format!("{}{}", measured.stdout, measured.stderr);
    eprintln!("a device as a golden file: {}", measured.cost());
    assert_eq!(measured.status.code(), Some(1), "{all}");
    let dir = std::fs::canonicalize(suites.dir.path()).unwrap();
    assert_has(
        &all,
        &[
            &format!(
                "[!] zero: cannot read golden file {0}/zero: {0}/zero is a character device, not a regular file",
                dir.display()
            ),
            &format!("[!] fifo: cannot read golden file {0}/fifo: {0}/fifo is a FIFO", dir.display()),
        ],
    );
    // What xfn needs anyway (a render over a Development function): the
    // golden files cost nothing of it.
    assert!(
        measured.peak_rss < 64 << 20,
        "peak memory {} MiB",
        measured.peak_rss >> 20
    );
}
