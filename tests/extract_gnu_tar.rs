//! Layers written by GNU tar (its own header flavours: GNU long names,
//! PAX records, hardlinks as link entries) extract to the very tree they were
//! made from.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use xfn::image::extract::{extract_layer, WhiteoutMode};
use xfn_testkit::tree::{comparable, snapshot};

fn make_source(root: &std::path::Path) {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static must be installed");
    for applet in ["sh", "ls", "cat"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    std::fs::hard_link(bin.join("busybox"), bin.join("busybox.hard")).unwrap();
    let deep = root.join("usr/share/".to_string() + &"long-directory-name/".repeat(8));
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("f".repeat(150)), b"deep").unwrap();
    std::fs::write(root.join("suid"), b"s").unwrap();
    std::fs::set_permissions(root.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::create_dir(root.join("tmp")).unwrap();
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::create_dir(root.join("ro")).unwrap();
    std::fs::write(root.join("ro/file"), b"r").unwrap();
    std::fs::set_permissions(root.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    let status = Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(status.success());
    std::os::unix::fs::symlink("/etc/passwd", root.join("abs-link")).unwrap();
}

#[test]
fn gnu_tar_layers_extract_to_their_source_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_source(&src);
    for format in ["gnu", "posix"] {
        let tar = tmp.path().join(format!("layer-{format}.tar"));
        let status = Command::new("tar")
            .arg(format!("--format={format}"))
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&src)
            .arg(".")
            .status()
            .expect("GNU tar must be installed");
        assert!(status.success());
        for mode in [WhiteoutMode::Overlay, WhiteoutMode::Flatten] {
            let dest = tmp.path().join(format!("dest-{format}-{mode:?}"));
            std::fs::create_dir(&dest).unwrap();
            let file = std::fs::File::open(&tar).unwrap();
            extract_layer(std::io::BufReader::new(file), &dest, mode).unwrap();
            let got = snapshot(&dest);
            assert_eq!(
                comparable(&got),
                comparable(&snapshot(&src)),
                "{format} {mode:?}"
            );
            assert_eq!(got["bin/busybox"].ino, got["bin/busybox.hard"].ino);
            std::fs::set_permissions(dest.join("ro"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
    }
    std::fs::set_permissions(src.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
}
