//! Layer extraction per the OCI layer spec, in both whiteout modes, and the
//! overlay of Overlay-mode layer dirs compared with the Flatten result.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use xfn::image::extract::{
    extract_layer, extract_layer_with, ExtractError, ExtractOptions, WhiteoutMode,
};
use xfn_testkit::tree::{comparable, snapshot, Kind, Node};
use xfn_testkit::Layer;

fn apply(layer: &[u8], dest: &Path, mode: WhiteoutMode) -> Result<(), ExtractError> {
    extract_layer(layer, dest, mode).map(|_| ())
}

/// Flattens `layers` (bottom first) into `dest`.
fn flatten(layers: &[Vec<u8>], dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    for l in layers {
        apply(l, dest, WhiteoutMode::Flatten).unwrap();
    }
}

/// Extracts each layer into its own dir under `base`, returns them bottom first.
fn overlay_dirs(layers: &[Vec<u8>], base: &Path) -> Vec<PathBuf> {
    layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let d = base.join(format!("layer{i}"));
            std::fs::create_dir_all(&d).unwrap();
            apply(l, &d, WhiteoutMode::Overlay).unwrap();
            d
        })
        .collect()
}

/// Fails the test unless it runs as root: it `does` what only root can.
fn require_root(does: &str) {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test {does}: run the tests as root"
    );
}

/// A tar header of `kind` and `mode` for an entry of `size` bytes.
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h
}

/// `layers` flattened (bottom first) into a fresh dir, and what it holds.
fn flattened(layers: &[&[u8]]) -> (tempfile::TempDir, BTreeMap<String, Node>) {
    let tmp = tempfile::tempdir().unwrap();
    for layer in layers {
        apply(layer, tmp.path(), WhiteoutMode::Flatten).unwrap();
    }
    let tree = snapshot(tmp.path());
    (tmp, tree)
}

fn content(root: &Path, rel: &str) -> Vec<u8> {
    std::fs::read(root.join(rel)).unwrap()
}

#[test]
fn files_dirs_links_fifos_modes_and_times() {
    let tmp = tempfile::tempdir().unwrap();
    let layer = Layer::verbatim()
        .mtime(1_500_000_000)
        .dir("bin/", 0o755)
        .file("bin/tool", 0o4755, b"#!/bin/sh\n")
        .dir("tmp/", 0o1777)
        .dir("ro/", 0o555)
        .file("ro/file", 0o444, b"read only")
        .symlink("bin/sh", "/bin/busybox")
        .symlink("rel", "bin/tool")
        .hardlink("bin/tool2", "bin/tool")
        .fifo("run.fifo", 0o620)
        .entry(tar::EntryType::Char, "dev-null", "", 0o666, b"")
        .mtime(1_400_000_000)
        .file("bin/later", 0o600, b"x")
        // Bits the usual umask (022) takes away must come back.
        .file("bin/shared", 0o666, b"w")
        .file("bin/all", 0o777, b"w")
        .tar();
    let dest = tmp.path().join("root");
    std::fs::create_dir(&dest).unwrap();
    let stats = extract_layer(layer.as_slice(), &dest, WhiteoutMode::Flatten).unwrap();
    assert_eq!(stats.skipped, 1, "the char device is skipped");
    assert_eq!(stats.bytes, 10 + 9 + 1 + 2);
    assert_eq!(snapshot(&dest)["bin/shared"].mode, 0o666);
    assert_eq!(snapshot(&dest)["bin/all"].mode, 0o777);
    let t = snapshot(&dest);
    assert!(!t.contains_key("dev-null"));
    assert_eq!(t["bin/tool"].mode, 0o4755);
    assert_eq!(t["bin/tool"].mtime, 1_500_000_000);
    assert_eq!(t["bin/later"].mtime, 1_400_000_000);
    assert_eq!(t["tmp"].mode, 0o1777);
    assert_eq!(t["ro"].mode, 0o555);
    assert_eq!(t["ro/file"].mode, 0o444);
    // Directory mtimes are set after their contents were written.
    assert_eq!(t["bin"].mtime, 1_500_000_000);
    assert_eq!(t["ro"].mtime, 1_500_000_000);
    assert_eq!(t["bin/sh"].kind, Kind::Symlink("/bin/busybox".into()));
    assert_eq!(t["rel"].kind, Kind::Symlink("bin/tool".into()));
    assert_eq!(
        t["bin/tool2"].ino, t["bin/tool"].ino,
        "a hardlink shares the inode"
    );
    assert_eq!(t["run.fifo"].kind, Kind::Fifo);
    assert_eq!(t["run.fifo"].mode, 0o620);
}

