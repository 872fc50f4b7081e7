//! The destination tree of one layer extraction: safe directory resolution
//! and the record of what this layer put where.
//!
//! # How writes are kept inside `dest`
//! Every entry's parent directory is opened relative to an fd of `dest` with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
//! the kernel refuses any symlink on the way and any escape, in one syscall.
//! Where `openat2` is unavailable (old kernel, seccomp) or refuses, the path is
//! walked one component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)`.
//! The entry itself is then created relative to that parent fd with `*at`
//! calls that never follow a symlink in the last component (`O_NOFOLLOW`,
//! `O_EXCL`, `AT_SYMLINK_NOFOLLOW`). So a symlink in the tree, whoever put it
//! there, is never written through.
//!
//! # Non-directories on the way
//! When a path passes through something that is not a directory:
//! - put there by this same layer (a symlink `a -> /` then `a/etc/x`): the
//!   entry is refused — the layer is contradicting itself, the usual shape of
//!   a path-traversal attack;
//! - from a lower layer (Flatten mode, or a non-empty `dest`): it is replaced
//!   by a directory. That is what the overlay of the layer dirs shows (a
//!   directory in an upper layer hides a lower non-directory), so both modes
//!   give one tree.
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;

use rustix::fs::{Mode, OFlags, ResolveFlags, XattrFlags};
use rustix::io::Errno;

use super::fsops;
use super::seen::{Origin, PathKey, Seen};

/// The overlay xattr that marks a directory opaque under `userxattr`.
pub(crate) const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// Why resolving a directory failed.
#[derive(Debug)]
pub(crate) enum ResolveError {
    /// The path passes through a non-directory this layer put there.
    ThroughNonDir(Vec<u8>),
    /// An I/O error.
    Io(io::Error),
}

impl From<io::Error> for ResolveError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<Errno> for ResolveError {
    fn from(e: Errno) -> Self {
        Self::Io(e.into())
    }
}

/// An open parent directory of entries.
pub(crate) struct ParentDir {
    /// Its fd.
    pub(crate) fd: OwnedFd,
    /// Whether it is setgid (new files then take its group, not ours).
    pub(crate) setgid: bool,
}

