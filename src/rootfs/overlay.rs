//! Mounting and unmounting the per-run overlay, and the support probe.
//!
//! # Many layers versus the one-page option limit
//! `mount(2)` takes its options in one page (4096 bytes): 256 layer paths of
//! ~100 bytes each do not fit. So the overlay is mounted with the new mount
//! API (`fsopen` / `fsconfig("lowerdir+", …)` per layer / `fsmount` /
//! `move_mount`, Linux ≥ 6.8), where every layer is its own call and the page
//! limit does not apply. On older kernels the options go through `mount(2)`:
//! as absolute paths when they fit, else as short relative names (`l/0`,
//! `l/1`, …, symlinks to the layer dirs in the run's tmpfs) resolved against
//! the run dir as working directory — set by a helper thread that first
//! unshares its filesystem context (`unshare(CLONE_FS)`), so the process's
//! own cwd never changes under its other threads.
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::CWD;

use super::tmpfs_inodes;
use rustix::io::Errno;
use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MoveMountFlags, UnmountFlags,
};

/// Longest option string `mount(2)` takes (one page, with its NUL).
const MOUNT_DATA_MAX: usize = 4095;

/// Paths of one overlay mount.
pub(crate) struct OverlaySpec<'a> {
    /// Lower dirs, bottom layer first (as the image lists them).
    pub(crate) layers: &'a [PathBuf],
    /// The upper dir (on the run's tmpfs).
    pub(crate) upper: &'a Path,
    /// The work dir (same filesystem as `upper`).
    pub(crate) work: &'a Path,
    /// Where to mount it.
    pub(crate) target: &'a Path,
    /// The run's tmpfs, holding `upper` and `work` (and, when needed, the
    /// short-name symlinks `l/<n>`).
    pub(crate) run_dir: &'a Path,
    /// Skip the new mount API (old kernels' path; tests).
    pub(crate) legacy: bool,
}

/// Mounts a tmpfs at `target` (nosuid, nodev) of at most `size` bytes and
/// [`tmpfs_inodes`]`(size)` files, or of the kernel's default size.
pub(crate) fn mount_tmpfs(target: &Path, size: Option<u64>) -> io::Result<()> {
    let data = match size {
        Some(size) => format!("size={size},nr_inodes={},mode=0755", tmpfs_inodes(size)),
        None => "mode=0755".to_string(),
    };
    let data = CString::new(data).map_err(io::Error::other)?;
    rustix::mount::mount(
        "tmpfs",
        target,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(data.as_c_str()),
    )?;
    Ok(())
}

/// Resizes the tmpfs at `target` to what it holds now plus `allowance`
/// bytes, and its inode count to the files it holds plus
/// [`tmpfs_inodes`]`(allowance)`.
pub(crate) fn bound_tmpfs(target: &Path, allowance: u64) -> io::Result<()> {
    let st = rustix::fs::statvfs(target)?;
    let used_bytes = st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize;
    let used_inodes = st.f_files.saturating_sub(st.f_ffree);
    let data = format!(
        "size={},nr_inodes={}",
        used_bytes.saturating_add(allowance),
        used_inodes.saturating_add(tmpfs_inodes(allowance))
    );
    rustix::mount::mount_remount(
        target,
        MountFlags::NOSUID | MountFlags::NODEV,
        data.as_str(),
    )?;
    Ok(())
}

/// Mounts the overlay described by `spec`.
pub(crate) fn mount_overlay(spec: &OverlaySpec<'_>) -> io::Result<()> {
    if spec.layers.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an overlay needs at least one layer",
        ));
    }
    if !spec.legacy {
        match mount_with_fsconfig(spec) {
            Ok(()) => return Ok(()),
            Err(NewApi::Failed(e)) => return Err(e),
            // No new mount API, or no `lowerdir+` (Linux < 6.8).
            Err(NewApi::Unsupported) => {
                tracing::debug!("new mount API without lowerdir+: using mount(2)");
            }
        }
    }
    mount_legacy(spec)
}

