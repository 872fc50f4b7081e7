//! Snapshots of directory trees (type, content, mode, mtime, owner,
//! inode of every path) to compare what an extraction or a rootfs made.
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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
