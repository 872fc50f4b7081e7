//! Test support for layer extraction and rootfs tests: builds layer tars
//! byte by byte (so hostile entries the `tar` crate's builder refuses can be
//! made too), snapshots directory trees for comparison, and re-runs a test
//! inside an unprivileged user + mount namespace.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

/// A layer tar under construction.
#[derive(Default)]
pub struct Layer {
    bytes: Vec<u8>,
    mtime: u64,
    uid: u64,
    gid: u64,
}

impl Layer {
    /// An empty layer; entries get mtime 1_600_000_000 unless set.
    pub fn new() -> Self {
        Self {
            bytes: Vec::new(),
            mtime: 1_600_000_000,
            uid: 0,
            gid: 0,
        }
    }

    /// Sets the mtime of the entries added after this.
    pub fn mtime(mut self, mtime: u64) -> Self {
        self.mtime = mtime;
        self
    }

    /// Sets the owner of the entries added after this.
    pub fn owner(mut self, uid: u64, gid: u64) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Appends a raw entry: the name and link name go into the header as
    /// given, unchecked.
    pub fn raw(
        mut self,
        kind: tar::EntryType,
        path: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) -> Self {
        assert!(
            path.len() < 100 && link.len() < 100,
            "test names must be short"
        );
        let mut header = tar::Header::new_ustar();
        {
            let ustar = header.as_ustar_mut().expect("ustar header");
            ustar.name[..path.len()].copy_from_slice(path.as_bytes());
            ustar.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(self.uid);
        header.set_gid(self.gid);
        header.set_mtime(self.mtime);
        header.set_size(data.len() as u64);
        header.set_cksum();
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.bytes.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    /// A directory.
    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.raw(tar::EntryType::Directory, path, "", mode, b"")
    }

    /// A regular file.
    pub fn file(self, path: &str, mode: u32, data: &[u8]) -> Self {
        self.raw(tar::EntryType::Regular, path, "", mode, data)
    }

    /// A symlink.
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.raw(tar::EntryType::Symlink, path, target, 0o777, b"")
    }

    /// A hardlink to an earlier entry.
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.raw(tar::EntryType::Link, path, target, 0o644, b"")
    }

    /// A FIFO.
    pub fn fifo(self, path: &str, mode: u32) -> Self {
        self.raw(tar::EntryType::Fifo, path, "", mode, b"")
    }

    /// A whiteout hiding `path` (`dir/.wh.name`).
    pub fn whiteout(self, path: &str) -> Self {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (format!("{d}/"), n),
            None => (String::new(), path),
        };
        self.file(&format!("{dir}.wh.{name}"), 0o644, b"")
    }

    /// An opaque marker for `dir`.
    pub fn opaque(self, dir: &str) -> Self {
        self.file(&format!("{dir}/.wh..wh..opq"), 0o644, b"")
    }

    /// The finished tar.
    pub fn build(mut self) -> Vec<u8> {
        self.bytes.extend(std::iter::repeat_n(0u8, 1024));
        self.bytes
    }
}

/// One node of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file and its content.
    File(Vec<u8>),
    /// A symlink and its target.
    Symlink(String),
    /// A FIFO.
    Fifo,
    /// A character device (major, minor).
    CharDev(u64),
}

/// A node's type and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// What it is.
    pub kind: Kind,
    /// Permission bits incl. setuid/setgid/sticky (0 for symlinks).
    pub mode: u32,
    /// Modification time, seconds.
    pub mtime: i64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Inode number (to check hardlinks within one tree; not compared).
    pub ino: u64,
}

/// The tree under `root`, by relative path (the root itself excluded).
pub fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let md = std::fs::symlink_metadata(&path).unwrap();
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink(std::fs::read_link(&path).unwrap().display().to_string())
        } else if ft.is_file() {
            Kind::File(std::fs::read(&path).unwrap())
        } else if ft.is_fifo() {
            Kind::Fifo
        } else if ft.is_char_device() {
            Kind::CharDev(md.rdev())
        } else {
            panic!("unexpected file type at {}", path.display());
        };
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        out.insert(
            rel,
            Node {
                mode: if ft.is_symlink() {
                    0
                } else {
                    md.mode() & 0o7777
                },
                mtime: md.mtime(),
                uid: md.uid(),
                gid: md.gid(),
                ino: md.ino(),
                kind: kind.clone(),
            },
        );
        if kind == Kind::Dir {
            walk(root, &path, out);
        }
    }
}

