//! Subordinate ids (`/etc/subuid`, `/etc/subgid`) an unprivileged xfn may
//! map with the setuid helpers `newuidmap` and `newgidmap` (Debian package
//! `uidmap`), so that its functions run under host ids that are not its own
//! (see `userns.rs` for the layout and why).
//!
//! Whether the helpers can work is decided here, before xfn unshares: once
//! it has, a failed helper would leave it in a namespace with no map.
//! `newuidmap` needs, besides an entry for xfn's user: a passwd entry for
//! xfn's uid (it looks the name up), the setuid bit (or file capabilities)
//! honoured (no `no_new_privs`: Kubernetes' `allowPrivilegeEscalation:
//! false` sets it), and CAP_SETUID/CAP_SETGID left in the bounding set (a
//! container with every capability dropped cannot give them to the helper).
use std::ffi::CStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Fewest subordinate ids worth using: functions get container ids 0 to
/// count-1, one to one, and `65532` (distroless `nonroot`) must be one.
pub(crate) const MIN_COUNT: u32 = 65536;

/// The subordinate ids xfn maps: host ids `uid..uid+count` and
/// `gid..gid+count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubIds {
    /// First subordinate uid.
    pub(crate) uid: u32,
    /// First subordinate gid.
    pub(crate) gid: u32,
    /// How many of each (the smaller of the two ranges, at most
    /// [`MIN_COUNT`]: functions use no more).
    pub(crate) count: u32,
    /// `newuidmap`.
    pub(crate) newuidmap: PathBuf,
    /// `newgidmap`.
    pub(crate) newgidmap: PathBuf,
}

/// Where the helpers are looked for (Debian installs them in /usr/bin).
const HELPER_DIRS: [&str; 3] = ["/usr/bin", "/usr/sbin", "/bin"];

/// The subordinate ids this process may map, or why none.
pub(crate) fn detect(uid: u32) -> Result<SubIds, String> {
    let name = user_name(uid).ok_or_else(|| {
        format!("uid {uid} has no passwd entry (newuidmap looks the user's name up)")
    })?;
    let sub_uid = read_range(Path::new("/etc/subuid"), &name, uid)?;
    let sub_gid = read_range(Path::new("/etc/subgid"), &name, uid)?;
    let newuidmap = helper("newuidmap")?;
    let newgidmap = helper("newgidmap")?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if status_field(&status, "NoNewPrivs") == Some("1") {
        return Err("no_new_privs is set (allowPrivilegeEscalation: false), so the setuid newuidmap cannot map them".into());
    }
    use caps::{has_cap, CapSet, Capability};
    let bounded = |cap| has_cap(None, CapSet::Bounding, cap).unwrap_or(false);
    if !bounded(Capability::CAP_SETUID) || !bounded(Capability::CAP_SETGID) {
        return Err("CAP_SETUID/CAP_SETGID are not in the bounding set (capabilities dropped), so newuidmap cannot map them".into());
    }
    Ok(SubIds {
        uid: sub_uid.0,
        gid: sub_gid.0,
        count: sub_uid.1.min(sub_gid.1).min(MIN_COUNT),
        newuidmap,
        newgidmap,
    })
}

/// The first entry of `file` for `name` (or the uid written as a number)
/// with at least [`MIN_COUNT`] ids: `(start, count)`.
fn read_range(file: &Path, name: &str, uid: u32) -> Result<(u32, u32), String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    parse_range(&text, name, uid).ok_or_else(|| {
        format!(
            "{} has no entry of {MIN_COUNT} or more ids for {name} (uid {uid})",
            file.display()
        )
    })
}

fn parse_range(text: &str, name: &str, uid: u32) -> Option<(u32, u32)> {
    let uid = uid.to_string();
    text.lines().find_map(|line| {
        let mut fields = line.trim().split(':');
        let (owner, start, count) = (fields.next()?, fields.next()?, fields.next()?);
        if owner != name && owner != uid {
            return None;
        }
        let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
        // The last id must exist: start + count - 1 fits a u32 below -1.
        let fits = start.checked_add(count).is_some_and(|end| end < u32::MAX);
        (count >= MIN_COUNT && fits && start > 0).then_some((start, count))
    })
}

/// A helper that can raise privileges: setuid root or with file capabilities.
fn helper(name: &str) -> Result<PathBuf, String> {
    for dir in HELPER_DIRS {
        let path = Path::new(dir).join(name);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        let setuid_root = meta.permissions().mode() & 0o4000 != 0 && meta.uid() == 0;
        let file_caps = xattr_present(&path, c"security.capability");
        if setuid_root || file_caps {
            return Ok(path);
        }
        return Err(format!(
            "{} is neither setuid root nor has file capabilities",
            path.display()
        ));
    }
    Err(format!("{name} is not installed (Debian package uidmap)"))
}

fn xattr_present(path: &Path, name: &CStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: both are NUL-terminated strings that outlive the call; a null
    // buffer of size 0 asks only for the value's size.
    unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|user| user.name)
}

fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':').map(str::trim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_found_by_name_or_uid_and_must_hold_65536_ids() {
        let text = "other:100000:65536\nxfn:200000:1000\nxfn:300000:65536\n";
        assert_eq!(parse_range(text, "xfn", 4321), Some((300000, 65536)));
        assert_eq!(
            parse_range("4321:400000:131072\n", "xfn", 4321),
            Some((400000, 131072))
        );
        assert_eq!(parse_range(text, "nobody", 1), None);
        assert_eq!(parse_range("xfn:0:65536\n", "xfn", 1), None, "host root");
        assert_eq!(parse_range("xfn:4294967000:65536\n", "xfn", 1), None);
        assert_eq!(parse_range("xfn:x:65536\nbroken\n", "xfn", 1), None);
    }

    #[test]
    fn status_fields_are_read_by_name() {
        let status = "Name:\txfn\nNoNewPrivs:\t1\nCapBnd:\t000001ffffffffff\n";
        assert_eq!(status_field(status, "NoNewPrivs"), Some("1"));
        assert_eq!(status_field(status, "CapBnd"), Some("000001ffffffffff"));
        assert_eq!(status_field(status, "Cap"), None);
    }
}
