//! Applying tar entries one by one to the tree.
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::fsops;
use super::meta::{gid, io_err, pax_xattrs, process_umask, set_xattrs, timestamps, uid};
use super::paths::{join, normalize, split_last};
use super::seen::Origin;
use super::tree::{set_opaque, ResolveError, Tree};
use super::{ExtractError, ExtractStats};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// Longest path a process can name (with its NUL).
const PATH_MAX: usize = 4096;
/// Deepest path accepted: far beyond real images (whose paths rarely pass
/// 30 levels), low enough that walking a tree of such paths recursively is
/// safe for stacks and fd limits.
pub(crate) const MAX_DEPTH: usize = 256;
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// Files are copied through a buffer of this size, reused for every entry.
const COPY_BUF: usize = 256 * 1024;

/// One layer being applied.
pub(super) struct Extraction {
    tree: Tree,
    stats: ExtractStats,
    /// Directories' metadata, applied once the whole layer is in.
    dirs: HashMap<Vec<u8>, Meta>,
    /// Owner pairs whose chown the namespace refused: not tried again.
    unmapped: HashSet<(u32, u32)>,
    euid: u32,
    egid: u32,
    /// Lower directories made writable for a moment, with their modes.
    relock: HashMap<Vec<u8>, u32>,
    /// Whether a file created with its mode was seen to get exactly it.
    umask_checked: bool,
    /// Added to every entry's uid and gid ([`super::ExtractOptions`]).
    owner_shift: u32,
    buf: Vec<u8>,
}

/// The metadata of an entry's header.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
}

impl Extraction {
    pub(super) fn new(tree: Tree, owner_shift: u32) -> Self {
        Self {
            tree,
            stats: ExtractStats::default(),
            dirs: HashMap::new(),
            unmapped: HashSet::new(),
            euid: rustix::process::geteuid().as_raw(),
            egid: rustix::process::getegid().as_raw(),
            umask_checked: false,
            owner_shift,
            relock: HashMap::new(),
            buf: vec![0; COPY_BUF],
        }
    }

    /// Applies one entry; `name` is its raw path, for errors.
    pub(super) fn apply<R: Read>(
        &mut self,
        item: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<(), ExtractError> {
        let kind = item.header().entry_type();
        if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            return Ok(());
        }
        let rel = normalize(&item.path_bytes()).map_err(|reason| unsafe_entry(name, reason))?;
        if rel.len() >= PATH_MAX {
            // No process in the container could use it.
            return Err(unsafe_entry(name, "its path is longer than PATH_MAX"));
        }
        if rel.iter().filter(|&&b| b == b'/').count() >= MAX_DEPTH {
            // Bounds the recursion (and fds held) of opaque-directory
            // handling and of copying the flattened tree.
            return Err(unsafe_entry(
                name,
                &format!("its path is deeper than {MAX_DEPTH} levels"),
            ));
        }
        if rel.is_empty() {
            // The layer root itself ("./"): its metadata is the layer dir's
            // own business (the store makes it), so it is not applied.
            return Ok(());
        }
        let (parent, base) = split_last(&rel);
        if base.starts_with(WHITEOUT_PREFIX) {
            return self.whiteout(parent, base, name);
        }
        let creatable = kind.is_dir()
            || kind.is_file()
            || kind.is_contiguous()
            || kind.is_gnu_sparse()
            || kind.is_symlink()
            || kind.is_hard_link()
            || kind.is_fifo();
        if !creatable {
            // Device nodes cannot be made in a user namespace and have no
            // place in a function's rootfs; other types are unknown.
            tracing::debug!(entry = name, kind = ?kind, "skipping layer entry");
            self.stats.skipped += 1;
            return Ok(());
        }
        let parent_fd = self
            .tree
            .dir_for_entry(parent)
            .map_err(|e| resolve_err(name, e))?;
        let dir = parent_fd.fd.as_fd();
        let parent_setgid = parent_fd.setgid;
        self.stats.entries += 1;
        if kind.is_hard_link() {
            // A hardlink has the target's metadata: its header's is unused.
            return self.hardlink(dir, &rel, base, item, name);
        }
        let header = item.header();
        let meta = Meta {
            mode: header.mode().map_err(|e| io_err(name, e))? & 0o7777,
            // Blank owner or time fields (some writers leave them empty)
            // read as 0 rather than failing the whole layer.
            // Past u32 (or onto -1, "unchanged"), the id is left unmapped:
            // chown refuses it and the entry stays xfn's.
            uid: shifted(header.uid().unwrap_or(0), self.owner_shift),
            gid: shifted(header.gid().unwrap_or(0), self.owner_shift),
            mtime: header.mtime().unwrap_or(0) as i64,
        };
        if kind.is_dir() {
            self.directory(dir, &rel, base, meta, item, name)?;
        } else if kind.is_file() || kind.is_contiguous() || kind.is_gnu_sparse() {
            self.regular(dir, parent_setgid, &rel, base, &meta, item, name)?;
        } else if kind.is_symlink() {
            let target = item
                .link_name_bytes()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| unsafe_entry(name, "symlink without a target"))?;
            self.replacing(dir, &rel, base, name, |d| {
                rustix::fs::symlinkat(target.as_ref(), d, base)
            })?;
            self.chown_at(dir, parent_setgid, base, &meta);
            let times = timestamps(meta.mtime);
            rustix::fs::utimensat(dir, base, &times, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io_err(name, e.into()))?;
        } else {
            self.replacing(dir, &rel, base, name, |d| {
                rustix::fs::mknodat(d, base, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            })?;
            self.chown_at(dir, parent_setgid, base, &meta);
            rustix::fs::chmodat(dir, base, Mode::from_raw_mode(meta.mode), AtFlags::empty())
                .map_err(|e| io_err(name, e.into()))?;
            let times = timestamps(meta.mtime);
            rustix::fs::utimensat(dir, base, &times, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io_err(name, e.into()))?;
        }
        Ok(())
    }