#[test]
fn ownership_is_kept_as_root() {
    // The unprivileged variant below checks that unmapped owners are
    // tolerated.
    require_root("checks ownership");
    let layer = Layer::verbatim()
        .owner(1234, 5678)
        .dir("home/", 0o755)
        .file("home/f", 0o2755, b"setgid")
        .symlink("home/l", "f")
        .tar();
    let (_tmp, t) = flattened(&[&layer]);
    for p in ["home", "home/f", "home/l"] {
        assert_eq!((t[p].uid, t[p].gid), (1234, 5678), "{p}");
    }
    // chown before chmod: the setgid bit survives.
    assert_eq!(t["home/f"].mode, 0o2755);

    // A file owned by us, in a setgid directory of a lower layer, still
    // gets the group its entry says (not the directory's).
    let lower = Layer::verbatim()
        .owner(0, 5678)
        .dir("shared/", 0o2775)
        .tar();
    let upper = Layer::verbatim()
        .owner(0, 0)
        .file("shared/f", 0o644, b"x")
        .tar();
    let (_tmp, t) = flattened(&[&lower, &upper]);
    assert_eq!(t["shared"].gid, 5678);
    assert_eq!(t["shared/f"].gid, 0);
    assert_eq!(t["shared"].mode, 0o2775);
}

/// Where xfn's namespace keeps its id 0 apart from its functions'
/// (`xfn::image::store::owners`), image ids are stored one up: root's
/// files are id 1's, and a directory owned by 0 in a later layer still
/// gets it.
#[test]
fn owners_are_shifted_by_the_namespaces_shift() {
    require_root("checks ownership");
    let tmp = tempfile::tempdir().unwrap();
    let layer = Layer::verbatim()
        .owner(0, 0)
        .dir("etc/", 0o755)
        .file("etc/passwd", 0o644, b"root")
        .owner(65532, 65532)
        .dir("home/", 0o700)
        .symlink("home/l", "x")
        .tar();
    let shifted = ExtractOptions {
        owner_shift: 1,
        ..Default::default()
    };
    extract_layer_with(layer.as_slice(), tmp.path(), WhiteoutMode::Flatten, shifted).unwrap();
    let t = snapshot(tmp.path());
    for (p, id) in [
        ("etc", 1),
        ("etc/passwd", 1),
        ("home", 65533),
        ("home/l", 65533),
    ] {
        assert_eq!((t[p].uid, t[p].gid), (id, id), "{p}");
    }
}

#[test]
fn unmapped_owners_are_tolerated_unprivileged() {
    if !xfn_testkit::reexec::in_unprivileged_child() {
        xfn_testkit::reexec::run_unprivileged(
            "extract_layers::unmapped_owners_are_tolerated_unprivileged",
        );
        return;
    }
    // In a user namespace mapping only our own id to 0: owner 1234 cannot
    // be set, extraction goes on and the file is ours.
    let tmp = tempfile::tempdir().unwrap();
    let layer = Layer::verbatim()
        .owner(1234, 5678)
        .dir("d/", 0o755)
        .file("d/f", 0o640, b"x")
        .owner(0, 0)
        .file("d/g", 0o600, b"y")
        .tar();
    apply(&layer, tmp.path(), WhiteoutMode::Overlay).unwrap();
    let md = std::fs::metadata(tmp.path().join("d/f")).unwrap();
    assert_eq!(md.uid(), 0);
    assert_eq!(md.permissions().mode() & 0o7777, 0o640);
    assert_eq!(content(tmp.path(), "d/g"), b"y");
}

