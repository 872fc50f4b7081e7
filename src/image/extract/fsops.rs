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
            // not privileged): make it so for a moment, as its owner may.
            with_writable(dir, || remove_any_at(dir, name))
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes the directory `name` under `dir` and everything in it.
pub(crate) fn remove_dir_tree_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let child = open_dir_for_removal(dir, name)?;
    empty_dir(child.as_fd())?;
    drop(child);
    rmdir_at(dir, name)
}

/// Most directory fds a removal keeps open at once, however deep the tree.
const MAX_HELD_FDS: usize = 32;

/// One directory on the way down during a removal.
struct Level {
    /// Its fd; given up for levels far above the current one and
    /// reopened through `..` on the way back up.
    fd: Option<OwnedFd>,
    /// Its name in its parent (none for the directory being emptied).
    name: Option<CString>,
    /// Its entries not yet removed.
    pending: Vec<(CString, FileType)>,
}

/// Removes everything inside the open directory `dir`.
///
/// Iterative with an explicit stack (a tree written by a function in its
/// copy-mode rootfs can be deeper than any thread stack), keeping at most
/// [`MAX_HELD_FDS`] directory fds open.
pub(crate) fn empty_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    let start = rustix::fs::openat(dir, ".", DIR_FLAGS, Mode::empty())?;
    let pending = list_dir(start.as_fd())?;
    let mut stack = vec![Level {
        fd: Some(start),
        name: None,
        pending,
    }];
    while let Some(top) = stack.last_mut() {
        let Some(top_fd) = top.fd.as_ref() else {
            return Err(io::Error::other("removal lost its directory"));
        };
        match top.pending.pop() {
            Some((name, kind)) => {
                let bytes = name.to_bytes();
                if is_dir_entry(top_fd.as_fd(), bytes, kind)? {
                    let child = open_dir_for_removal(top_fd.as_fd(), bytes)?;
                    let pending = list_dir(child.as_fd())?;
                    stack.push(Level {
                        fd: Some(child),
                        name: Some(name),
                        pending,
                    });
                    if stack.len() > MAX_HELD_FDS {
                        let far = stack.len() - 1 - MAX_HELD_FDS;
                        stack[far].fd = None;
                    }
                } else {
                    remove_any_at(top_fd.as_fd(), bytes)?;
                }
            }
            None => {
                let Some(done) = stack.pop() else { break };
                let Some(name) = done.name else { break };
                let Some(parent) = stack.last_mut() else {
                    break;
                };
                if parent.fd.is_none() {
                    if let Some(fd) = &done.fd {
                        parent.fd = Some(rustix::fs::openat(fd, "..", DIR_FLAGS, Mode::empty())?);
                    }
                }
                drop(done.fd);
                if let Some(parent_fd) = &parent.fd {
                    rmdir_at(parent_fd.as_fd(), name.to_bytes())?;
                }
            }
        }
    }
    Ok(())
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens a directory about to be emptied; one its owner cannot read (mode
/// 0 when not privileged) is made readable first.
fn open_dir_for_removal(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    match open_dir_at(dir, name) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            // It is a directory (not a symlink: callers checked), removed next.
            rustix::fs::chmodat(dir, name, Mode::from_raw_mode(0o700), AtFlags::empty())?;
            open_dir_at(dir, name)
        }
        other => other,
    }
}

/// Removes the empty directory `name` under `dir`.
fn rmdir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(rustix::io::Errno::ACCESS) => with_writable(dir, || {
            Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
        }),
        Err(e) => Err(e.into()),
    }
}

/// Runs `op` with `dir` made writable and searchable by its owner, then
/// puts its mode back.
fn with_writable<T>(dir: BorrowedFd<'_>, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let mode = rustix::fs::fstat(dir)?.st_mode & 0o7777;
    if mode & 0o700 == 0o700 {
        // Already writable by its owner: the refusal is about something else.
        return Err(rustix::io::Errno::ACCESS.into());
    }
    rustix::fs::fchmod(dir, Mode::from_raw_mode(mode | 0o700))?;
    let out = op();
    rustix::fs::fchmod(dir, Mode::from_raw_mode(mode))?;
    out
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