/// The tree being extracted into.
pub(crate) struct Tree {
    root: OwnedFd,
    /// Whether whiteouts become overlay whiteouts (else they delete).
    pub(crate) overlay: bool,
    /// What this layer has put, by normalised path.
    pub(crate) seen: Seen,
    /// The last parent directory resolved: entries come grouped by directory,
    /// so this saves the walk for most of them.
    cache: Option<(Vec<u8>, Rc<ParentDir>)>,
    /// Cleared when openat2 is not usable here.
    openat2: bool,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl Tree {
    /// Opens `dest` (which must be a directory).
    pub(crate) fn open(dest: &Path, overlay: bool, use_openat2: bool) -> io::Result<Self> {
        let root = rustix::fs::open(dest, DIR_FLAGS, Mode::empty())?;
        Ok(Self {
            root,
            overlay,
            seen: Seen::new(),
            cache: None,
            openat2: use_openat2,
        })
    }

    /// The root directory fd.
    pub(crate) fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Forgets cached directory fds; called whenever a directory was removed.
    pub(crate) fn invalidate(&mut self) {
        self.cache = None;
    }

    /// Opens the existing directory `rel` (normalised, may be empty for the
    /// root) without following any symlink and without changing anything.
    pub(crate) fn open_existing(&mut self, rel: &[u8]) -> io::Result<OwnedFd> {
        if rel.is_empty() {
            return Ok(rustix::fs::openat(
                self.root(),
                ".",
                DIR_FLAGS,
                Mode::empty(),
            )?);
        }
        if self.openat2 {
            match self.openat2(rel) {
                Ok(fd) => return Ok(fd),
                Err(Errno::NOSYS) | Err(Errno::PERM) | Err(Errno::INVAL) => self.openat2 = false,
                Err(Errno::AGAIN) | Err(Errno::XDEV) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut cur: Option<OwnedFd> = None;
        for comp in rel.split(|&b| b == b'/') {
            let next = fsops::open_dir_at(cur.as_ref().map_or(self.root(), |f| f.as_fd()), comp)?;
            cur = Some(next);
        }
        cur.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn openat2(&self, rel: &[u8]) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            self.root(),
            rel,
            DIR_FLAGS,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// Opens directory `rel` for an entry to be written in, creating missing
    /// directories (mode 0755) and replacing lower layers' non-directories on
    /// the way, and records every directory on the way as this layer's.
    pub(crate) fn dir_for_entry(&mut self, rel: &[u8]) -> Result<Rc<ParentDir>, ResolveError> {
        if let Some((path, dir)) = &self.cache {
            if path.as_slice() == rel {
                return Ok(Rc::clone(dir));
            }
        }
        let fd = self.resolve_creating(rel)?;
        let st = rustix::fs::fstat(&fd)?;
        let dir = Rc::new(ParentDir {
            fd,
            setgid: st.st_mode & libc::S_ISGID != 0,
        });
        self.cache = Some((rel.to_vec(), Rc::clone(&dir)));
        Ok(dir)
    }

    fn resolve_creating(&mut self, rel: &[u8]) -> Result<OwnedFd, ResolveError> {
        if rel.is_empty() {
            return Ok(rustix::fs::openat(
                self.root(),
                ".",
                DIR_FLAGS,
                Mode::empty(),
            )?);
        }
        if self.openat2 {
            match self.openat2(rel) {
                Ok(fd) => {
                    self.seen.mark_dirs(rel);
                    return Ok(fd);
                }
                Err(Errno::NOSYS) | Err(Errno::PERM) | Err(Errno::INVAL) => self.openat2 = false,
                // Missing, a symlink or a non-directory on the way, or a race:
                // the walk below sorts it out.
                Err(_) => {}
            }
        }
        self.walk_creating(rel)
    }

    fn walk_creating(&mut self, rel: &[u8]) -> Result<OwnedFd, ResolveError> {
        let mut cur: Option<OwnedFd> = None;
        let mut start = 0;
        let mut key = super::seen::ROOT;
        for comp in rel.split(|&b| b == b'/') {
            let end = start + comp.len();
            let prefix = &rel[..end];
            start = end + 1;
            key = self.seen.child(key, comp);
            let parent = cur.as_ref().map_or(self.root(), |f| f.as_fd());
            let next = match fsops::open_dir_at(parent, comp) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    mkdir_tolerant(parent, comp)?;
                    fsops::open_dir_at(parent, comp)?
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOTDIR)
                        || e.raw_os_error() == Some(libc::ELOOP) =>
                {
                    let origin = self.seen.get(key);
                    if matches!(origin, Some(Origin::NonDir) | Some(Origin::Dir)) {
                        return Err(ResolveError::ThroughNonDir(prefix.to_vec()));
                    }
                    tracing::debug!(
                        path = %String::from_utf8_lossy(prefix),
                        "replacing a lower non-directory by a directory"
                    );
                    fsops::remove_any_at(parent, comp)?;
                    mkdir_tolerant(parent, comp)?;
                    let fd = fsops::open_dir_at(parent, comp)?;
                    if self.overlay && origin == Some(Origin::Whiteout) {
                        // The whiteout hid the lower directory: keep hiding it.
                        set_opaque(fd.as_fd())?;
                    }
                    fd
                }
                Err(e) => return Err(e.into()),
            };
            self.seen.insert(key, Origin::Dir);
            cur = Some(next);
        }
        cur.ok_or_else(|| ResolveError::Io(io::ErrorKind::NotFound.into()))
    }

    /// Makes the directory `dir_fd` (keyed `key`) hide what lower layers have
    /// in it: in Overlay mode the opaque xattr; in Flatten mode every child
    /// that is not this layer's is removed, recursively into this layer's
    /// dirs.
    pub(crate) fn make_opaque(&mut self, dir_fd: BorrowedFd<'_>, key: PathKey) -> io::Result<()> {
        if self.overlay {
            return set_opaque(dir_fd);
        }
        for (name, kind) in fsops::list_dir(dir_fd)? {
            let name = name.to_bytes();
            let child_key = self.seen.child(key, name);
            let is_dir = fsops::is_dir_entry(dir_fd, name, kind)?;
            match self.seen.get(child_key) {
                Some(Origin::Dir) if is_dir => {
                    let child = fsops::open_dir_at(dir_fd, name)?;
                    self.make_opaque(child.as_fd(), child_key)?;
                }
                Some(_) => {}
                None => {
                    if fsops::remove_any_at(dir_fd, name)? {
                        self.invalidate();
                    }
                }
            }
        }
        Ok(())
    }
}

/// mkdir that accepts a directory already being there.
fn mkdir_tolerant(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets the overlay opaque xattr on a directory.
pub(crate) fn set_opaque(dir: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::fs::fsetxattr(
        dir,
        OPAQUE_XATTR,
        b"y",
        XattrFlags::empty(),
    )?)
}