/// Why the new mount API did not mount.
enum NewApi {
    /// It cannot do it on this kernel: mount(2) may.
    Unsupported,
    /// It can, and the mount itself failed (with the kernel's words).
    Failed(io::Error),
}

fn mount_with_fsconfig(spec: &OverlaySpec<'_>) -> Result<(), NewApi> {
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC).map_err(|_| NewApi::Unsupported)?;
    let mut layers = spec.layers.iter().rev();
    if let Some(top) = layers.next() {
        // `lowerdir+` unknown: a kernel before 6.8.
        fsconfig_set_string(&fs, "lowerdir+", top.as_path()).map_err(|e| match e {
            Errno::INVAL => NewApi::Unsupported,
            e => failed(&fs, "lowerdir+", top, e),
        })?;
    }
    for layer in layers {
        fsconfig_set_string(&fs, "lowerdir+", layer.as_path())
            .map_err(|e| failed(&fs, "lowerdir+", layer, e))?;
    }
    fsconfig_set_string(&fs, "upperdir", spec.upper)
        .map_err(|e| failed(&fs, "upperdir", spec.upper, e))?;
    fsconfig_set_string(&fs, "workdir", spec.work)
        .map_err(|e| failed(&fs, "workdir", spec.work, e))?;
    fsconfig_set_flag(&fs, "userxattr").map_err(|e| failed(&fs, "userxattr", Path::new(""), e))?;
    fsconfig_create(&fs).map_err(|e| failed(&fs, "create", Path::new(""), e))?;
    let mnt = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())
        .map_err(|e| failed(&fs, "fsmount", Path::new(""), e))?;
    move_mount(
        &mnt,
        "",
        CWD,
        spec.target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| failed(&fs, "move_mount to", spec.target, e))
}

fn failed(fs: &std::os::fd::OwnedFd, step: &str, path: &Path, e: Errno) -> NewApi {
    let detail = fs_messages(fs);
    NewApi::Failed(io::Error::new(
        io::Error::from(e).kind(),
        format!("overlay {step} {}: {e} {detail}", path.display())
            .trim_end()
            .to_string(),
    ))
}

/// The kernel's messages queued on an fs context fd (`e overlay: …`).
fn fs_messages(fs: &std::os::fd::OwnedFd) -> String {
    let mut out = String::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = rustix::io::read(fs, &mut buf) {
        if n == 0 {
            break;
        }
        out.push_str(&String::from_utf8_lossy(&buf[..n]));
        out.push(' ');
    }
    out
}

fn mount_legacy(spec: &OverlaySpec<'_>) -> io::Result<()> {
    let bytes = |p: &'_ Path| p.as_os_str().as_bytes().to_vec();
    let absolute: Vec<Vec<u8>> = spec.layers.iter().rev().map(|p| bytes(p)).collect();
    let (upper, work) = (bytes(spec.upper), bytes(spec.work));
    let data = overlay_data(&absolute, &upper, &work);
    let plain = absolute.iter().chain([&upper, &work]).all(|p| is_plain(p));
    if data.len() <= MOUNT_DATA_MAX && plain {
        return mount_data(spec.target, data);
    }
    // Too long, or with characters the option parser splits on: short
    // relative names (symlinks `l/<n>` to the layers, and the upper and
    // work dirs' own names), resolved from the run dir as working dir.
    let relative = |p: &Path| -> io::Result<Vec<u8>> {
        p.strip_prefix(spec.run_dir)
            .map(bytes)
            .ok()
            .filter(|r| is_plain(r))
            .ok_or_else(|| {
                io::Error::other(format!(
                    "{} is not a plain name in the run dir",
                    p.display()
                ))
            })
    };
    let (upper, work) = (relative(spec.upper)?, relative(spec.work)?);
    let links = spec.run_dir.join("l");
    std::fs::create_dir(&links)?;
    let mut names = Vec::with_capacity(spec.layers.len());
    for (i, layer) in spec.layers.iter().rev().enumerate() {
        std::os::unix::fs::symlink(layer, links.join(format!("{i:x}")))?;
        names.push(format!("l/{i:x}").into_bytes());
    }
    let data = overlay_data(&names, &upper, &work);
    if data.len() > MOUNT_DATA_MAX {
        return Err(io::Error::other(format!(
            "overlay options of {} layers exceed one page even with short names",
            spec.layers.len()
        )));
    }
    let base = spec.run_dir.to_path_buf();
    let target = spec.target.to_path_buf();
    // The chdir happens in a thread with its own fs context.
    std::thread::scope(|s| {
        s.spawn(move || -> io::Result<()> {
            // SAFETY: rustix marks unshare unsafe because unsharing CLONE_FS
            // changes what other code in this thread assumes of its fs
            // context; this scoped thread runs only the chdir and mount
            // below, which want exactly that.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }?;
            std::env::set_current_dir(&base)?;
            mount_data(&target, data)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("overlay mount thread panicked")))
    })
}

