//! The files a suite names (its golden files) and the `--junit` report,
//! each a path beneath a root, opened there without following a symlink.
//!
//! Why: a suite is code from a repository's contributors (in CI, a pull
//! request's author), and xfn often runs as root. A golden path `../x`,
//! `/etc/x` or a symlink committed in the repository would have `--update`
//! write, and a diff print, a file outside the repository; a device read
//! as a golden file (`/dev/zero`) would never end.
//!
//! Invariant: a [`Beneath`] is a root and a relative path with no `..`
//! that climbs out of it, opened from an fd of the root one component at a
//! time with `openat(O_NOFOLLOW)` (missing directories made with `mkdirat`
//! when writing): the guarantee of `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` on every kernel, with no ENOSYS case to fall back
//! from. A symlink anywhere on the way is refused, named; what is opened
//! must be a regular file (looked at before it is opened, so a device or a
//! FIFO is never opened, and checked again after) and is read through
//! `take(MAX + 1)`, never trusting its size.
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why a path beneath a root cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BeneathError {
    /// The path given is absolute.
    #[error("an absolute path: name it relative to the suite, beneath {}", root.display())]
    Absolute { root: PathBuf },
    /// Its `..` climb out of the root.
    #[error("it climbs out of {} (--root names a wider root)", root.display())]
    Escapes { root: PathBuf },
    /// A component on the way, or the file itself, is a symlink.
    #[error("{} is a symlink, and xfn follows none in a suite's files", link.display())]
    Symlink { link: PathBuf },
    /// Something other than a regular file (a directory on the way: other
    /// than a directory).
    #[error("{} is a {kind}, not a {wanted}", path.display())]
    Kind {
        path: PathBuf,
        kind: &'static str,
        wanted: &'static str,
    },
    /// Longer than read.
    #[error("more than {max} bytes")]
    TooLarge { max: u64 },
    /// Opening, reading or making it failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<Errno> for BeneathError {
    fn from(e: Errno) -> Self {
        Self::Io(e.into())
    }
}

impl BeneathError {
    /// Whether the kernel refused for want of permission.
    pub(crate) fn is_permission_denied(&self) -> bool {
        matches!(self, Self::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied)
    }
}

/// A file beneath `root`: a relative path, normalised, never empty.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Beneath {
    root: PathBuf,
    relative: PathBuf,
}

const DIR_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl Beneath {
    /// `name` (relative to `dir`, itself relative to `root`) beneath
    /// `root`: refused when absolute or when its `..` climb out of `root`.
    pub(crate) fn new(root: &Path, dir: &Path, name: &Path) -> Result<Beneath, BeneathError> {
        if name.has_root() {
            return Err(BeneathError::Absolute { root: root.into() });
        }
        let escapes = || BeneathError::Escapes { root: root.into() };
        let mut relative = PathBuf::new();
        for component in dir.components().chain(name.components()) {
            match component {
                Component::Normal(part) => relative.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !relative.pop() {
                        return Err(escapes());
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(escapes()),
            }
        }
        if relative.as_os_str().is_empty() {
            return Err(BeneathError::Kind {
                path: root.into(),
                kind: "directory",
                wanted: "file",
            });
        }
        Ok(Beneath {
            root: root.into(),
            relative,
        })
    }

    /// `path` (relative to the current directory, or absolute), every
    /// component of it opened without following a symlink from `/`: what
    /// the user named on the command line, `..` taken as written.
    pub(crate) fn anywhere(path: &Path) -> Result<Beneath, BeneathError> {
        let absolute = std::env::current_dir()?.join(path);
        let mut relative = PathBuf::new();
        for component in absolute.components() {
            match component {
                Component::Normal(part) => relative.push(part),
                Component::ParentDir => {
                    relative.pop();
                }
                _ => {}
            }
        }
        Beneath::new(Path::new("/"), Path::new(""), &relative)
    }

    /// The whole path, to name it.
    pub(crate) fn path(&self) -> PathBuf {
        self.root.join(&self.relative)
    }

    /// Reads it whole, refused past `max` bytes (read through `max + 1`).
    pub(crate) fn read(&self, max: u64) -> Result<String, BeneathError> {
        let file = self.open(OFlags::RDONLY, false)?;
        // Its size refuses early; `take` is the bound whatever it says.
        if file.metadata()?.len() > max {
            return Err(BeneathError::TooLarge { max });
        }
        let mut bytes = Vec::new();
        file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(BeneathError::TooLarge { max });
        }
        String::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e).into())
    }

    /// Opens it for writing, made (with its directories) where missing,
    /// its contents kept until written.
    pub(crate) fn open_to_write(&self) -> Result<File, BeneathError> {
        self.open(OFlags::WRONLY | OFlags::CREATE, true)
    }

    /// Makes it afresh (with its directories), empty: a new file under a
    /// temporary name (`O_EXCL`), then renamed over whatever the name held
    /// (a symlink is replaced, never followed).
    pub(crate) fn create_fresh(&self) -> Result<File, BeneathError> {
        let (dir, name) = self.parent(true)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut attempt = 0u32;
        let (temp, fd) = loop {
            let temp = format!(
                ".{}.xfn-{}-{attempt}",
                name.to_string_lossy(),
                std::process::id()
            );
            match rustix::fs::openat(&dir, temp.as_str(), flags, Mode::from_raw_mode(0o666)) {
                Ok(fd) => break (temp, fd),
                Err(Errno::EXIST) if attempt < 100 => attempt += 1,
                Err(e) => return Err(e.into()),
            }
        };
        if let Err(e) = rustix::fs::renameat(&dir, temp.as_str(), &dir, name) {
            let _ = rustix::fs::unlinkat(&dir, temp.as_str(), AtFlags::empty());
            return Err(self.refusal(&dir, name, &self.relative, e));
        }
        Ok(File::from(fd))
    }

    /// Opens the file with `flags`, never following a symlink, never
    /// opening what is not a regular file.
    fn open(&self, flags: OFlags, make: bool) -> Result<File, BeneathError> {
        let (dir, name) = self.parent(make)?;
        if let Some(kind) = kind_at(&dir, name)? {
            self.want(kind, FileType::RegularFile, &self.relative)?;
        }
        let flags = flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&dir, name, flags, Mode::from_raw_mode(0o666))
            .map_err(|e| self.refusal(&dir, name, &self.relative, e))?;
        // Looked at again: it may have changed since.
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
        self.want(kind, FileType::RegularFile, &self.relative)?;
        Ok(File::from(fd))
    }

    /// The directory holding the file, opened from the root one component
    /// at a time (each made where missing, with `make`), and its name.
    fn parent(&self, make: bool) -> Result<(OwnedFd, &OsStr), BeneathError> {
        let mut dir = rustix::fs::open(
            &self.root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut parts: Vec<&OsStr> = self.relative.iter().collect();
        let name = parts.pop().unwrap_or_default();
        let mut walked = PathBuf::new();
        for part in parts {
            walked.push(part);
            let mut next = rustix::fs::openat(&dir, part, DIR_FLAGS, Mode::empty());
            if let (Err(Errno::NOENT), true) = (&next, make) {
                match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                next = rustix::fs::openat(&dir, part, DIR_FLAGS, Mode::empty());
            }
            dir = next.map_err(|e| self.refusal(&dir, part, &walked, e))?;
        }
        Ok((dir, name))
    }

    /// Why opening `name` in `dir` (at `walked` beneath the root) failed:
    /// a symlink or another kind of file there is named, else the error.
    fn refusal(&self, dir: &OwnedFd, name: &OsStr, walked: &Path, e: Errno) -> BeneathError {
        let wanted = if walked == self.relative {
            FileType::RegularFile
        } else {
            FileType::Directory
        };
        match kind_at(dir, name) {
            Ok(Some(kind)) if kind != wanted => self
                .want(kind, wanted, walked)
                .err()
                .unwrap_or(BeneathError::from(e)),
            _ => e.into(),
        }
    }

    /// Refuses `kind` at `walked` unless it is `wanted`.
    fn want(&self, kind: FileType, wanted: FileType, walked: &Path) -> Result<(), BeneathError> {
        let path = self.root.join(walked);
        match kind {
            kind if kind == wanted => Ok(()),
            FileType::Symlink => Err(BeneathError::Symlink { link: path }),
            kind => Err(BeneathError::Kind {
                path,
                kind: kind_name(kind),
                wanted: kind_name(wanted),
            }),
        }
    }
}

