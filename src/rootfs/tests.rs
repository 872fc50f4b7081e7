//! Per-run rootfs: overlay and copy modes, isolation of runs from the cache
//! and from each other, cleanup on every path, many layers. Each test runs
//! twice: as real root in a private mount namespace, and as uid 65532 with no
//! capabilities in its own user + mount namespace (the rootless path). Unit
//! tests, as the module is private to the crate; the kit's re-runs select
//! them by [`test_name`].
use std::path::{Path, PathBuf};

use nix::sys::statfs::{statfs, FsType, OVERLAYFS_SUPER_MAGIC, TMPFS_MAGIC};

use super::{copy_tree, overlay_supported, ResolvedMode, Rootfs, RootfsMode, RootfsOptions};
use crate::image::extract::{extract_layer, WhiteoutMode};
use crate::support::reexec::{self, mounted_under};
use crate::support::tree::{comparable, snapshot, Kind};
use crate::support::Layer;

/// The name libtest knows the test `f` of this module by (its module path
/// without the crate's name), for a re-run to select it with `--exact`.
fn test_name(f: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    format!("{module}::{f}")
}

/// Defines `$root` (real root, private mount namespace) and `$unpriv`
/// (uid 65532, `unshare -r -m`) tests running `$body`.
macro_rules! in_both_namespaces {
    ($root:ident, $unpriv:ident, $body:ident) => {
        #[test]
        fn $root() {
            if reexec::in_mount_namespace_child() {
                return $body();
            }
            assert!(
                rustix::process::geteuid().is_root(),
                "this test mounts as real root: run the tests as root"
            );
            reexec::run_in_mount_namespace(&test_name(stringify!($root)));
        }

        #[test]
        fn $unpriv() {
            if reexec::in_unprivileged_child() {
                return $body();
            }
            reexec::run_unprivileged(&test_name(stringify!($unpriv)));
        }
    };
}

fn image_layers() -> Vec<Vec<u8>> {
    vec![
        Layer::verbatim()
            .dir("bin/", 0o755)
            .file("bin/app", 0o755, b"v1")
            .dir("etc/", 0o755)
            .file("etc/conf", 0o644, b"base")
            .file("etc/gone", 0o644, b"deleted above")
            .dir("data/", 0o755)
            .file("data/old", 0o644, b"old")
            .symlink("sh", "bin/app")
            .tar(),
        Layer::verbatim()
            .dir("bin/", 0o755)
            .file("bin/app", 0o755, b"v2")
            .hardlink("bin/app2", "bin/app")
            .dir("etc/", 0o755)
            .whiteout("etc/gone")
            .dir("data/", 0o700)
            .opaque("data")
            .file("data/new", 0o600, b"new")
            .fifo("pipe", 0o644)
            .tar(),
    ]
}

/// Extracts the layers each into its own dir (bottom first) and flattened.
fn cache(tmp: &Path, layers: &[Vec<u8>]) -> (Vec<PathBuf>, PathBuf) {
    let flat = tmp.join("flat");
    std::fs::create_dir(&flat).unwrap();
    let mut dirs = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let d = tmp.join(format!("layer{i}"));
        std::fs::create_dir(&d).unwrap();
        extract_layer(l.as_slice(), &d, WhiteoutMode::Overlay).unwrap();
        extract_layer(l.as_slice(), &flat, WhiteoutMode::Flatten).unwrap();
        dirs.push(d);
    }
    (dirs, flat)
}

