//! Copying a flattened rootfs for one run, where overlay is not allowed.
//!
//! Regular files are cloned (`FICLONE`: a reflink, instant on btrfs/XFS) or
//! copied in the kernel (`copy_file_range`), falling back to read/write.
//! Modes, ownership (where the user namespace maps it), mtimes, symlinks,
//! FIFOs and hardlinks are kept; device nodes and sockets are skipped. The
//! source is walked with fds and `O_NOFOLLOW`: a symlink is copied as a
//! symlink, never followed.
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Stat, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use crate::image::extract::fsops;

/// What a copy did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CopyStats {
    /// Entries made.
    pub(crate) entries: u64,
    /// Bytes of file content copied (or cloned).
    pub(crate) bytes: u64,
}

struct Copier {
    /// (dev, ino) of multiply-linked files → their path relative to the root.
    links: HashMap<(u64, u64), Vec<u8>>,
    dst_root: OwnedFd,
    /// (dev, ino) of `dst_root`: met inside the source, it is not copied
    /// (a copy into its own source would never end).
    dst_id: (u64, u64),
    euid: u32,
    egid: u32,
    unmapped: HashSet<(u32, u32)>,
    clone_ok: bool,
    range_ok: bool,
    stats: CopyStats,
}

/// Copies the tree under `src` into the new directory `dst` (created here;
/// its parent must exist).
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> io::Result<CopyStats> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let src_fd = rustix::fs::open(src, dir_flags, Mode::empty())?;
    let st = rustix::fs::fstat(&src_fd)?;
    rustix::fs::mkdir(dst, Mode::from_raw_mode(0o700))?;
    let dst_fd = rustix::fs::open(dst, dir_flags | OFlags::NOFOLLOW, Mode::empty())?;
    let dst_st = rustix::fs::fstat(&dst_fd)?;
    let mut copier = Copier {
        links: HashMap::new(),
        dst_root: rustix::io::dup(&dst_fd)?,
        dst_id: (dst_st.st_dev, dst_st.st_ino),
        euid: rustix::process::geteuid().as_raw(),
        egid: rustix::process::getegid().as_raw(),
        unmapped: HashSet::new(),
        clone_ok: true,
        range_ok: true,
        stats: CopyStats::default(),
    };
    copier.copy_dir(src_fd.as_fd(), dst_fd.as_fd(), b"")?;
    copier.finish_dir(dst_fd.as_fd(), &st)?;
    Ok(copier.stats)
}

