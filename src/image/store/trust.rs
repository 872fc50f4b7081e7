//! Whether a cache dir is xfn's alone: the secure-path walk (as OpenSSH's
//! `safe_path`) run before the cache is used.
//!
//! Invariant: **no uid but xfn's and root can rename or replace an entry on
//! the way to the cache or inside it.** The store names its entries by path
//! (`layers/<hex>`, `refs/…`); whoever can rename one of the directories on
//! that path can swap a layer xfn verified for one of their own, and every
//! later call runs their code. So every directory from `/` down to the
//! cache, both as written and with its symlinks resolved, must be owned by
//! a trusted uid (root, xfn's own, the root of the range xfn maps) and not
//! writable by group or others, except a sticky one (`/tmp`, 1777) whose
//! entry on the way is a trusted uid's (the sticky bit keeps others from
//! renaming it). The cache dir itself and the store's directories in it must
//! be a trusted uid's; a cache dir others may write is taken only when it is
//! xfn's own (it then makes it 0700: `layout`). Directories not yet there
//! are made by xfn, 0700. Called where the cache is opened (`ContentStore::open`,
//! and `userns::enter` before it maps ids: inside the namespace, host
//! root and other uids both show as unmapped and cannot be told apart).
//! As root, xfn takes a cache dir of another owner over (`userns`). In a
//! user namespace that leaves ids unmapped (a pod's), a directory above the
//! cache owned by the overflow uid is taken as the node's: it cannot be
//! told from another unmapped uid there, and no process in the namespace
//! can be either.
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// A cache dir another uid could rename entries in, and why.
#[derive(Debug, thiserror::Error)]
#[error(
    "the cache dir {cache} is not xfn's alone: {dir} {why}, so another uid could rename the \
     cache's entries and replace the code functions run. Use a cache dir that only xfn's uid \
     {own} (or root) can write, e.g. a subdirectory xfn creates (mode 0700) under a directory \
     owned by root or by xfn that others cannot write (--cache-dir)"
)]
pub struct UnsafeCacheDir {
    /// The cache dir.
    pub cache: PathBuf,
    /// The directory that makes it unsafe.
    pub dir: PathBuf,
    /// What is wrong with it.
    pub why: String,
    /// xfn's uid.
    pub own: u32,
}

/// The uids a cache's path may belong to.
#[derive(Debug, Clone)]
pub(crate) struct Trusted {
    /// xfn's effective uid.
    pub(crate) own: u32,
    /// Other uids besides root (the root of a range xfn maps).
    pub(crate) also: Option<u32>,
    /// The uid unmapped owners show as, where this process's user
    /// namespace leaves ids unmapped: trusted above the cache only.
    pub(crate) unmapped: Option<u32>,
}

impl Trusted {
    /// xfn's effective uid and root.
    pub(crate) fn own() -> Self {
        Self {
            own: rustix::process::geteuid().as_raw(),
            also: None,
            unmapped: unmapped_owner(),
        }
    }

    fn trusts(&self, uid: u32) -> bool {
        uid == 0 || uid == self.own || Some(uid) == self.also
    }

    fn trusts_above(&self, uid: u32) -> bool {
        self.trusts(uid) || Some(uid) == self.unmapped
    }
}

/// The overflow uid, where this process's user namespace does not map
/// every id (a pod's with `hostUsers: false`, or a test's); else none.
pub(crate) fn unmapped_owner() -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let all = map
        .split_whitespace()
        .map(str::to_string)
        .collect::<Vec<_>>()
        == ["0", "0", "4294967295"];
    if all {
        return None;
    }
    std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The cache dir checked before entering xfn's namespace, as the path was.
static CHECKED_OUTSIDE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// [`check`] with xfn's ids before it enters its namespace; remembered, so
/// that [`check_at_open`] inside need not (and could not) walk it again.
pub(crate) fn check_before_entering(cache: &Path, trusted: &Trusted) -> Result<(), UnsafeCacheDir> {
    check(cache, trusted)?;
    let _ = CHECKED_OUTSIDE.set(cache.to_path_buf());
    Ok(())
}

/// [`check`] with xfn's own uid, unless this cache dir was checked before
/// entering the namespace. (Another cache dir opened inside is walked
/// there, where host root shows as unmapped and is refused: safe.)
pub(crate) fn check_at_open(cache: &Path) -> Result<(), UnsafeCacheDir> {
    if CHECKED_OUTSIDE
        .get()
        .is_some_and(|checked| checked == cache)
    {
        return Ok(());
    }
    check(cache, &Trusted::own())
}