/// Writes of every kind a function might do.
fn scribble(root: &Path) {
    std::fs::write(root.join("new-file"), b"run data").unwrap();
    std::fs::write(root.join("etc/conf"), b"changed").unwrap();
    std::fs::remove_file(root.join("bin/app")).unwrap();
    std::fs::remove_dir_all(root.join("data")).unwrap();
    std::fs::create_dir(root.join("data")).unwrap();
    std::fs::write(root.join("data/x"), b"x").unwrap();
    std::fs::set_permissions(
        root.join("bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
}

/// The type of the filesystem `path` is on.
fn filesystem_of(path: &Path) -> FsType {
    statfs(path).unwrap().filesystem_type()
}

fn assert_gone(rootfs_path: &Path, run_dir: &Path) {
    assert!(
        !mounted_under(run_dir),
        "a mount is left under {}",
        run_dir.display()
    );
    assert!(!run_dir.exists(), "{} is left", run_dir.display());
    assert!(!rootfs_path.exists());
}

fn isolation(mode: ResolvedMode) {
    let tmp = tempfile::tempdir().unwrap();
    let (layers, flat) = cache(tmp.path(), &image_layers());
    let cache_before: Vec<_> = layers.iter().chain([&flat]).map(|d| snapshot(d)).collect();
    let expected = comparable(&snapshot(&flat));

    let run1 = tmp.path().join("run1");
    let run2 = tmp.path().join("run2");
    let mut a = Rootfs::prepare(mode, &layers, Some(&flat), &run1).unwrap();
    let b = Rootfs::prepare(mode, &layers, Some(&flat), &run2).unwrap();
    assert_eq!(
        filesystem_of(a.path()),
        match mode {
            ResolvedMode::Overlay => OVERLAYFS_SUPER_MAGIC,
            ResolvedMode::Copy => TMPFS_MAGIC,
        },
        "{mode:?}: the rootfs is not on the filesystem of its mode"
    );
    assert_eq!(
        comparable(&snapshot(a.path())),
        expected,
        "{mode:?}: the run sees the image"
    );
    scribble(a.path());
    let seen = snapshot(a.path());
    assert_eq!(seen["new-file"].kind, Kind::File(b"run data".to_vec()));
    assert!(!seen.contains_key("bin/app"));
    // The other run, and the cache, see none of it.
    assert_eq!(
        comparable(&snapshot(b.path())),
        expected,
        "{mode:?}: runs are isolated"
    );
    let cache_now: Vec<_> = layers.iter().chain([&flat]).map(|d| snapshot(d)).collect();
    assert_eq!(
        cache_now, cache_before,
        "{mode:?}: a run wrote into the cache"
    );

    let path = a.path().to_path_buf();
    a.cleanup().unwrap();
    a.cleanup().unwrap();
    assert_gone(&path, &run1);
    drop(a);
    // Drop alone cleans up too.
    let path = b.path().to_path_buf();
    drop(b);
    assert_gone(&path, &run2);

    // A later run starts from the image again.
    let c = Rootfs::prepare(mode, &layers, Some(&flat), &tmp.path().join("run3")).unwrap();
    assert_eq!(comparable(&snapshot(c.path())), expected);
}

fn overlay_isolation() {
    isolation(ResolvedMode::Overlay);
}

fn copy_isolation() {
    isolation(ResolvedMode::Copy);
    // Hardlinks stay hardlinks in the copy.
    let tmp = tempfile::tempdir().unwrap();
    let (_, flat) = cache(tmp.path(), &image_layers());
    let r = Rootfs::prepare(
        ResolvedMode::Copy,
        &[],
        Some(&flat),
        &tmp.path().join("run"),
    )
    .unwrap();
    let t = snapshot(r.path());
    assert_eq!(t["bin/app"].ino, t["bin/app2"].ino);
    assert_eq!(t["pipe"].kind, Kind::Fifo);
}

in_both_namespaces!(
    overlay_runs_are_isolated_as_root,
    overlay_runs_are_isolated_unprivileged,
    overlay_isolation
);
in_both_namespaces!(
    copy_runs_are_isolated_as_root,
    copy_runs_are_isolated_unprivileged,
    copy_isolation
);

fn probe() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(overlay_supported(tmp.path()), "overlay probe failed here");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "the probe left files"
    );
    assert!(!mounted_under(tmp.path()));
    assert_eq!(
        RootfsMode::Auto.resolve(true).unwrap(),
        ResolvedMode::Overlay
    );
}

in_both_namespaces!(
    overlay_probe_passes_as_root,
    overlay_probe_passes_unprivileged,
    probe
);

#[test]
fn overlay_probe_fails_without_a_mount_namespace_privilege() {
    // Outside any namespace, unprivileged: no mount is possible, Auto falls
    // back to copy and Overlay is refused.
    if !reexec::in_no_privilege_child() {
        return reexec::run_without_privilege(&test_name(
            "overlay_probe_fails_without_a_mount_namespace_privilege",
        ));
    }
    let tmp = tempfile::tempdir().unwrap();
    assert!(!overlay_supported(tmp.path()));
    assert!(!mounted_under(tmp.path()));
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "the probe left files"
    );
    assert_eq!(RootfsMode::Auto.resolve(false).unwrap(), ResolvedMode::Copy);
    assert!(RootfsMode::Overlay.resolve(false).is_err());
}