/// Snapshots with inode numbers zeroed, for comparing two trees.
pub fn comparable(tree: &BTreeMap<String, Node>) -> BTreeMap<String, Node> {
    tree.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Node {
                    ino: 0,
                    ..v.clone()
                },
            )
        })
        .collect()
}

/// This test binary at a path uid 65532 can reach (the checkout may sit
/// under a private directory such as /root): a hardlink, or a copy, in a
/// fresh world-readable temp dir, removed when the guard drops.
fn reachable_exe() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe().expect("current exe");
    let dir = tempfile::Builder::new()
        .prefix("xfn-test-exe-")
        .tempdir_in("/tmp")
        .expect("temp dir in /tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("test-binary");
    if std::fs::hard_link(&exe, &copy).is_err() {
        std::fs::copy(&exe, &copy).expect("copy of the test binary");
    }
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, copy)
}

/// Whether this process is already the re-executed unprivileged copy.
pub fn in_unprivileged_child() -> bool {
    std::env::var_os("XFN_TEST_UNPRIV_CHILD").is_some()
}

/// Re-runs the test `name` of this test binary as uid/gid 65532 with no
/// capabilities, inside a new user namespace (mapped to root) and mount
/// namespace (`setpriv` + `unshare -r -m`, util-linux), and panics unless it
/// passes. The child sees `XFN_TEST_UNPRIV_CHILD`.
pub fn run_unprivileged(name: &str) {
    let (_guard, exe) = reachable_exe();
    let mut args: Vec<OsString> = [
        "--reuid=65532",
        "--regid=65532",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push(exe.into_os_string());
    for a in [name, "--exact", "--nocapture", "--test-threads=1"] {
        args.push(a.into());
    }
    let out = Command::new("setpriv")
        .args(&args)
        .env("XFN_TEST_UNPRIV_CHILD", "1")
        .current_dir("/")
        // The child needs a scratch dir it may write to.
        .env("TMPDIR", "/tmp")
        .output()
        .expect("setpriv (util-linux) must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "unprivileged run of {name} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

/// Re-runs the test `name` of this test binary as root in a new, private
/// mount namespace (`unshare --mount`), so mounts it leaves on a failure die
/// with it, and panics unless it passes. The child sees
/// `XFN_TEST_MOUNTNS_CHILD`.
pub fn run_in_mount_namespace(name: &str) {
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("XFN_TEST_MOUNTNS_CHILD", "1")
        .output()
        .expect("unshare (util-linux) must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "mount-namespace run of {name} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

/// Whether this process is the copy re-executed in a private mount namespace.
pub fn in_mount_namespace_child() -> bool {
    std::env::var_os("XFN_TEST_MOUNTNS_CHILD").is_some()
}

/// Re-runs the test `name` as uid/gid 65532 with no capabilities and no
/// namespace of its own (`setpriv` only), and panics unless it passes. The
/// child sees `XFN_TEST_NOPRIV_CHILD`.
pub fn run_without_privilege(name: &str) {
    let (_guard, exe) = reachable_exe();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65532",
            "--regid=65532",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("XFN_TEST_NOPRIV_CHILD", "1")
        .current_dir("/")
        .env("TMPDIR", "/tmp")
        .output()
        .expect("setpriv (util-linux) must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "unprivileged run of {name} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

/// Whether this process is the copy re-executed by [`run_without_privilege`].
pub fn in_no_privilege_child() -> bool {
    std::env::var_os("XFN_TEST_NOPRIV_CHILD").is_some()
}

/// Whether anything is mounted at or under `path` (per /proc/self/mountinfo).
pub fn mounted_under(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.as_os_str().as_bytes();
    info.lines().any(|l| {
        let mp = l.split(' ').nth(4).unwrap_or("");
        let mp = mp.as_bytes();
        mp == p || (mp.starts_with(p) && mp.get(p.len()) == Some(&b'/'))
    })
}