/// Checks `cache` and the path to it (see the module header).
pub(crate) fn check(cache: &Path, trusted: &Trusted) -> Result<(), UnsafeCacheDir> {
    let unsafe_dir = |dir: &Path, why: String| UnsafeCacheDir {
        cache: cache.to_path_buf(),
        dir: dir.to_path_buf(),
        why,
        own: trusted.own,
    };
    let written = std::path::absolute(cache).map_err(|e| unsafe_dir(cache, e.to_string()))?;
    walk(&written, trusted).map_err(|(dir, why)| unsafe_dir(&dir, why))?;
    // The same with symlinks resolved: the longest prefix that exists,
    // canonicalised, then the rest (made by xfn).
    let mut existing = written.as_path();
    let mut rest = Vec::new();
    while existing.symlink_metadata().is_err() {
        let Some(parent) = existing.parent() else {
            break;
        };
        rest.extend(existing.file_name());
        existing = parent;
    }
    let mut resolved = existing
        .canonicalize()
        .map_err(|e| unsafe_dir(existing, e.to_string()))?;
    resolved.extend(rest.iter().rev());
    walk(&resolved, trusted).map_err(|(dir, why)| unsafe_dir(&dir, why))?;
    // The store's own directories in it (root takes them over: `userns`).
    for dir in super::layout::DIRS.iter().filter(|_| trusted.own != 0) {
        let path = resolved.join(dir);
        if let Ok(meta) = path.symlink_metadata() {
            if !trusted.trusts(meta.uid()) {
                return Err(unsafe_dir(&path, format!("is owned by uid {}", meta.uid())));
            }
        }
    }
    Ok(())
}

/// Walks the absolute `path` from `/` down, to its first missing component.
fn walk(path: &Path, trusted: &Trusted) -> Result<(), (PathBuf, String)> {
    let mut dir = PathBuf::from("/");
    let mut meta = dir.metadata().map_err(|e| (dir.clone(), e.to_string()))?;
    owned(&dir, &meta, trusted, false)?;
    let mut components = path.components().peekable();
    while let Some(component) = components.next() {
        let name = match component {
            Component::Normal(name) => name,
            Component::ParentDir => {
                dir.pop();
                meta = dir.metadata().map_err(|e| (dir.clone(), e.to_string()))?;
                continue;
            }
            _ => continue,
        };
        let child = dir.join(name);
        let Ok(child_meta) = child.symlink_metadata() else {
            // Missing: xfn makes it, private; but in a directory others
            // can write without the sticky bit, they could rename it then.
            let mode = meta.mode();
            if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
                return Err((dir, writable(mode)));
            }
            return Ok(());
        };
        // As root, xfn takes the cache dir over whoever owns it (`userns`
        // hands it to the range root it maps).
        let last = components.peek().is_none();
        let taken_over = last && trusted.own == 0;
        let mode = meta.mode();
        if mode & 0o022 != 0 {
            let sticky = mode & libc::S_ISVTX != 0;
            if !sticky {
                return Err((dir, writable(mode)));
            }
            if !taken_over && !trusted.trusts_above(child_meta.uid()) {
                return Err((
                    child,
                    format!(
                        "is owned by uid {} in a directory others can write (mode {:o})",
                        child_meta.uid(),
                        mode & 0o7777
                    ),
                ));
            }
        }
        // Through a symlink, as the kernel would go.
        meta = child
            .metadata()
            .map_err(|e| (child.clone(), e.to_string()))?;
        if !taken_over {
            owned(&child, &meta, trusted, last)?;
        }
        dir = child;
    }
    // The cache dir itself: others may not write it, unless it is xfn's
    // own (then made 0700 before use), or xfn is root (which takes it over).
    let mode = meta.mode();
    if mode & 0o022 != 0 && meta.uid() != trusted.own && trusted.own != 0 {
        return Err((dir, writable(mode)));
    }
    Ok(())
}

/// Whether `dir` is a trusted uid's (`cache`: the cache dir itself, which
/// an unmapped uid may not own).
fn owned(
    dir: &Path,
    meta: &std::fs::Metadata,
    trusted: &Trusted,
    cache: bool,
) -> Result<(), (PathBuf, String)> {
    let trusts = match cache {
        true => trusted.trusts(meta.uid()),
        false => trusted.trusts_above(meta.uid()),
    };
    if trusts {
        return Ok(());
    }
    Err((
        dir.to_path_buf(),
        format!("is owned by uid {}, not by root or xfn", meta.uid()),
    ))
}