/// What `name` in `dir` is, not following a symlink; `None` when absent.
fn kind_at(dir: &impl AsFd, name: &OsStr) -> Result<Option<FileType>, BeneathError> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "file of an unknown kind",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beneath(root: &Path, name: &str) -> Result<Beneath, BeneathError> {
        Beneath::new(root, Path::new("suite"), Path::new(name))
    }

    #[test]
    fn a_path_is_refused_when_absolute_or_climbing_out_and_kept_when_its_dots_stay_beneath() {
        let root = Path::new("/repo");
        assert!(matches!(
            beneath(root, "/etc/passwd"),
            Err(BeneathError::Absolute { .. })
        ));
        assert!(matches!(
            beneath(root, "../../x"),
            Err(BeneathError::Escapes { .. })
        ));
        let kept = beneath(root, "../golden/./x.yaml").unwrap();
        assert_eq!(kept.path(), Path::new("/repo/golden/x.yaml"));
    }

    #[test]
    fn a_symlink_on_the_way_or_at_the_end_is_refused_naming_it_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("repo"), dir.path().join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("victim"), "kept").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("linked-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("victim"), root.join("linked-file")).unwrap();
        for (name, link) in [
            ("linked-dir/victim", "linked-dir"),
            ("linked-file", "linked-file"),
        ] {
            let path = Beneath::new(&root, Path::new(""), Path::new(name)).unwrap();
            let e = path.open_to_write().unwrap_err();
            assert!(
                matches!(&e, BeneathError::Symlink { link: l } if l == &root.join(link)),
                "{name}: {e:?}"
            );
            assert!(matches!(path.read(16), Err(BeneathError::Symlink { .. })));
        }
        assert_eq!(
            std::fs::read_to_string(outside.join("victim")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn a_fresh_file_replaces_a_symlink_at_its_name_and_leaves_its_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "kept").unwrap();
        let report = dir.path().join("out/report.xml");
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink(&victim, &report).unwrap();
        let path = Beneath::new(dir.path(), Path::new("out"), Path::new("report.xml")).unwrap();
        std::io::Write::write_all(&mut path.create_fresh().unwrap(), b"<report/>").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "<report/>");
        assert_eq!(
            std::fs::read_dir(dir.path().join("out")).unwrap().count(),
            1
        );
    }

    #[test]
    fn a_fifo_is_refused_unopened_and_a_long_file_is_cut_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let fifo = Beneath::new(dir.path(), Path::new(""), Path::new("fifo")).unwrap();
        let e = fifo.read(16).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("fifo is a FIFO, not a regular file"),
            "{e}"
        );
        std::fs::write(dir.path().join("long"), "x".repeat(17)).unwrap();
        let long = Beneath::new(dir.path(), Path::new(""), Path::new("long")).unwrap();
        assert!(matches!(
            long.read(16),
            Err(BeneathError::TooLarge { max: 16 })
        ));
        assert_eq!(long.read(17).unwrap().len(), 17);
    }
}