/// Whiteout cases; each as (lower layers, top layer, expected files).
/// A named case: layers bottom first, and paths with their expected content
/// (None: must not exist).
type Case = (
    &'static str,
    Vec<Vec<u8>>,
    Vec<(&'static str, Option<&'static [u8]>)>,
);

fn whiteout_cases() -> Vec<Case> {
    let base = Layer::verbatim()
        .dir("a/", 0o755)
        .file("a/x", 0o644, b"old")
        .file("a/y", 0o644, b"keep")
        .dir("d/", 0o755)
        .file("d/old1", 0o644, b"1")
        .dir("d/sub/", 0o755)
        .file("d/sub/old2", 0o644, b"2")
        .dir("gone/", 0o755)
        .file("gone/f", 0o644, b"f")
        .tar();
    vec![
        (
            "whiteout deletes a lower file",
            vec![
                base.clone(),
                Layer::verbatim().dir("a/", 0o755).whiteout("a/x").tar(),
            ],
            vec![("a/x", None), ("a/y", Some(b"keep"))],
        ),
        (
            "whiteout before the file it hides in the same layer",
            vec![
                base.clone(),
                Layer::verbatim()
                    .dir("a/", 0o755)
                    .whiteout("a/x")
                    .file("a/x", 0o644, b"new")
                    .tar(),
            ],
            vec![("a/x", Some(b"new")), ("a/y", Some(b"keep"))],
        ),
        (
            "whiteout after the file it hides in the same layer",
            vec![
                base.clone(),
                Layer::verbatim()
                    .dir("a/", 0o755)
                    .file("a/x", 0o644, b"new")
                    .whiteout("a/x")
                    .tar(),
            ],
            vec![("a/x", Some(b"new")), ("a/y", Some(b"keep"))],
        ),
        (
            "whiteout of a lower directory",
            vec![base.clone(), Layer::verbatim().whiteout("gone").tar()],
            vec![("gone", None), ("gone/f", None)],
        ),
        (
            "whiteout of a directory re-created after it in the same layer",
            vec![
                base.clone(),
                Layer::verbatim()
                    .whiteout("gone")
                    .dir("gone/", 0o755)
                    .file("gone/g", 0o644, b"g")
                    .tar(),
            ],
            vec![("gone/f", None), ("gone/g", Some(b"g"))],
        ),
        (
            "whiteout of a directory re-created before it in the same layer",
            vec![
                base.clone(),
                Layer::verbatim()
                    .dir("gone/", 0o755)
                    .file("gone/g", 0o644, b"g")
                    .whiteout("gone")
                    .tar(),
            ],
            vec![("gone/f", None), ("gone/g", Some(b"g"))],
        ),
        opaque_case("opaque marker before the new content", &base, true),
        opaque_case("opaque marker after the new content", &base, false),
        (
            "directory replaced by a file",
            vec![
                base.clone(),
                Layer::verbatim().file("d", 0o600, b"now a file").tar(),
            ],
            vec![("d", Some(b"now a file")), ("d/old1", None)],
        ),
        (
            "file replaced by a directory",
            vec![
                base.clone(),
                Layer::verbatim()
                    .dir("a/", 0o755)
                    .dir("a/x/", 0o700)
                    .file("a/x/inner", 0o644, b"i")
                    .tar(),
            ],
            vec![("a/x/inner", Some(b"i")), ("a/y", Some(b"keep"))],
        ),
        (
            "file replaced by a symlink",
            vec![
                base.clone(),
                Layer::verbatim().dir("a/", 0o755).symlink("a/x", "y").tar(),
            ],
            // Read through the link: a/x now shows a/y's content.
            vec![("a/x", Some(b"keep"))],
        ),
        (
            "three layers stacked",
            vec![
                base.clone(),
                Layer::verbatim()
                    .dir("a/", 0o755)
                    .file("a/x", 0o644, b"v2")
                    .tar(),
                Layer::verbatim()
                    .dir("a/", 0o755)
                    .file("a/x", 0o644, b"v3")
                    .whiteout("a/y")
                    .tar(),
            ],
            vec![("a/x", Some(b"v3")), ("a/y", None)],
        ),
    ]
}