fn writable(mode: u32) -> String {
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "its group and others",
        (true, false) => "its group",
        _ => "others",
    };
    format!(
        "is writable by {who} (mode {:o}) without the sticky bit",
        mode & 0o7777
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A directory the tests build under: root's, 0755, in /tmp (sticky).
    fn base() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        dir
    }

    /// As xfn under uid 65532.
    fn xfn() -> Trusted {
        Trusted {
            own: 65532,
            also: None,
            unmapped: None,
        }
    }

    #[test]
    fn a_private_cache_under_root_owned_dirs_passes_and_missing_dirs_are_xfns_to_make() {
        let base = base();
        let cache = base.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::os::unix::fs::chown(&cache, Some(65532), Some(65532)).unwrap();
        check(&cache, &xfn()).unwrap();
        check(&cache.join("not/yet"), &xfn()).unwrap();
        // Its own cache dir at 0777: xfn makes it 0700 before use.
        chmod(&cache, 0o777);
        check(&cache, &xfn()).unwrap();
    }

    #[test]
    fn a_root_owned_world_writable_cache_dir_is_refused() {
        // What an emptyDir or a shared /var/tmp path looks like.
        let base = base();
        let cache = base.path().join("empty-dir");
        std::fs::create_dir(&cache).unwrap();
        chmod(&cache, 0o777);
        let err = check(&cache, &xfn()).unwrap_err();
        assert_eq!(err.dir, cache);
        assert!(
            err.to_string()
                .contains("is writable by its group and others (mode 777) without the sticky bit"),
            "{err}"
        );
        // And a subdirectory of it, which others can rename.
        let sub = cache.join("xfn");
        std::fs::create_dir(&sub).unwrap();
        std::os::unix::fs::chown(&sub, Some(65532), Some(65532)).unwrap();
        assert_eq!(check(&sub, &xfn()).unwrap_err().dir, cache);
        // So is one not made yet, which xfn would make there.
        let later = cache.join("later");
        assert_eq!(check(&later, &xfn()).unwrap_err().dir, cache);
        assert!(!later.exists());
        // Group-writable alone is refused too.
        chmod(&cache, 0o775);
        assert!(check(&sub, &xfn())
            .unwrap_err()
            .why
            .contains("its group (mode 775)"));
    }

    #[test]
    fn a_sticky_parent_is_fine_when_the_entry_below_it_is_xfns() {
        let base = base();
        let shared = base.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        chmod(&shared, 0o1777);
        let cache = shared.join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::os::unix::fs::chown(&cache, Some(65532), Some(65532)).unwrap();
        check(&cache, &xfn()).unwrap();
        // One xfn makes there is its own, which others cannot rename.
        check(&shared.join("not-yet"), &xfn()).unwrap();
        // Another uid's entry in it is theirs to rename.
        std::os::unix::fs::chown(&cache, Some(4322), Some(4322)).unwrap();
        let err = check(&cache.join("sub"), &xfn()).unwrap_err();
        assert!(
            err.why
                .contains("is owned by uid 4322 in a directory others can write"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_of_another_uid_on_the_way_or_in_the_store_is_refused() {
        let base = base();
        let theirs = base.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4322), Some(4322)).unwrap();
        let err = check(&theirs.join("cache"), &xfn()).unwrap_err();
        assert_eq!(err.dir, theirs);
        assert!(err.why.contains("owned by uid 4322"), "{err}");
        // The range root xfn maps is xfn's.
        let range = Trusted {
            own: 0,
            also: Some(4322),
            unmapped: None,
        };
        check(&theirs.join("cache"), &range).unwrap();

        let cache = base.path().join("cache");
        std::fs::create_dir_all(cache.join("layers")).unwrap();
        std::os::unix::fs::chown(&cache, Some(65532), Some(65532)).unwrap();
        std::os::unix::fs::chown(cache.join("layers"), Some(4322), Some(4322)).unwrap();
        assert_eq!(check(&cache, &xfn()).unwrap_err().dir, cache.join("layers"));
        // In a namespace where 4322 shows as the overflow uid: trusted
        // above the cache, never for the cache itself.
        let in_pod = Trusted {
            unmapped: Some(4322),
            ..xfn()
        };
        check(&theirs.join("cache"), &in_pod).unwrap();
        assert_eq!(check(&theirs, &in_pod).unwrap_err().dir, theirs);
    }

    #[test]
    fn a_symlink_on_the_way_is_checked_where_it_leads() {
        let base = base();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        std::fs::create_dir(open.join("cache")).unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let err = check(&link.join("cache"), &xfn()).unwrap_err();
        assert!(err.why.contains("without the sticky bit"), "{err}");
    }
}
