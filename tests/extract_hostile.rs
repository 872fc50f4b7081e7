//! Hostile layers: every attempt to write, link or delete outside the
//! destination is refused with an error naming the entry, and nothing outside
//! changes (checked against a sentinel directory beside the destination).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use xfn::image::extract::{
    extract_layer, extract_layer_with, ExtractError, ExtractOptions, WhiteoutMode,
};
use xfn_testkit::tree::{snapshot, Kind, Node};
use xfn_testkit::Layer;

const MODES: [WhiteoutMode; 2] = [WhiteoutMode::Overlay, WhiteoutMode::Flatten];

/// `tmp/outside/victim` (the sentinel) and an empty `tmp/root/dest`.
struct Sandbox {
    tmp: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("outside/dir")).unwrap();
        std::fs::write(tmp.path().join("outside/victim"), b"precious").unwrap();
        std::fs::write(tmp.path().join("outside/dir/victim2"), b"precious").unwrap();
        std::fs::create_dir_all(tmp.path().join("root/dest")).unwrap();
        Self { tmp }
    }
    fn dest(&self) -> PathBuf {
        self.tmp.path().join("root/dest")
    }
    fn outside(&self) -> String {
        self.tmp.path().join("outside").display().to_string()
    }
    /// Everything under the sandbox except the destination.
    fn around(&self) -> BTreeMap<String, Node> {
        snapshot(self.tmp.path())
            .into_iter()
            .filter(|(k, _)| k != "root/dest" && !k.starts_with("root/dest/"))
            .collect()
    }
}

/// Host paths a broken extractor could reach through `a -> /`.
const HOST_PROBE: &str = "etc/xfn-extract-hostile-probe";

fn assert_refused(
    res: Result<xfn::image::extract::ExtractStats, ExtractError>,
    entry: &str,
    case: &str,
) {
    match res {
        Err(e @ ExtractError::Unsafe { .. }) | Err(e @ ExtractError::Io { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{entry:?}")),
                "{case}: the error must name entry {entry:?}: {msg}"
            );
        }
        other => panic!("{case}: expected a refusal naming {entry:?}, got {other:?}"),
    }
}

fn assert_unsafe(
    res: Result<xfn::image::extract::ExtractStats, ExtractError>,
    entry: &str,
    case: &str,
) {
    match &res {
        // Names are quoted cut to a readable length.
        Err(ExtractError::Unsafe { entry: e, .. }) => {
            assert_eq!(*e, xfn::image::extract::quote(entry.as_bytes()), "{case}")
        }
        other => panic!("{case}: expected Unsafe for {entry:?}, got {other:?}"),
    }
}

/// Runs one hostile layer in both modes against a fresh sandbox each.
fn check(case: &str, build: impl Fn(&str) -> Vec<u8>, entry: &str, strictly_unsafe: bool) {
    for (mode, use_openat2) in MODES.iter().flat_map(|&m| [(m, true), (m, false)]) {
        let sb = Sandbox::new();
        let before = sb.around();
        let passwd_links = std::fs::metadata("/etc/passwd").unwrap().nlink();
        let layer = build(&sb.outside());
        let res = extract_layer_with(
            layer.as_slice(),
            &sb.dest(),
            mode,
            ExtractOptions {
                use_openat2,
                ..Default::default()
            },
        );
        let case = format!("{case} ({mode:?}, openat2: {use_openat2})");
        if strictly_unsafe {
            assert_unsafe(res, entry, &case);
        } else {
            assert_refused(res, entry, &case);
        }
        assert_eq!(
            sb.around(),
            before,
            "{case}: something outside dest changed"
        );
        assert!(
            !Path::new("/").join(HOST_PROBE).exists(),
            "{case}: wrote {HOST_PROBE} on the host"
        );
        assert_eq!(
            std::fs::metadata("/etc/passwd").unwrap().nlink(),
            passwd_links,
            "{case}: /etc/passwd was linked"
        );
    }
}

#[test]
fn dotdot_paths_are_refused() {
    check(
        "../x",
        |_| Layer::verbatim().file("../x", 0o644, b"evil").tar(),
        "../x",
        true,
    );
    check(
        "a/../../x",
        |_| {
            Layer::verbatim()
                .dir("a/", 0o755)
                .file("a/../../x", 0o644, b"evil")
                .tar()
        },
        "a/../../x",
        true,
    );
    check(
        "../../outside/victim",
        |_| {
            Layer::verbatim()
                .file("../../outside/victim", 0o644, b"evil")
                .tar()
        },
        "../../outside/victim",
        true,
    );
    check(
        "dir ../../outside/new",
        |_| Layer::verbatim().dir("../../outside/new/", 0o755).tar(),
        "../../outside/new/",
        true,
    );
}