/// A directory made opaque by a layer that also fills it anew, the
/// marker `first` or last among its entries.
fn opaque_case(name: &'static str, base: &[u8], first: bool) -> Case {
    let mut upper = Layer::verbatim().dir("d/", 0o755);
    if first {
        upper = upper.opaque("d");
    }
    upper = upper
        .file("d/new", 0o644, b"n")
        .dir("d/sub/", 0o755)
        .file("d/sub/new2", 0o644, b"n2");
    if !first {
        upper = upper.opaque("d");
    }
    (
        name,
        vec![base.to_vec(), upper.tar()],
        vec![
            ("d/old1", None),
            ("d/sub/old2", None),
            ("d/new", Some(b"n")),
            ("d/sub/new2", Some(b"n2")),
        ],
    )
}

#[test]
fn whiteout_cases_flatten() {
    for ((name, layers, expect), use_openat2) in whiteout_cases()
        .into_iter()
        .flat_map(|c| [(c.clone(), true), (c, false)])
    {
        let tmp = tempfile::tempdir().unwrap();
        for l in &layers {
            extract_layer_with(
                l.as_slice(),
                tmp.path(),
                WhiteoutMode::Flatten,
                ExtractOptions {
                    use_openat2,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        for (path, want) in expect {
            let p = tmp.path().join(path);
            match want {
                Some(data) => assert_eq!(
                    std::fs::read(&p).unwrap_or_else(|e| panic!("{name}: {path}: {e}")),
                    data,
                    "{name}: {path}"
                ),
                None => assert!(
                    std::fs::symlink_metadata(&p).is_err(),
                    "{name}: {path} must be gone"
                ),
            }
        }
        // No whiteout marker survives flattening.
        for k in snapshot(tmp.path()).keys() {
            assert!(!k.contains(".wh."), "{name}: {k}");
        }
    }
}

#[test]
fn overlay_mode_makes_overlay_whiteouts() {
    let tmp = tempfile::tempdir().unwrap();
    let layer = Layer::verbatim()
        .dir("a/", 0o755)
        .whiteout("a/x")
        .dir("d/", 0o755)
        .opaque("d")
        .file("d/new", 0o644, b"n")
        .tar();
    apply(&layer, tmp.path(), WhiteoutMode::Overlay).unwrap();
    let t = snapshot(tmp.path());
    assert_eq!(
        t["a/x"].kind,
        Kind::CharDev(0),
        "whiteout is a 0:0 char device"
    );
    let opaque = xattr_of(&tmp.path().join("d"), "user.overlay.opaque");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert_eq!(xattr_of(&tmp.path().join("a"), "user.overlay.opaque"), None);
}

fn xattr_of(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 64];
    match rustix::fs::lgetxattr(path, name, &mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

#[test]
fn overlay_xattrs_from_the_layer_are_not_applied() {
    // A layer must not forge overlay metadata through PAX xattrs.
    let tmp = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    b.append_pax_extensions([
        ("SCHILY.xattr.user.overlay.opaque", &b"y"[..]),
        ("SCHILY.xattr.user.note", &b"hello"[..]),
    ])
    .unwrap();
    b.append_data(&mut h, "d/", &b""[..]).unwrap();
    let layer = b.into_inner().unwrap();
    apply(&layer, tmp.path(), WhiteoutMode::Overlay).unwrap();
    assert_eq!(xattr_of(&tmp.path().join("d"), "user.overlay.opaque"), None);
    assert_eq!(
        xattr_of(&tmp.path().join("d"), "user.note").as_deref(),
        Some(&b"hello"[..])
    );
}

#[test]
fn flatten_of_n_layers_equals_expected_tree() {
    let layers = vec![
        Layer::verbatim()
            .dir("etc/", 0o755)
            .file("etc/os", 0o644, b"base")
            .dir("usr/", 0o755)
            .dir("usr/lib/", 0o755)
            .file("usr/lib/a.so", 0o755, b"a")
            .symlink("lib", "usr/lib")
            .tar(),
        Layer::verbatim()
            .dir("etc/", 0o755)
            .file("etc/app.conf", 0o600, b"conf")
            .dir("usr/", 0o755)
            .dir("usr/lib/", 0o755)
            .whiteout("usr/lib/a.so")
            .file("usr/lib/b.so", 0o755, b"b")
            .tar(),
        Layer::verbatim()
            .mtime(1_700_000_000)
            .dir("etc/", 0o750)
            .whiteout("etc/os")
            .dir("app/", 0o755)
            .file("app/run", 0o755, b"run")
            .hardlink("app/run2", "app/run")
            .tar(),
    ];
    let tmp = tempfile::tempdir().unwrap();
    flatten(&layers, tmp.path());
    let t = snapshot(tmp.path());
    let got: Vec<(&str, Kind, u32)> = t
        .iter()
        .map(|(k, v)| (k.as_str(), v.kind.clone(), v.mode))
        .collect();
    let want: Vec<(&str, Kind, u32)> = vec![
        ("app", Kind::Dir, 0o755),
        ("app/run", Kind::File(b"run".to_vec()), 0o755),
        ("app/run2", Kind::File(b"run".to_vec()), 0o755),
        ("etc", Kind::Dir, 0o750),
        ("etc/app.conf", Kind::File(b"conf".to_vec()), 0o600),
        ("lib", Kind::Symlink("usr/lib".into()), 0),
        ("usr", Kind::Dir, 0o755),
        ("usr/lib", Kind::Dir, 0o755),
        ("usr/lib/b.so", Kind::File(b"b".to_vec()), 0o755),
    ];
    assert_eq!(got, want);
    assert_eq!(t["etc"].mtime, 1_700_000_000);
}

/// Mounts an overlay of `lowers` (bottom first) at `target` with upper and
/// work dirs on a tmpfs at `scratch`, as the rootfs does.
fn mount_overlay(lowers: &[PathBuf], scratch: &Path, target: &Path) {
    use rustix::mount::{mount, MountFlags};
    std::fs::create_dir_all(scratch).unwrap();
    std::fs::create_dir_all(target).unwrap();
    mount("tmpfs", scratch, "tmpfs", MountFlags::empty(), None).unwrap();
    std::fs::create_dir(scratch.join("u")).unwrap();
    std::fs::create_dir(scratch.join("w")).unwrap();
    let lower: Vec<String> = lowers
        .iter()
        .rev()
        .map(|p| p.display().to_string())
        .collect();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.join(":"),
        scratch.join("u").display(),
        scratch.join("w").display()
    );
    let opts = std::ffi::CString::new(opts).unwrap();
    mount(
        "overlay",
        target,
        "overlay",
        MountFlags::empty(),
        Some(opts.as_c_str()),
    )
    .unwrap();
}

fn unmount(path: &Path) {
    rustix::mount::unmount(path, rustix::mount::UnmountFlags::empty()).unwrap();
}

/// Every whiteout case and a mixed stack: the overlay of the Overlay-mode
/// layer dirs shows exactly the Flatten tree (types, contents, modes,
/// owners, mtimes).
fn overlay_equals_flatten() {
    let mut cases = whiteout_cases();
    cases.push((
        "lower symlink replaced by a directory on the way",
        vec![
            Layer::verbatim()
                .symlink("a", "/")
                .dir("b/", 0o755)
                .file("b/f", 0o644, b"f")
                .tar(),
            // The directories' own entries come after the files that go
            // through them (so those meet the lower non-directories first),
            // and give them definite mtimes.
            Layer::verbatim()
                .file("a/etc/x", 0o644, b"x")
                .entry(tar::EntryType::Regular, "b/f/g", "", 0o644, b"g")
                .dir("a/", 0o755)
                .dir("a/etc/", 0o755)
                .dir("b/", 0o755)
                .dir("b/f/", 0o755)
                .tar(),
        ],
        vec![],
    ));
    for (name, layers, _) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let flat = tmp.path().join("flat");
        flatten(&layers, &flat);
        let dirs = overlay_dirs(&layers, &tmp.path().join("layers"));
        let merged = tmp.path().join("merged");
        mount_overlay(&dirs, &tmp.path().join("scratch"), &merged);
        let seen = comparable(&snapshot(&merged));
        unmount(&merged);
        unmount(&tmp.path().join("scratch"));
        assert_eq!(seen, comparable(&snapshot(&flat)), "{name}");
    }
}

#[test]
fn overlay_equals_flatten_as_root() {
    if xfn_testkit::reexec::in_mount_namespace_child() {
        return overlay_equals_flatten();
    }
    require_root("mounts overlays as real root");
    xfn_testkit::reexec::run_in_mount_namespace("extract_layers::overlay_equals_flatten_as_root");
}

#[test]
fn overlay_equals_flatten_unprivileged() {
    if xfn_testkit::reexec::in_unprivileged_child() {
        return overlay_equals_flatten();
    }
    xfn_testkit::reexec::run_unprivileged("extract_layers::overlay_equals_flatten_unprivileged");
}

#[test]
fn long_names_and_link_targets() {
    // The tar crate's builder writes GNU long-name / long-link records.
    let long_dir = "d".repeat(80);
    let long_file = format!("{long_dir}/{}", "f".repeat(120));
    let long_target = format!("/{}", "t".repeat(200));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(tar::EntryType::Regular, 0o644, 4);
    h.set_mtime(1_600_000_000);
    b.append_data(&mut h, &long_file, &b"long"[..]).unwrap();
    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
    b.append_link(&mut h, format!("{long_dir}/link"), &long_target)
        .unwrap();
    let mut h = header(tar::EntryType::Link, 0o644, 0);
    b.append_link(&mut h, "hard", &long_file).unwrap();
    let layer = b.into_inner().unwrap();
    for mode in [WhiteoutMode::Overlay, WhiteoutMode::Flatten] {
        let tmp = tempfile::tempdir().unwrap();
        apply(&layer, tmp.path(), mode).unwrap();
        let t = snapshot(tmp.path());
        assert_eq!(t[&long_file].kind, Kind::File(b"long".to_vec()));
        assert_eq!(
            t[&format!("{long_dir}/link")].kind,
            Kind::Symlink(long_target.clone())
        );
        assert_eq!(t["hard"].ino, t[&long_file].ino);
    }
}

#[test]
fn read_only_lower_dirs_without_privilege() {
    // No user namespace, no capabilities: deleting from a lower 0555 dir
    // needs it writable for a moment; its mode must come back.
    if !xfn_testkit::reexec::in_no_privilege_child() {
        return xfn_testkit::reexec::run_without_privilege(
            "extract_layers::read_only_lower_dirs_without_privilege",
        );
    }
    let lower = Layer::verbatim()
        .owner(65532, 65532)
        .dir("ro/", 0o555)
        .file("ro/f", 0o444, b"f")
        .file("ro/g", 0o444, b"g")
        .tar();
    let upper = Layer::verbatim()
        .whiteout("ro/f")
        .file("ro/g", 0o644, b"new")
        .tar();
    let (tmp, t) = flattened(&[&lower, &upper]);
    assert!(!t.contains_key("ro/f"));
    assert_eq!(t["ro/g"].kind, Kind::File(b"new".to_vec()));
    assert_eq!(t["ro"].mode, 0o555, "the lower dir's mode is kept");
    std::fs::set_permissions(tmp.path().join("ro"), PermissionsExt::from_mode(0o755)).unwrap();
}
