//! Entry metadata: owners, times, the umask and PAX xattrs.
use std::io::Read;
use std::os::fd::BorrowedFd;

use rustix::fs::{Gid, Timespec, Timestamps, Uid, XattrFlags};

use super::ExtractError;

/// The process umask, read once from /proc/self/status (calling umask(2)
/// to read it would change it under other threads). Unknown: all bits, so
/// modes are always set explicitly.
pub(super) fn process_umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o777)
    })
}

pub(super) fn uid(raw: u32) -> Uid {
    Uid::from_raw(raw)
}

pub(super) fn gid(raw: u32) -> Gid {
    Gid::from_raw(raw)
}

pub(super) fn timestamps(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// An xattr name and value.
pub(super) type Xattr = (Vec<u8>, Vec<u8>);

/// The `SCHILY.xattr.*` PAX records of an entry that are safe to apply:
/// `user.*` except the overlay's own (`user.overlay.*` would let a layer
/// forge opaque dirs or redirects in Overlay mode).
pub(super) fn pax_xattrs<R: Read>(
    item: &mut tar::Entry<'_, R>,
    name: &str,
) -> Result<Vec<Xattr>, ExtractError> {
    let mut out = Vec::new();
    let Some(exts) = item.pax_extensions().map_err(|e| io_err(name, e))? else {
        return Ok(out);
    };
    for ext in exts {
        let ext = ext.map_err(|e| io_err(name, e))?;
        let Some(key) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
            continue;
        };
        if key.starts_with(b"user.") && !key.starts_with(b"user.overlay.") {
            out.push((key.to_vec(), ext.value_bytes().to_vec()));
        } else {
            tracing::debug!(entry = name, xattr = %String::from_utf8_lossy(key), "xattr not applied");
        }
    }
    Ok(out)
}

pub(super) fn set_xattrs(fd: BorrowedFd<'_>, xattrs: &[Xattr], name: &str) {
    for (key, value) in xattrs {
        if let Err(e) = rustix::fs::fsetxattr(fd, key.as_slice(), value, XattrFlags::empty()) {
            // Optional: a filesystem without user xattrs loses them.
            tracing::debug!(entry = name, error = %e, "xattr not applied");
        }
    }
}

/// An I/O error on the layer entry named `entry`.
pub(super) fn io_err(entry: &str, source: std::io::Error) -> ExtractError {
    ExtractError::Io {
        entry: entry.to_owned(),
        source,
    }
}