#[test]
fn writing_through_a_symlink_of_the_same_layer_is_refused() {
    check(
        "a -> / then a/etc/x",
        |_| {
            Layer::verbatim()
                .symlink("a", "/")
                .file(&format!("a/{HOST_PROBE}"), 0o644, b"evil")
                .tar()
        },
        &format!("a/{HOST_PROBE}"),
        true,
    );
    check(
        "a -> ../.. then a/x",
        |_| {
            Layer::verbatim()
                .symlink("a", "../..")
                .file("a/x", 0o644, b"evil")
                .tar()
        },
        "a/x",
        true,
    );
    check(
        "a -> outside then a/victim",
        |o| {
            Layer::verbatim()
                .symlink("a", o)
                .file("a/victim", 0o644, b"evil")
                .tar()
        },
        "a/victim",
        true,
    );
    check(
        "a -> outside then dir a/new",
        |o| Layer::verbatim().symlink("a", o).dir("a/new/", 0o755).tar(),
        "a/new/",
        true,
    );
    check(
        "a -> outside then symlink a/l",
        |o| Layer::verbatim().symlink("a", o).symlink("a/l", "/").tar(),
        "a/l",
        true,
    );
    check(
        "a -> outside/dir then a/sub/x (deeper)",
        |o| {
            Layer::verbatim()
                .symlink("a", &format!("{o}/dir"))
                .file("a/sub/x", 0o644, b"evil")
                .tar()
        },
        "a/sub/x",
        true,
    );
}

#[test]
fn hostile_hardlinks_are_refused() {
    check(
        "hardlink to /etc/passwd",
        |_| Layer::verbatim().hardlink("passwd", "/etc/passwd").tar(),
        "passwd",
        false,
    );
    check(
        "hardlink to ../x",
        |_| Layer::verbatim().hardlink("x", "../x").tar(),
        "x",
        true,
    );
    check(
        "hardlink to ../../outside/victim",
        |_| {
            Layer::verbatim()
                .hardlink("v", "../../outside/victim")
                .tar()
        },
        "v",
        true,
    );
    check(
        "hardlink through a symlinked dir",
        |o| {
            Layer::verbatim()
                .symlink("d", o)
                .hardlink("v", "d/victim")
                .tar()
        },
        "v",
        true,
    );
    check(
        "hardlink through a symlink to /",
        |_| {
            Layer::verbatim()
                .symlink("r", "/")
                .hardlink("p", "r/etc/passwd")
                .tar()
        },
        "p",
        true,
    );
}

#[test]
fn hostile_whiteouts_are_refused() {
    check(
        "whiteout ../.wh.x",
        |_| Layer::verbatim().file("../.wh.x", 0o644, b"").tar(),
        "../.wh.x",
        true,
    );
    check(
        "whiteout ../../outside/.wh.victim",
        |_| {
            Layer::verbatim()
                .file("../../outside/.wh.victim", 0o644, b"")
                .tar()
        },
        "../../outside/.wh.victim",
        true,
    );
    check(
        "whiteout through a symlink of the same layer",
        |o| {
            Layer::verbatim()
                .symlink("a", o)
                .file("a/.wh.victim", 0o644, b"")
                .tar()
        },
        "a/.wh.victim",
        true,
    );
    check(
        "opaque through a symlink of the same layer",
        |o| {
            Layer::verbatim()
                .symlink("a", o)
                .file("a/.wh..wh..opq", 0o644, b"")
                .tar()
        },
        "a/.wh..wh..opq",
        true,
    );
    check(
        "whiteout of ..",
        |_| {
            Layer::verbatim()
                .dir("a/", 0o755)
                .file("a/.wh...", 0o644, b"")
                .tar()
        },
        "a/.wh...",
        true,
    );
}

/// In Flatten mode lower layers' symlinks are in the tree. Entries going
/// through them replace them by directories (as the overlay of the layer
/// dirs shows it); nothing outside is ever touched.
#[test]
fn lower_layer_symlinks_are_never_followed_in_flatten_mode() {
    let sb = Sandbox::new();
    let dest = sb.dest();
    let o = sb.outside();
    let lower = Layer::verbatim()
        .symlink("a", &o)
        .symlink("b", &o)
        .symlink("c", &o)
        .symlink("f", &format!("{o}/victim"))
        .symlink("lnk", &o)
        .tar();
    extract_layer(lower.as_slice(), &dest, WhiteoutMode::Flatten).unwrap();
    let before = sb.around();
    let upper = Layer::verbatim()
        .file("a/victim", 0o644, b"evil")
        .file("b/.wh.victim", 0o644, b"")
        .file("c/.wh..wh..opq", 0o644, b"")
        .file("f", 0o644, b"replaces the link")
        .tar();
    extract_layer(upper.as_slice(), &dest, WhiteoutMode::Flatten).unwrap();
    assert_eq!(sb.around(), before, "something outside dest changed");
    let t = snapshot(&dest);
    assert_eq!(t["a"].kind, Kind::Dir);
    assert_eq!(t["a/victim"].kind, Kind::File(b"evil".to_vec()));
    assert_eq!(t["b"].kind, Kind::Dir);
    assert_eq!(t["c"].kind, Kind::Dir);
    assert_eq!(t["f"].kind, Kind::File(b"replaces the link".to_vec()));
    // A hardlink through a lower symlink is refused, not followed.
    let link = Layer::verbatim().hardlink("h", "lnk/victim").tar();
    assert_unsafe(
        extract_layer(link.as_slice(), &dest, WhiteoutMode::Flatten),
        "h",
        "hardlink through a lower symlink",
    );
    assert_eq!(sb.around(), before, "something outside dest changed");
}