impl Copier {
    fn copy_dir(&mut self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
        for (name, _) in fsops::list_dir(src)? {
            let name = name.to_bytes();
            let st = rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW)?;
            let child_rel = if rel.is_empty() {
                name.to_vec()
            } else {
                [rel, b"/", name].concat()
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if (st.st_dev, st.st_ino) == self.dst_id => continue,
                FileType::Directory => {
                    rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))?;
                    let s = fsops::open_dir_at(src, name)?;
                    let d = fsops::open_dir_at(dst, name)?;
                    self.copy_dir(s.as_fd(), d.as_fd(), &child_rel)?;
                    // Mode and times after the contents: a read-only
                    // directory stays writable while it is filled.
                    self.finish_dir(d.as_fd(), &st)?;
                }
                FileType::RegularFile => self.copy_file(src, dst, name, &st, child_rel)?,
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(src, name, Vec::new())?;
                    rustix::fs::symlinkat(target.as_c_str(), dst, name)?;
                    self.chown_at(dst, name, &st);
                    rustix::fs::utimensat(dst, name, &times(&st), AtFlags::SYMLINK_NOFOLLOW)?;
                }
                FileType::Fifo => {
                    rustix::fs::mknodat(dst, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)?;
                    self.chown_at(dst, name, &st);
                    rustix::fs::chmodat(dst, name, mode_of(&st), AtFlags::empty())?;
                    rustix::fs::utimensat(dst, name, &times(&st), AtFlags::SYMLINK_NOFOLLOW)?;
                }
                other => {
                    tracing::debug!(
                        path = %String::from_utf8_lossy(&child_rel),
                        kind = ?other,
                        "not copied into the rootfs"
                    );
                    continue;
                }
            }
            self.stats.entries += 1;
        }
        Ok(())
    }

    fn copy_file(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &[u8],
        st: &Stat,
        rel: Vec<u8>,
    ) -> io::Result<()> {
        if st.st_nlink > 1 {
            let key = (st.st_dev, st.st_ino);
            if let Some(first) = self.links.get(&key) {
                rustix::fs::linkat(
                    &self.dst_root,
                    first.as_slice(),
                    dst,
                    name,
                    AtFlags::empty(),
                )?;
                return Ok(());
            }
            self.links.insert(key, rel);
        }
        // Declared before `to`, dropped after it: no child may be forked
        // holding a copy of the descriptor of a file a run is about to
        // execute (`crate::fork_lock`).
        let _writing = (st.st_mode & 0o111 != 0).then(crate::fork_lock::writing_executable);
        let from = rustix::fs::openat(
            src,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let to = rustix::fs::openat(
            dst,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        self.copy_contents(&from, &to, st.st_size as u64)?;
        if (st.st_uid, st.st_gid) != (self.euid, self.egid) {
            self.chown_fd(to.as_fd(), st);
        }
        rustix::fs::fchmod(&to, mode_of(st))?;
        rustix::fs::futimens(&to, &times(st))?;
        Ok(())
    }

    fn copy_contents(&mut self, from: &OwnedFd, to: &OwnedFd, size: u64) -> io::Result<()> {
        self.stats.bytes += size;
        if size == 0 {
            return Ok(());
        }
        if self.clone_ok {
            match rustix::fs::ioctl_ficlone(to, from) {
                Ok(()) => return Ok(()),
                // Not a reflink-capable filesystem (or across filesystems).
                Err(e) => {
                    tracing::trace!(error = %e, "FICLONE unavailable");
                    self.clone_ok = false;
                }
            }
        }
        let mut done = 0u64;
        if self.range_ok {
            loop {
                let want = (size - done).min(1 << 30) as usize;
                match rustix::fs::copy_file_range(from, None, to, None, want) {
                    Ok(0) => return Ok(()),
                    Ok(n) => {
                        done += n as u64;
                        if done >= size {
                            return Ok(());
                        }
                    }
                    Err(Errno::XDEV)
                    | Err(Errno::NOSYS)
                    | Err(Errno::INVAL)
                    | Err(Errno::OPNOTSUPP)
                        if done == 0 =>
                    {
                        self.range_ok = false;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let mut reader = File::from(rustix::io::dup(from)?);
        let mut writer = File::from(rustix::io::dup(to)?);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            writer.write_all(&buf[..n])?;
        }
    }

    fn finish_dir(&mut self, dir: BorrowedFd<'_>, st: &Stat) -> io::Result<()> {
        if (st.st_uid, st.st_gid) != (self.euid, self.egid) {
            self.chown_fd(dir, st);
        }
        rustix::fs::fchmod(dir, mode_of(st))?;
        rustix::fs::futimens(dir, &times(st))?;
        Ok(())
    }

    fn chown_fd(&mut self, fd: BorrowedFd<'_>, st: &Stat) {
        if self.unmapped.contains(&(st.st_uid, st.st_gid)) {
            return;
        }
        let res = rustix::fs::fchown(
            fd,
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
        );
        self.note_chown(res, st);
    }

    fn chown_at(&mut self, dir: BorrowedFd<'_>, name: &[u8], st: &Stat) {
        if (st.st_uid, st.st_gid) == (self.euid, self.egid)
            || self.unmapped.contains(&(st.st_uid, st.st_gid))
        {
            return;
        }
        let res = rustix::fs::chownat(
            dir,
            name,
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        );
        self.note_chown(res, st);
    }

    fn note_chown(&mut self, res: Result<(), Errno>, st: &Stat) {
        if let Err(e) = res {
            tracing::debug!(uid = st.st_uid, gid = st.st_gid, error = %e, "ownership not kept");
            self.unmapped.insert((st.st_uid, st.st_gid));
        }
    }
}

fn mode_of(st: &Stat) -> Mode {
    Mode::from_raw_mode(st.st_mode & 0o7777)
}

fn times(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}