#[test]
fn copy_mode_without_mount_privilege_is_refused_naming_the_tmpfs_and_leaves_nothing() {
    // The copy goes to a sized tmpfs (so a run's writes are bounded), which
    // needs the mount privilege xfn has in its namespace. Without it, copy
    // mode fails up front, naming the mount, instead of writing to disk
    // unbounded; and it leaves no run dir behind.
    if !reexec::in_no_privilege_child() {
        return reexec::run_without_privilege(&test_name(
            "copy_mode_without_mount_privilege_is_refused_naming_the_tmpfs_and_leaves_nothing",
        ));
    }
    let tmp = tempfile::tempdir().unwrap();
    let flat = tmp.path().join("flat");
    std::fs::create_dir(&flat).unwrap();
    let layer = Layer::verbatim().file("f", 0o444, b"f").tar();
    extract_layer(layer.as_slice(), &flat, WhiteoutMode::Flatten).unwrap();
    let run = tmp.path().join("run");
    let err = Rootfs::prepare(ResolvedMode::Copy, &[], Some(&flat), &run)
        .expect_err("copy mode mounted a tmpfs without mount privilege");
    let msg = crate::chain::one_line(&err);
    assert!(
        msg.contains("tmpfs"),
        "the error does not name the tmpfs: {msg}"
    );
    assert!(!run.exists(), "the failed prepare left {}", run.display());
    assert!(!mounted_under(tmp.path()));
}

/// `n` layers in dirs with long names (so their paths alone overflow the
/// one-page mount option limit), each adding `fN` and overriding `common`.
fn many_layers(n: usize, legacy: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("layers/sha256");
    std::fs::create_dir_all(&store).unwrap();
    let mut dirs = Vec::new();
    for i in 0..n {
        let d = store.join(format!("{i:064x}"));
        std::fs::create_dir(&d).unwrap();
        let layer = Layer::verbatim()
            .file(&format!("f{i}"), 0o644, format!("{i}").as_bytes())
            .file("common", 0o644, format!("top is {i}").as_bytes())
            .tar();
        extract_layer(layer.as_slice(), &d, WhiteoutMode::Overlay).unwrap();
        dirs.push(d);
    }
    let total: usize = dirs.iter().map(|d| d.as_os_str().len() + 1).sum();
    assert!(
        total > 4096,
        "the test must overflow one page ({total} bytes)"
    );
    let run = tmp.path().join("run");
    let options = RootfsOptions {
        legacy_mount: legacy,
        ..RootfsOptions::default()
    };
    let mut r = Rootfs::prepare_with(ResolvedMode::Overlay, &dirs, None, &run, &options).unwrap();
    let t = snapshot(r.path());
    assert_eq!(t.len(), n + 1);
    assert_eq!(
        t["common"].kind,
        Kind::File(format!("top is {}", n - 1).into_bytes())
    );
    assert_eq!(t["f0"].kind, Kind::File(b"0".to_vec()));
    let path = r.path().to_path_buf();
    r.cleanup().unwrap();
    assert_gone(&path, &run);
}

fn many_layers_new_api() {
    many_layers(256, false);
}

fn many_layers_legacy_mount() {
    many_layers(256, true);
}

in_both_namespaces!(
    many_layers_mount_as_root,
    many_layers_mount_unprivileged,
    many_layers_new_api
);
in_both_namespaces!(
    many_layers_legacy_mount_as_root,
    many_layers_legacy_mount_unprivileged,
    many_layers_legacy_mount
);

fn failed_prepare_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let missing = vec![tmp.path().join("no-such-layer")];
    let err = Rootfs::prepare(ResolvedMode::Overlay, &missing, None, &run).unwrap_err();
    // The error (as a person reads it: its chain) names the missing layer.
    let text = crate::chain::one_line(&err);
    assert!(text.contains("no-such-layer"), "{text}");
    assert_gone(&run.join("rootfs"), &run);
    let err = Rootfs::prepare(ResolvedMode::Copy, &[], None, &run).unwrap_err();
    let text = crate::chain::one_line(&err);
    assert!(text.contains("flattened"), "{text}");
    assert_gone(&run.join("rootfs"), &run);
    // A run dir left by a killed process (mounts and all) is swept.
    let (layers, _) = cache(tmp.path(), &image_layers());
    let r = Rootfs::prepare(ResolvedMode::Overlay, &layers, None, &run).unwrap();
    std::mem::forget(r);
    assert!(mounted_under(&run));
    Rootfs::cleanup_stale(&run).unwrap();
    assert_gone(&run.join("rootfs"), &run);
}

in_both_namespaces!(
    failed_prepare_cleans_up_as_root,
    failed_prepare_cleans_up_unprivileged,
    failed_prepare_cleans_up
);

fn busy_mount_is_detached() {
    let tmp = tempfile::tempdir().unwrap();
    let (layers, _) = cache(tmp.path(), &image_layers());
    let run = tmp.path().join("run");
    let mut r = Rootfs::prepare(ResolvedMode::Overlay, &layers, None, &run).unwrap();
    // An open file keeps the overlay busy: cleanup detaches it anyway.
    let held = std::fs::File::open(r.path().join("etc/conf")).unwrap();
    let path = r.path().to_path_buf();
    r.cleanup().unwrap();
    assert_gone(&path, &run);
    drop(held);
}