#[test]
fn entries_replace_symlinks_instead_of_writing_through_them() {
    for mode in MODES {
        let sb = Sandbox::new();
        let before = sb.around();
        let o = sb.outside();
        let layer = Layer::verbatim()
            .symlink("f", &format!("{o}/victim"))
            .file("f", 0o644, b"new")
            .symlink("d", &format!("{o}/dir"))
            .dir("d/", 0o755)
            .symlink("p", &format!("{o}/victim"))
            .fifo("p", 0o600)
            .tar();
        extract_layer(layer.as_slice(), &sb.dest(), mode).unwrap();
        assert_eq!(
            sb.around(),
            before,
            "{mode:?}: something outside dest changed"
        );
        let t = snapshot(&sb.dest());
        assert_eq!(t["f"].kind, Kind::File(b"new".to_vec()));
        assert_eq!(t["d"].kind, Kind::Dir);
        assert_eq!(t["p"].kind, Kind::Fifo);
    }
}

#[test]
fn a_hardlink_to_an_escaping_symlink_links_the_symlink_itself() {
    for mode in MODES {
        let sb = Sandbox::new();
        let passwd = std::fs::metadata("/etc/passwd").unwrap();
        let layer = Layer::verbatim()
            .symlink("s", "/etc/passwd")
            .hardlink("h", "s")
            .tar();
        extract_layer(layer.as_slice(), &sb.dest(), mode).unwrap();
        let t = snapshot(&sb.dest());
        assert_eq!(t["h"].kind, Kind::Symlink("/etc/passwd".into()), "{mode:?}");
        assert_eq!(t["h"].ino, t["s"].ino);
        assert_ne!(t["h"].ino, passwd.ino());
        assert_eq!(
            std::fs::metadata("/etc/passwd").unwrap().nlink(),
            passwd.nlink()
        );
    }
}

#[test]
fn malformed_tar_is_an_error_not_a_panic() {
    let sb = Sandbox::new();
    let mut layer = Layer::verbatim().file("a", 0o644, [7u8; 2000]).tar();
    layer.truncate(1000);
    let res = extract_layer(layer.as_slice(), &sb.dest(), WhiteoutMode::Flatten);
    assert!(res.is_err(), "a truncated tar must fail: {res:?}");
    let garbage = vec![0xffu8; 4096];
    let res = extract_layer(garbage.as_slice(), &sb.dest(), WhiteoutMode::Flatten);
    assert!(matches!(res, Err(ExtractError::Read { .. })), "{res:?}");
}

fn long_path_layer(path: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_mtime(1_600_000_000);
    h.set_size(1);
    b.append_data(&mut h, path, &b"x"[..]).unwrap();
    b.into_inner().unwrap()
}

#[test]
fn deep_and_long_paths_have_limits() {
    for mode in MODES {
        let sb = Sandbox::new();
        // 255 levels: far deeper than any image, still accepted.
        let deep = format!("{}f", "a/".repeat(255));
        extract_layer(long_path_layer(&deep).as_slice(), &sb.dest(), mode).unwrap();
        assert_eq!(snapshot(&sb.dest()).len(), 256, "{mode:?}");
        let too_deep = format!("{}f", "b/".repeat(256));
        assert_unsafe(
            extract_layer(long_path_layer(&too_deep).as_slice(), &sb.dest(), mode),
            &too_deep,
            "path deeper than the limit",
        );
        let too_long = format!("{}/f", "c".repeat(4100));
        assert_unsafe(
            extract_layer(long_path_layer(&too_long).as_slice(), &sb.dest(), mode),
            &too_long,
            "path over PATH_MAX",
        );
        // Whiteouts of deep trees (Flatten) remove them without recursing.
        let wh = Layer::verbatim().whiteout("a").tar();
        extract_layer(wh.as_slice(), &sb.dest(), mode).unwrap();
    }
}