    fn directory<R: Read>(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &[u8],
        base: &[u8],
        meta: Meta,
        item: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<(), ExtractError> {
        let key = self.tree.seen.key(rel);
        let before = self.tree.seen.get(key);
        let mut made = rustix::fs::mkdirat(dir, base, Mode::from_raw_mode(0o700));
        if made == Err(Errno::ACCESS) && self.unlock(dir, split_last(rel).0, name)? {
            made = rustix::fs::mkdirat(dir, base, Mode::from_raw_mode(0o700));
        }
        match made {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(dir, base, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_err(name, e.into()))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    fsops::remove_any_at(dir, base).map_err(|e| io_err(name, e))?;
                    rustix::fs::mkdirat(dir, base, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_err(name, e.into()))?;
                }
            }
            Err(e) => return Err(io_err(name, e.into())),
        }
        let xattrs = pax_xattrs(item, name)?;
        if !xattrs.is_empty() || (self.tree.overlay && before == Some(Origin::Whiteout)) {
            let fd = fsops::open_dir_at(dir, base).map_err(|e| io_err(name, e))?;
            if self.tree.overlay && before == Some(Origin::Whiteout) {
                // A whiteout of this layer hid the lower directory.
                set_opaque(fd.as_fd()).map_err(|e| io_err(name, e))?;
            }
            set_xattrs(fd.as_fd(), &xattrs, name);
        }
        self.tree.seen.insert(key, Origin::Dir);
        // Mode, owner and times last: contents are written first (a 0555
        // directory stays writable meanwhile) and would bump the mtime.
        self.dirs.insert(rel.to_vec(), meta);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn regular<R: Read>(
        &mut self,
        dir: BorrowedFd<'_>,
        parent_setgid: bool,
        rel: &[u8],
        base: &[u8],
        meta: &Meta,
        item: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<(), ExtractError> {
        let xattrs = pax_xattrs(item, name)?;
        let fd = self.replacing(dir, rel, base, name, |d| {
            rustix::fs::openat(
                d,
                base,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                // The final permission bits right away: with the usual
                // umask nothing more is needed (the fd stays writable).
                Mode::from_raw_mode(meta.mode & 0o777),
            )
        })?;
        let mut file = File::from(fd);
        // The `tar` crate reads a GNU sparse file's holes as zeros: they are
        // skipped here, so the file gets holes again and the disk only its
        // real data (a sparse bomb writes nothing).
        let sparse = item.header().entry_type().is_gnu_sparse();
        let mut len = 0u64;
        loop {
            let n = match item.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(name, e)),
            };
            len += n as u64;
            if sparse && self.buf[..n].iter().all(|&b| b == 0) {
                file.seek(SeekFrom::Start(len))
                    .map_err(|e| io_err(name, e))?;
                continue;
            }
            file.write_all(&self.buf[..n])
                .map_err(|e| io_err(name, e))?;
            self.stats.bytes += n as u64;
        }
        if sparse {
            file.set_len(len).map_err(|e| io_err(name, e))?;
        }
        let fd: OwnedFd = file.into();
        // A new file is already ours, with our group unless its directory
        // is setgid: chown only when that is not what the entry wants.
        let owned_right = (meta.uid, meta.gid) == (self.euid, self.egid) && !parent_setgid;
        if !owned_right {
            self.chown_fd(fd.as_fd(), meta);
        }
        // Owner before mode: chown clears setuid/setgid. Skipped when the
        // create mode already gave exactly these bits.
        let mut mode_right = meta.mode & 0o7000 == 0 && meta.mode & process_umask() == 0;
        if owned_right && mode_right && !self.umask_checked {
            // Once per layer, check the create mode really came out as
            // expected (the umask could have changed since it was read).
            let st = rustix::fs::fstat(&fd).map_err(|e| io_err(name, e.into()))?;
            mode_right = st.st_mode & 0o7777 == meta.mode;
            self.umask_checked = mode_right;
        }
        if !(owned_right && mode_right) {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(meta.mode))
                .map_err(|e| io_err(name, e.into()))?;
        }
        set_xattrs(fd.as_fd(), &xattrs, name);
        rustix::fs::futimens(&fd, &timestamps(meta.mtime)).map_err(|e| io_err(name, e.into()))?;
        Ok(())
    }

    fn hardlink<R: Read>(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &[u8],
        base: &[u8],
        item: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<(), ExtractError> {
        let raw = item
            .link_name_bytes()
            .ok_or_else(|| unsafe_entry(name, "hardlink without a target"))?;
        let target = normalize(&raw).map_err(|_| {
            unsafe_entry(
                name,
                &format!(
                    "hardlink target {:?} climbs above the layer root",
                    super::quote(&raw)
                ),
            )
        })?;
        if target.is_empty() {
            return Err(unsafe_entry(name, "hardlink to the layer root"));
        }
        if target == rel {
            return Ok(());
        }
        let (tparent, tbase) = split_last(&target);
        let tdir = self
            .tree
            .open_existing(tparent)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV) => unsafe_entry(
                    name,
                    &format!(
                        "hardlink target {:?} lies behind a symlink or non-directory",
                        super::quote(&target)
                    ),
                ),
                _ => io_err(
                    name,
                    io::Error::new(
                        e.kind(),
                        format!("hardlink target {:?}: {e}", super::quote(&target)),
                    ),
                ),
            })?;
        // linkat without AT_SYMLINK_FOLLOW links a symlink itself, never
        // what it points to: a hardlink cannot reach outside either.
        self.replacing(dir, rel, base, name, |d| {
            rustix::fs::linkat(&tdir, tbase, d, base, AtFlags::empty())
        })
        .map_err(|e| match e {
            ExtractError::Io { entry, source } => ExtractError::Io {
                entry,
                source: io::Error::new(
                    source.kind(),
                    format!("hardlink to {:?}: {source}", super::quote(&target)),
                ),
            },
            other => other,
        })?;
        Ok(())
    }

    /// Runs `create` (a syscall making `base` in `dir`); when something is
    /// already there it is removed (recursively for a directory) and `create`
    /// retried: a later entry replaces an earlier or lower one of any type.
    fn replacing<T>(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &[u8],
        base: &[u8],
        name: &str,
        mut create: impl FnMut(BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, ExtractError> {
        let out = match self.create_or_replace(dir, base, &mut create) {
            Err(Errno::ACCESS) if self.unlock(dir, split_last(rel).0, name)? => {
                self.create_or_replace(dir, base, &mut create)
            }
            other => other,
        }
        .map_err(|e| io_err(name, e.into()))?;
        let key = self.tree.seen.key(rel);
        self.tree.seen.insert(key, Origin::NonDir);
        Ok(out)
    }

    fn create_or_replace<T>(
        &mut self,
        dir: BorrowedFd<'_>,
        base: &[u8],
        create: &mut impl FnMut(BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        match create(dir) {
            Err(Errno::EXIST) => {
                if fsops::remove_any_at(dir, base)
                    .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?
                {
                    self.tree.invalidate();
                }
                create(dir)
            }
            other => other,
        }
    }

    /// Makes the directory `dir` (at `rel`) writable by its owner when it is
    /// not (a read-only directory of a lower layer, met without the
    /// privilege to ignore modes); its mode is put back by [`Self::finish`].
    /// Returns whether anything changed (worth a retry).
    fn unlock(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &[u8],
        name: &str,
    ) -> Result<bool, ExtractError> {
        let mode = rustix::fs::fstat(dir)
            .map_err(|e| io_err(name, e.into()))?
            .st_mode
            & 0o7777;
        if mode & 0o700 == 0o700 {
            return Ok(false);
        }
        rustix::fs::fchmod(dir, Mode::from_raw_mode(mode | 0o700))
            .map_err(|e| io_err(name, e.into()))?;
        self.relock.entry(rel.to_vec()).or_insert(mode);
        Ok(true)
    }

    /// A `.wh.` entry: `.wh..wh..opq` makes its directory opaque, `.wh.X`
    /// hides the lower layers' X.
    fn whiteout(&mut self, parent: &[u8], base: &[u8], name: &str) -> Result<(), ExtractError> {
        let parent_fd = self
            .tree
            .dir_for_entry(parent)
            .map_err(|e| resolve_err(name, e))?;
        if base == OPAQUE_MARKER {
            self.stats.whiteouts += 1;
            return self
                .tree
                .make_opaque(parent_fd.fd.as_fd(), self.tree.seen.key(parent))
                .map_err(|e| io_err(name, e));
        }
        if base.starts_with(b".wh..wh.") {
            // Other AUFS metadata (`.wh..wh.plnk`, …): not part of the tree.
            tracing::debug!(entry = name, "skipping AUFS metadata entry");
            self.stats.skipped += 1;
            return Ok(());
        }
        self.stats.whiteouts += 1;
        let hidden = &base[WHITEOUT_PREFIX.len()..];
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
            return Err(unsafe_entry(name, "whiteout of an invalid name"));
        }
        let rel = join(parent, hidden);
        let dir = parent_fd.fd.as_fd();
        let key = self.tree.seen.key(&rel);
        match self.tree.seen.get(key) {
            // This layer has its own `hidden`: the whiteout hides only what
            // lower layers had there (the spec: whiteouts apply to lower
            // layers only, in whatever order the two entries come).
            Some(Origin::Dir) => {
                let fd = fsops::open_dir_at(dir, hidden).map_err(|e| io_err(name, e))?;
                self.tree
                    .make_opaque(fd.as_fd(), key)
                    .map_err(|e| io_err(name, e))?;
            }
            Some(Origin::NonDir) | Some(Origin::Whiteout) => {}
            None => {
                if self.tree.overlay {
                    self.replacing(dir, &rel, hidden, name, |d| {
                        rustix::fs::mknodat(
                            d,
                            hidden,
                            FileType::CharacterDevice,
                            Mode::empty(),
                            rustix::fs::makedev(0, 0),
                        )
                    })?;
                } else if fsops::remove_any_at(dir, hidden).map_err(|e| io_err(name, e))? {
                    self.tree.invalidate();
                }
                self.tree.seen.insert(key, Origin::Whiteout);
            }
        }
        Ok(())
    }

    /// Sets directories' modes, owners and mtimes (deepest first, so a
    /// read-only parent does not stop its children) and returns the stats.
    pub(super) fn finish(mut self) -> Result<ExtractStats, ExtractError> {
        let relock: Vec<(Vec<u8>, u32)> = std::mem::take(&mut self.relock)
            .into_iter()
            .filter(|(rel, _)| !self.dirs.contains_key(rel))
            .collect();
        let mut dirs: Vec<(Vec<u8>, Meta)> = std::mem::take(&mut self.dirs).into_iter().collect();
        dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.iter().filter(|&&b| b == b'/').count()));
        self.tree.invalidate();
        for (rel, meta) in dirs {
            let name = String::from_utf8_lossy(&rel).into_owned();
            let fd = match self.tree.open_existing(&rel) {
                Ok(fd) => fd,
                // Replaced or removed by a later entry of this layer.
                Err(_) => continue,
            };
            self.chown_fd(fd.as_fd(), &meta);
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(meta.mode))
                .map_err(|e| io_err(&name, e.into()))?;
            rustix::fs::futimens(&fd, &timestamps(meta.mtime))
                .map_err(|e| io_err(&name, e.into()))?;
        }
        for (rel, mode) in relock {
            if let Ok(fd) = self.tree.open_existing(&rel) {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                    .map_err(|e| io_err(&String::from_utf8_lossy(&rel), e.into()))?;
            }
        }
        Ok(self.stats)
    }

    fn chown_fd(&mut self, fd: BorrowedFd<'_>, meta: &Meta) {
        if self.unmapped.contains(&(meta.uid, meta.gid)) {
            return;
        }
        let res = rustix::fs::fchown(fd, Some(uid(meta.uid)), Some(gid(meta.gid)));
        self.note_chown(res, meta);
    }

    /// Sets the owner of the new non-directory `base` in `dir` unless it is
    /// already right (ours, in a directory that is not setgid).
    fn chown_at(&mut self, dir: BorrowedFd<'_>, parent_setgid: bool, base: &[u8], meta: &Meta) {
        let owned_right = (meta.uid, meta.gid) == (self.euid, self.egid) && !parent_setgid;
        if owned_right || self.unmapped.contains(&(meta.uid, meta.gid)) {
            return;
        }
        let res = rustix::fs::chownat(
            dir,
            base,
            Some(uid(meta.uid)),
            Some(gid(meta.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        );
        self.note_chown(res, meta);
    }

    fn note_chown(&mut self, res: Result<(), Errno>, meta: &Meta) {
        match res {
            Ok(()) => {}
            // EINVAL: the id is not mapped in this user namespace; EPERM: no
            // CAP_CHOWN. Either way the file stays ours, which is what a
            // rootless run without a full id map can do.
            Err(e @ (Errno::INVAL | Errno::PERM)) => {
                tracing::debug!(uid = meta.uid, gid = meta.gid, error = %e, "ownership not kept");
                self.unmapped.insert((meta.uid, meta.gid));
            }
            Err(e) => {
                tracing::warn!(uid = meta.uid, gid = meta.gid, error = %e, "ownership not kept");
            }
        }
    }
}

/// A header's id moved up by `shift`; with a shift, ids that would pass
/// `u32::MAX - 1` become `u32::MAX - 1`, which no namespace of xfn's maps.
fn shifted(id: u64, shift: u32) -> u32 {
    if shift == 0 {
        return id as u32; // As ever: the id the header names.
    }
    let ceiling = u64::from(u32::MAX - 1);
    id.saturating_add(u64::from(shift)).min(ceiling) as u32
}

fn unsafe_entry(entry: &str, reason: &str) -> ExtractError {
    ExtractError::Unsafe {
        entry: entry.to_owned(),
        reason: reason.to_owned(),
    }
}

fn resolve_err(entry: &str, e: ResolveError) -> ExtractError {
    match e {
        ResolveError::ThroughNonDir(p) => unsafe_entry(
            entry,
            &format!(
                "its parent {:?} is a symlink or non-directory of this same layer",
                super::quote(&p)
            ),
        ),
        ResolveError::Io(source) => io_err(entry, source),
    }
}