/// Whether a path can stand in mount(2)'s overlay options as it is (the
/// parser splits on `,` and `:` and treats `\` as an escape).
fn is_plain(path: &[u8]) -> bool {
    !path.iter().any(|b| matches!(b, b',' | b':' | b'\\'))
}

fn overlay_data(lowers: &[Vec<u8>], upper: &[u8], work: &[u8]) -> Vec<u8> {
    let mut data = b"lowerdir=".to_vec();
    data.extend_from_slice(&lowers.join(&b':'));
    for (key, value) in [(&b",upperdir="[..], upper), (b",workdir=", work)] {
        data.extend_from_slice(key);
        data.extend_from_slice(value);
    }
    data.extend_from_slice(b",userxattr");
    data
}

fn mount_data(target: &Path, data: Vec<u8>) -> io::Result<()> {
    let data = CString::new(data).map_err(io::Error::other)?;
    rustix::mount::mount(
        "overlay",
        target,
        "overlay",
        MountFlags::empty(),
        Some(data.as_c_str()),
    )?;
    Ok(())
}

/// Unmounts `target`; a busy mount is detached instead (it goes away once
/// its last user does). Not being mounted is success.
pub(crate) fn unmount(target: &Path) -> io::Result<()> {
    match rustix::mount::unmount(target, UnmountFlags::NOFOLLOW) {
        Ok(()) | Err(Errno::INVAL) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::BUSY) => {
            tracing::debug!(path = %target.display(), "mount busy: detaching");
            match rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
                Ok(()) | Err(Errno::INVAL) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Mount points at or under `dir`, deepest first (from /proc/self/mountinfo).
pub(crate) fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let info = std::fs::read("/proc/self/mountinfo")?;
    let dir = dir.as_os_str().as_bytes();
    let mut found: Vec<PathBuf> = info
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|mp| {
            mp.as_slice() == dir || (mp.starts_with(dir) && mp.get(dir.len()) == Some(&b'/'))
        })
        .map(|mp| {
            PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(mp))
        })
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    Ok(found)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\'
            && i + 4 <= raw.len()
            && raw[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (raw[i + 1] - b'0') * 64 + (raw[i + 2] - b'0') * 8 + (raw[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(br"/a\040b"), b"/a b");
        assert_eq!(unescape_mountinfo(br"/a\134"), b"/a\\");
        assert_eq!(unescape_mountinfo(b"/plain"), b"/plain");
    }

    #[test]
    fn options_list_top_layer_first() {
        let d = overlay_data(&[b"/top".to_vec(), b"/bottom".to_vec()], b"u", b"w");
        assert_eq!(d, b"lowerdir=/top:/bottom,upperdir=u,workdir=w,userxattr");
    }

    #[test]
    fn separators_are_not_plain() {
        assert!(is_plain(b"/cache/layers/sha256/abc"));
        assert!(!is_plain(b"/a:b"));
        assert!(!is_plain(b"/a,b"));
        assert!(!is_plain(b"/a\\b"));
    }
}
