//! Resolving an image config's `User` (`name`, `uid`, `name:group`,
//! `uid:gid`, …) against the image's own /etc/passwd and /etc/group, and
//! mapping the ids it names into the run's user namespace.
//!
//! Choice: **the image's ids are mapped onto the ids xfn has for its
//! functions** (`userns.rs`). Each run has a user namespace of its own
//! whose ids are xfn's (spec.rs). Where xfn has spare ids (a privileged
//! range, or subordinate ids), never its own id 0: container ids
//! `0..count` map one to one onto xfn's ids `1..=count` (65535 of a
//! privileged range, 65536 subordinate ones), so `User: 65532` is container
//! uid 65532 under a host uid that is not xfn's, and an id past them is
//! refused. Without spare ids (the unprivileged sidecar without
//! /etc/subuid) xfn has one id: the run's namespace then maps the *image's*
//! uid and gid onto it rather than 0, so a `nonroot` image (distroless
//! `65532:65532`, `1000`) runs as the user it names instead of failing with
//! "cannot setresgid".
//!
//! An id of 4294967295 (`(uid_t)-1`) is refused, never passed on:
//! `setresuid(-1, …)` means "leave unchanged", so the function would keep
//! the runtime's root.
//!
//! /etc/passwd and /etc/group are read inside the image's rootfs, never the
//! host's, and bounded by [`MAX_USER_DB`].
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/sandbox/user.rs`.
use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::userns::FunctionIds;

/// Errors of user resolution.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The user is not in the image's /etc/passwd.
    #[error("image user {user:?} is not in the image's /etc/passwd")]
    UnknownUser {
        /// The name asked for.
        user: String,
    },
    /// The group is not in the image's /etc/group.
    #[error("image group {group:?} is not in the image's /etc/group")]
    UnknownGroup {
        /// The name asked for.
        group: String,
    },
    /// The User field is malformed.
    #[error("image user {0:?} is malformed; expected user, uid, user:group or uid:gid")]
    Malformed(String),
    /// An id is `(uid_t)-1`, which the kernel reads as "unchanged".
    #[error("image user {user:?}: {id} is not a user or group id ((uid_t)-1 means \"leave unchanged\" to the kernel, so the function would keep root)")]
    InvalidId {
        /// The User field.
        user: String,
        /// The id.
        id: u32,
    },
    /// The image's /etc/passwd or /etc/group is larger than xfn reads.
    #[error("the image's /{file} is larger than {limit} bytes, the most xfn reads of a user database; rebuild the image with a smaller one")]
    TooLarge {
        /// The file, relative to the rootfs.
        file: &'static str,
        /// The bound.
        limit: u64,
    },
    /// The image's /etc/passwd or /etc/group exists but cannot be read.
    #[error("cannot read the image's /{file}")]
    Read {
        /// The file, relative to the rootfs.
        file: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// An id is outside the range xfn's namespace maps.
    #[error("image user {user:?}: id {id} is outside the {mapped} ids xfn maps (0-{}); rebuild the image with an id below {mapped}", mapped - 1)]
    Unmappable {
        /// The User field.
        user: String,
        /// The id.
        id: u32,
        /// How many ids xfn maps.
        mapped: u32,
    },
}

/// The ids a container process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedUser {
    /// User id.
    pub(crate) uid: u32,
    /// Primary group id.
    pub(crate) gid: u32,
    /// Supplementary groups (from /etc/group membership when named by name).
    pub(crate) additional_gids: Vec<u32>,
    /// The user's home directory: its /etc/passwd entry's, else `/` (as
    /// runc, and so Docker and Kubernetes, set `HOME`).
    pub(crate) home: String,
}

/// Resolves `spec` (the image config's `User`) against the rootfs at `rootfs`.
/// Empty means root. A numeric uid that is not in /etc/passwd is allowed
/// (with gid 0 unless given), as Docker does; a name must exist.
pub(crate) fn resolve(spec: &str, rootfs: &Path) -> Result<ResolvedUser, UserError> {
    let spec = spec.trim();
    if spec.is_empty() {
        // Root: only its home is looked up, and an image whose user
        // database cannot be read still runs (with `/`), as before.
        let mut home = None;
        if let Ok(root) = open_root(rootfs) {
            let _ = scan_image_file(&root, PASSWD, |line| {
                home = parse_passwd_line(line)
                    .filter(|e| e.uid == 0)
                    .map(|e| e.home);
                home.is_none()
            });
        }
        return Ok(ResolvedUser {
            uid: 0,
            gid: 0,
            additional_gids: Vec::new(),
            home: home.flatten().unwrap_or_else(|| "/".into()),
        });
    }
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() || group.is_some_and(|g| g.is_empty() || g.contains(':')) {
        return Err(UserError::Malformed(spec.to_string()));
    }
    let root = open_root(rootfs)?;
    let uid_asked = user.parse::<u32>().ok();
    let mut entry = None;
    scan_image_file(&root, PASSWD, |line| {
        entry = parse_passwd_line(line).filter(|e| match uid_asked {
            Some(uid) => e.uid == uid,
            None => e.name == user,
        });
        entry.is_none()
    })?;
    let (uid, mut gid, name, home) = match (entry, uid_asked) {
        (Some(e), _) => (e.uid, e.gid, Some(e.name), e.home),
        (None, Some(uid)) => (uid, 0, None, None),
        (None, None) => {
            return Err(UserError::UnknownUser {
                user: user.to_string(),
            })
        }
    };
    let group_gid = group.and_then(|g| g.parse::<u32>().ok());
    let mut named_group = None;
    let mut memberships = Vec::new();
    // Memberships count only where no group is named (as Docker does).
    let member = name.as_deref().filter(|n| group.is_none() && !n.is_empty());
    if (group.is_some() && group_gid.is_none()) || member.is_some() {
        scan_image_file(&root, GROUP, |line| {
            let Some(g) = parse_group_line(line) else {
                return true;
            };
            if named_group.is_none() && group.is_some_and(|n| n.as_bytes() == g.name) {
                named_group = Some(g.gid);
            }
            if let Some(member) = member {
                if g.members
                    .split(|&b| b == b',')
                    .any(|m| m == member.as_bytes())
                {
                    memberships.push(g.gid);
                }
            }
            true
        })?;
    }
    if let Some(group) = group {
        gid = match group_gid.or(named_group) {
            Some(gid) => gid,
            None => {
                return Err(UserError::UnknownGroup {
                    group: group.to_string(),
                })
            }
        };
    }
    let additional_gids: Vec<u32> = memberships.into_iter().filter(|&g| g != gid).collect();
    for id in [uid, gid]
        .into_iter()
        .chain(additional_gids.iter().copied())
    {
        if id == u32::MAX {
            return Err(UserError::InvalidId {
                user: spec.to_string(),
                id,
            });
        }
    }
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids,
        home: home.unwrap_or_else(|| "/".into()),
    })
}

/// A resolved user as the run's namespace sees it: the ids the process
/// takes and the uid and gid maps that make them exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MappedUser {
    /// The ids the function runs as (supplementary groups dropped where
    /// they cannot be mapped).
    pub(crate) user: ResolvedUser,
    /// The container uid that the run's first id (`host_base`) is.
    pub(crate) uid_base: u32,
    /// The container gid that the run's first id is.
    pub(crate) gid_base: u32,
    /// The id of xfn's namespace the maps start at: 0 (xfn's own) or 1
    /// (the first of the functions' ids).
    pub(crate) host_base: u32,
    /// How many ids each map maps.
    pub(crate) size: u32,
}

/// Maps `resolved` into a run's namespace over the functions' ids of xfn's
/// namespace (`userns::FunctionIds`: xfn's own id, or spare ids from 1),
/// as the module header says. `spec` is the User field, for errors.
pub(crate) fn map(
    spec: &str,
    resolved: ResolvedUser,
    ids: FunctionIds,
) -> Result<MappedUser, UserError> {
    let count = match ids {
        FunctionIds::Own => {
            return Ok(MappedUser {
                uid_base: resolved.uid,
                gid_base: resolved.gid,
                host_base: 0,
                size: 1,
                user: ResolvedUser {
                    additional_gids: Vec::new(),
                    ..resolved
                },
            })
        }
        FunctionIds::Spare { count } => count,
    };
    let ids = [resolved.uid, resolved.gid];
    if let Some(&id) = ids
        .iter()
        .chain(&resolved.additional_gids)
        .find(|&&id| id >= count)
    {
        return Err(UserError::Unmappable {
            user: spec.trim().to_string(),
            id,
            mapped: count,
        });
    }
    Ok(MappedUser {
        uid_base: 0,
        gid_base: 0,
        host_base: 1,
        size: count,
        user: resolved,
    })
}

/// The most bytes of an image's /etc/passwd or /etc/group xfn reads: a
/// distribution's are a few KiB; past this the image is refused.
pub(crate) const MAX_USER_DB: u64 = 4 << 20;

const PASSWD: &str = "etc/passwd";
const GROUP: &str = "etc/group";

fn open_root(rootfs: &Path) -> Result<OwnedFd, UserError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::open(rootfs, flags, Mode::empty()).map_err(|e| UserError::Read {
        file: PASSWD,
        source: e.into(),
    })
}

/// Opens `relative` (no leading `/`) of the rootfs `root` for reading,
/// resolving every symlink inside the rootfs (see the header); `None` when
/// it is absent, not a regular file, or reached only through a symlink
/// where openat2 is refused.
fn open_image_file(root: &OwnedFd, relative: &str) -> Result<Option<std::fs::File>, Errno> {
    // Non-blocking: a FIFO in the image must not hang the daemon.
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
    let opened = match rustix::fs::openat2(root, relative, flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS) | Err(Errno::PERM) => open_without_symlinks(root, relative, flags),
        other => other,
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::XDEV | Errno::ACCESS) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if rustix::fs::fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    Ok(Some(std::fs::File::from(fd)))
}

/// The fallback of [`open_image_file`]: one component at a time, never
/// following a symlink (`ELOOP`/`ENOTDIR`: absent).
fn open_without_symlinks(root: &OwnedFd, relative: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let (dirs, file) = relative.rsplit_once('/').unwrap_or(("", relative));
    let mut dir = rustix::fs::openat(root, ".", dir_flags, Mode::empty())?;
    for comp in dirs.split('/').filter(|c| !c.is_empty()) {
        dir = rustix::fs::openat(&dir, comp, dir_flags, Mode::empty())?;
    }
    rustix::fs::openat(&dir, file, flags | OFlags::NOFOLLOW, Mode::empty())
}

/// Feeds the lines of the image's `relative` to `line` until it returns
/// false or the file ends; an absent file has no lines. Refuses a file
/// past [`MAX_USER_DB`] before reading it, and stops reading there if it
/// grows meanwhile: memory is one line, at most the bound.
fn scan_image_file(
    root: &OwnedFd,
    relative: &'static str,
    mut line: impl FnMut(&[u8]) -> bool,
) -> Result<(), UserError> {
    let read_err = |source: std::io::Error| UserError::Read {
        file: relative,
        source,
    };
    let too_large = UserError::TooLarge {
        file: relative,
        limit: MAX_USER_DB,
    };
    let Some(file) = open_image_file(root, relative).map_err(|e| read_err(e.into()))? else {
        return Ok(());
    };
    if file.metadata().map_err(read_err)?.len() > MAX_USER_DB {
        return Err(too_large);
    }
    let mut reader = BufReader::new(file.take(MAX_USER_DB + 1));
    let (mut buf, mut total) = (Vec::new(), 0u64);
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
        total += n as u64;
        if total > MAX_USER_DB {
            return Err(too_large);
        }
        let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if n == 0 || !line(text.strip_suffix(b"\r").unwrap_or(text)) {
            return Ok(());
        }
    }
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    /// An absolute home directory, when the entry names one.
    home: Option<String>,
}

fn parse_passwd_line(line: &[u8]) -> Option<PasswdEntry> {
    if line.starts_with(b"#") {
        return None;
    }
    let mut fields = line.split(|&b| b == b':');
    let name = fields.next()?;
    let _password = fields.next()?;
    let uid = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let gid = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let _gecos = fields.next();
    let home = fields
        .next()
        .and_then(|h| std::str::from_utf8(h).ok())
        .filter(|h| h.starts_with('/'))
        .map(String::from);
    Some(PasswdEntry {
        name: String::from_utf8(name.to_vec()).ok()?,
        uid,
        gid,
        home,
    })
}

struct GroupEntry<'a> {
    name: &'a [u8],
    gid: u32,
    members: &'a [u8],
}

fn parse_group_line(line: &[u8]) -> Option<GroupEntry<'_>> {
    if line.starts_with(b"#") {
        return None;
    }
    let mut fields = line.split(|&b| b == b':');
    let name = fields.next()?;
    let _password = fields.next()?;
    let gid = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    Some(GroupEntry {
        name,
        gid,
        members: fields.next().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n# comment\nfn:x:1000:1001::/home/fn:/bin/sh\nbroken\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\nfns:x:1001:\nextra:x:2000:fn,other\nwheel:x:10:\n",
        )
        .unwrap();
        dir
    }

    fn ids(spec: &str) -> (u32, u32, Vec<u32>) {
        let r = resolve(spec, rootfs().path()).unwrap();
        (r.uid, r.gid, r.additional_gids)
    }

    #[test]
    fn forms() {
        assert_eq!(ids(""), (0, 0, vec![]));
        assert_eq!(ids("root"), (0, 0, vec![]));
        assert_eq!(ids("fn"), (1000, 1001, vec![2000]));
        assert_eq!(ids("1000"), (1000, 1001, vec![2000]));
        assert_eq!(ids("4242"), (4242, 0, vec![]));
        assert_eq!(ids("fn:wheel"), (1000, 10, vec![]));
        assert_eq!(ids("fn:77"), (1000, 77, vec![]));
        assert_eq!(ids("4242:4343"), (4242, 4343, vec![]));
        assert_eq!(ids("4242:fns"), (4242, 1001, vec![]));
    }

    #[test]
    fn the_home_is_the_users_passwd_entrys_else_the_root_directory() {
        let home = |spec: &str| resolve(spec, rootfs().path()).unwrap().home;
        assert_eq!(home(""), "/root");
        assert_eq!(home("fn"), "/home/fn");
        assert_eq!(home("1000:77"), "/home/fn");
        assert_eq!(home("65532"), "/", "a uid with no entry");
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(resolve("", bare.path()).unwrap().home, "/", "no passwd");
    }

    #[test]
    fn unknown_names_are_errors() {
        let dir = rootfs();
        assert!(matches!(
            resolve("nobody", dir.path()),
            Err(UserError::UnknownUser { .. })
        ));
        assert!(matches!(
            resolve("fn:nogroup", dir.path()),
            Err(UserError::UnknownGroup { .. })
        ));
        for bad in [":1", "1:", "1:2:3"] {
            assert!(
                matches!(resolve(bad, dir.path()), Err(UserError::Malformed(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_id_of_minus_one_is_refused_not_read_as_unchanged() {
        let dir = rootfs();
        for spec in [
            "4294967295",
            "4294967295:0",
            "0:4294967295",
            "fn:4294967295",
        ] {
            assert!(
                matches!(
                    resolve(spec, dir.path()),
                    Err(UserError::InvalidId { id: u32::MAX, .. })
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn xfns_one_id_becomes_the_image_user_and_its_groups_are_dropped() {
        let fn_user = resolve("fn", rootfs().path()).unwrap();
        let mapped = map("fn", fn_user, FunctionIds::Own).unwrap();
        assert_eq!(
            (
                mapped.uid_base,
                mapped.gid_base,
                mapped.host_base,
                mapped.size
            ),
            (1000, 1001, 0, 1)
        );
        assert_eq!(
            (
                mapped.user.uid,
                mapped.user.gid,
                mapped.user.additional_gids
            ),
            (1000, 1001, vec![])
        );
        let root = map("", resolve("", rootfs().path()).unwrap(), FunctionIds::Own).unwrap();
        assert_eq!((root.uid_base, root.gid_base, root.size), (0, 0, 1));
    }

    #[test]
    fn spare_ids_map_image_users_one_to_one_past_xfns_own_and_refuse_ids_past_them() {
        let spare = FunctionIds::Spare { count: 65535 };
        let fn_user = resolve("fn", rootfs().path()).unwrap();
        let mapped = map("fn", fn_user.clone(), spare).unwrap();
        assert_eq!(
            (
                mapped.uid_base,
                mapped.gid_base,
                mapped.host_base,
                mapped.size
            ),
            (0, 0, 1, 65535)
        );
        assert_eq!(mapped.user, fn_user);
        for spec in ["65535", "0:70000", "fn:65535"] {
            let resolved = resolve(spec, rootfs().path()).unwrap();
            assert!(
                matches!(
                    map(spec, resolved, spare),
                    Err(UserError::Unmappable { mapped: 65535, .. })
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn symlinked_passwd_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("etc/passwd")).unwrap();
        assert!(matches!(
            resolve("root", dir.path()),
            Err(UserError::UnknownUser { .. })
        ));
    }

    #[test]
    fn an_etc_that_is_a_symlink_to_etc_is_the_images_not_the_hosts() {
        // The attack: the host's /etc/passwd names `daemon`; the image has
        // no user database, only `/etc -> /etc`.
        let host = std::fs::read_to_string("/etc/passwd").unwrap();
        assert!(host.lines().any(|l| l.starts_with("daemon:")), "{host}");
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        assert!(matches!(
            resolve("daemon", dir.path()),
            Err(UserError::UnknownUser { .. })
        ));
        // An absolute symlink inside the image is followed inside it.
        let dir = rootfs();
        std::fs::rename(dir.path().join("etc"), dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("/real", dir.path().join("etc")).unwrap();
        assert_eq!(resolve("fn", dir.path()).unwrap().uid, 1000);
        // As is one out of it, clamped to the rootfs: `../../real`.
        std::fs::remove_file(dir.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("../../../real", dir.path().join("etc")).unwrap();
        assert_eq!(resolve("fn", dir.path()).unwrap().uid, 1000);
    }

    #[test]
    fn the_fallback_without_openat2_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        let root = open_root(dir.path()).unwrap();
        let flags = OFlags::RDONLY | OFlags::CLOEXEC;
        assert_eq!(
            open_without_symlinks(&root, PASSWD, flags).err(),
            Some(Errno::NOTDIR)
        );
        let dir = rootfs();
        let root = open_root(dir.path()).unwrap();
        assert!(open_without_symlinks(&root, PASSWD, flags).is_ok());
    }

    #[test]
    fn a_user_database_past_the_bound_is_refused_before_it_is_read() {
        let dir = rootfs();
        let passwd = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("etc/passwd"))
            .unwrap();
        passwd.set_len(MAX_USER_DB + 1).unwrap();
        let err = resolve("fn", dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                UserError::TooLarge {
                    file: "etc/passwd",
                    limit: MAX_USER_DB
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("/etc/passwd is larger than 4194304 bytes"),
            "{err}"
        );
        // A group file alike, read only when a name needs it.
        let dir = rootfs();
        let group = std::fs::File::options()
            .write(true)
            .open(dir.path().join("etc/group"))
            .unwrap();
        group.set_len(64 << 20).unwrap();
        assert_eq!(resolve("4242:4343", dir.path()).unwrap().gid, 4343);
        assert!(matches!(
            resolve("fn", dir.path()),
            Err(UserError::TooLarge {
                file: "etc/group",
                ..
            })
        ));
    }

    #[test]
    fn a_user_database_at_the_bound_is_read_line_by_line() {
        let dir = rootfs();
        let mut text = std::fs::read_to_string(dir.path().join("etc/passwd")).unwrap();
        let filler = "x".repeat(1000) + "\n";
        while text.len() + filler.len() + 30 < MAX_USER_DB as usize {
            text.push_str(&filler);
        }
        text.push_str("last:x:7:7::/:/bin/sh\n");
        std::fs::write(dir.path().join("etc/passwd"), &text).unwrap();
        let last = resolve("last", dir.path()).unwrap();
        assert_eq!((last.uid, last.gid), (7, 7));
    }

    #[test]
    fn a_fifo_for_passwd_counts_as_absent_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        assert_eq!(resolve("7", dir.path()).unwrap().uid, 7);
    }
}
