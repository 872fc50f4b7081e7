//! Small fd-relative filesystem operations shared by layer extraction and the
//! per-run rootfs: removing trees without ever following a symlink.
//!
//! Everything here works relative to an open directory fd and opens children
//! with `O_NOFOLLOW`, so a symlink inside a tree being removed is unlinked as a
//! link and never traversed: removal cannot reach outside the tree.
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

/// Opens the directory `name` under `dir` without following a symlink there.
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Removes whatever `name` under `dir` is: a non-directory is unlinked (a
/// symlink as the link itself), a directory is emptied recursively first.
/// A missing `name` is not an error. Returns whether a directory was removed
/// (callers caching directory fds must drop them then).
pub(crate) fn remove_any_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<bool> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(false),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        // Linux answers EISDIR for a directory; some filesystems EPERM.
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {
            remove_dir_tree_at(dir, name)?;
            Ok(true)
        }
        Err(rustix::io::Errno::ACCESS) => {
            // The parent is not writable (a read-only dir of an image, when
            // not privileged): make it so, as its owner may, and retry once.
            rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700))?;
            remove_any_at(dir, name)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes the directory `name` under `dir` and everything in it.
pub(crate) fn remove_dir_tree_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let child = open_dir_at(dir, name)?;
    empty_dir(child.as_fd())?;
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(rustix::io::Errno::ACCESS) => {
            rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700))?;
            Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Lists the names in `dir` (without `.` and `..`) with their types as
/// readdir reports them (possibly `Unknown`).
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<(CString, FileType)>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push((entry.file_name().to_owned(), entry.file_type()));
    }
    Ok(names)
}

/// Whether the child `name` of `dir` is a directory, asking lstat when
/// readdir did not say.
pub(crate) fn is_dir_entry(dir: BorrowedFd<'_>, name: &[u8], kind: FileType) -> io::Result<bool> {
    if kind != FileType::Unknown {
        return Ok(kind == FileType::Directory);
    }
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

/// Removes everything inside the open directory `dir`.
pub(crate) fn empty_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    // Names are collected before removing so the directory stream is never
    // read while it changes.
    for (name, kind) in list_dir(dir)? {
        let name = name.to_bytes();
        if is_dir_entry(dir, name, kind)? {
            remove_dir_tree_at(dir, name)?;
        } else {
            remove_any_at(dir, name)?;
        }
    }
    Ok(())
}

/// Removes `path` (a file, symlink or whole directory tree) without following
/// symlinks inside it. A missing path is not an error.
pub(crate) fn remove_path(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to remove {}", path.display()),
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_fd = match rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    use std::os::unix::ffi::OsStrExt;
    remove_any_at(parent_fd.as_fd(), name.as_bytes())?;
    Ok(())
}