in_both_namespaces!(
    busy_mount_is_detached_as_root,
    busy_mount_is_detached_unprivileged,
    busy_mount_is_detached
);

/// Layer dirs whose paths hold the characters mount(2)'s option parser
/// splits on (`:` and `,`) still mount, with either mount API.
fn odd_layer_paths() {
    for legacy in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let mut dirs = Vec::new();
        for (i, name) in ["low:er,0", "up,per:1"].iter().enumerate() {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).unwrap();
            let layer = Layer::verbatim()
                .file(&format!("f{i}"), 0o644, b"x")
                .file("top", 0o644, name.as_bytes())
                .tar();
            extract_layer(layer.as_slice(), &d, WhiteoutMode::Overlay).unwrap();
            dirs.push(d);
        }
        let run = tmp.path().join("run");
        let options = RootfsOptions {
            legacy_mount: legacy,
            ..RootfsOptions::default()
        };
        let r = Rootfs::prepare_with(ResolvedMode::Overlay, &dirs, None, &run, &options).unwrap();
        let t = snapshot(r.path());
        assert_eq!(
            t["top"].kind,
            Kind::File(b"up,per:1".to_vec()),
            "legacy: {legacy}"
        );
        assert!(t.contains_key("f0") && t.contains_key("f1"));
        drop(r);
        assert!(!mounted_under(&run));
    }
}

in_both_namespaces!(
    odd_layer_paths_mount_as_root,
    odd_layer_paths_mount_unprivileged,
    odd_layer_paths
);

fn existing_run_dir_is_refused() {
    // prepare never adopts (and so never removes) a directory it did not make.
    let tmp = tempfile::tempdir().unwrap();
    let (layers, flat) = cache(tmp.path(), &image_layers());
    let run = tmp.path().join("taken");
    std::fs::create_dir(&run).unwrap();
    std::fs::write(run.join("keep"), b"k").unwrap();
    for mode in [ResolvedMode::Overlay, ResolvedMode::Copy] {
        assert!(Rootfs::prepare(mode, &layers, Some(&flat), &run).is_err());
        assert_eq!(std::fs::read(run.join("keep")).unwrap(), b"k");
        assert!(!mounted_under(&run));
    }
    // Missing parents are made.
    let nested = tmp.path().join("runs/a/b");
    let r = Rootfs::prepare(ResolvedMode::Overlay, &layers, None, &nested).unwrap();
    assert!(r.path().join("bin/app").exists());
}

in_both_namespaces!(
    existing_run_dir_is_refused_as_root,
    existing_run_dir_is_refused_unprivileged,
    existing_run_dir_is_refused
);

/// A function may leave a tree deeper than any stack or fd limit in its
/// copy-mode rootfs: cleanup removes it all the same.
fn deep_tree_written_by_a_run_is_removed() {
    use rustix::fs::{mkdirat, openat, Mode, OFlags};
    let tmp = tempfile::tempdir().unwrap();
    let (_, flat) = cache(tmp.path(), &image_layers());
    let run = tmp.path().join("run");
    let mut r = Rootfs::prepare(ResolvedMode::Copy, &[], Some(&flat), &run).unwrap();
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(r.path(), flags, Mode::empty()).unwrap();
    for i in 0..3000 {
        mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        if i % 100 == 0 {
            std::fs::write(
                format!("/proc/self/fd/{}/f", std::os::fd::AsRawFd::as_raw_fd(&dir)),
                b"x",
            )
            .unwrap();
        }
        dir = openat(&dir, "d", flags, Mode::empty()).unwrap();
    }
    // A read-only level on the way, too.
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o555)).unwrap();
    drop(dir);
    let path = r.path().to_path_buf();
    r.cleanup().unwrap();
    assert_gone(&path, &run);
}

in_both_namespaces!(
    deep_tree_written_by_a_run_is_removed_as_root,
    deep_tree_written_by_a_run_is_removed_unprivileged,
    deep_tree_written_by_a_run_is_removed
);

#[test]
fn copy_into_its_own_source_ends() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("d/f"), b"x").unwrap();
    let stats = copy_tree(tmp.path(), &tmp.path().join("copy")).unwrap();
    assert_eq!(stats.entries, 2);
    assert!(!tmp.path().join("copy/copy").exists());
    assert_eq!(std::fs::read(tmp.path().join("copy/d/f")).unwrap(), b"x");
}
