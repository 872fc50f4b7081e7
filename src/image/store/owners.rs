//! Who owns the files of extracted layers, recorded in the cache so that
//! every extraction into it and every run over it agree.
//!
//! Where xfn's namespace keeps its own id 0 apart from its functions'
//! (`sandbox::userns`: a privileged range or subordinate ids), image uid
//! and gid `n` are xfn's ids `n + 1`, and each run maps container `n` back
//! onto them: the *shift* is 1. On xfn's one id it is 0 (ownership is not
//! kept: every file is xfn's). `<cache>/owners` holds the shift the layers
//! were extracted with (absent: 0, as every cache before it was).
//!
//! Choice: **a cache filled under another shift is set aside, not
//! re-owned.** Its layers name owners a run of this namespace would not
//! map (a function would see its files as `nobody` and could not write its
//! own home); chowning every file of every layer would cost what the pulls
//! did, and may not be possible (ids of the other layout can be unmapped
//! here). So `refs/`, `layers/` and `rootfs/` move aside and are removed
//! where this namespace can; images are then pulled again. A cache is
//! switched only when the deployment changes (subordinate ids given or
//! taken, xfn run as another user), never between two runs of one setup.
use std::path::Path;

use super::layout::{self, LAYERS, REFS, ROOTFS, ROOT_SEARCHABLE};
use super::{io_err, ImageError};

/// The record's file name under the cache root.
const OWNERS: &str = "owners";

/// The shift the layers of the cache at `root` are extracted with.
pub(super) fn shift_of(root: &Path) -> u32 {
    std::fs::read_to_string(root.join(OWNERS))
        .ok()
        .and_then(|text| parse(&text))
        .unwrap_or(0)
}

fn parse(text: &str) -> Option<u32> {
    text.trim().strip_prefix("image-ids-from ")?.parse().ok()
}

/// Makes the cache at `root` (created when absent) hold layers extracted
/// with `shift`: records it, setting aside what was extracted with another.
/// Called once the namespace is entered, before the store is opened.
pub(crate) fn settle(root: &Path, shift: u32) -> Result<(), ImageError> {
    layout::create_private_dirs(root)?;
    collect_set_aside(root);
    let was = shift_of(root);
    if was != shift {
        set_aside(root, was, shift);
    }
    searchable_by_functions(root, shift)?;
    if was == shift {
        // Never rewritten in place: another xfn starting on the cache
        // could read it half written and set the layers aside.
        return Ok(());
    }
    let record = root.join(OWNERS);
    if shift == 0 {
        return match std::fs::remove_file(&record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&record)(e)),
            _ => Ok(()),
        };
    }
    // Whole or absent: written aside, renamed into place.
    let temp = root.join(format!("{OWNERS}.{}", std::process::id()));
    std::fs::write(&temp, format!("image-ids-from {shift}\n")).map_err(io_err(&temp))?;
    std::fs::rename(&temp, &record).map_err(io_err(&record))
}

/// With a shift, gives the root's group to the functions' root gid and
/// lets it search ([`ROOT_SEARCHABLE`]); without, makes it private again.
fn searchable_by_functions(root: &Path, shift: u32) -> Result<(), ImageError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(root).map_err(io_err(root))?;
    let mode = meta.permissions().mode() & 0o7777;
    let want = match (shift, mode) {
        (0, ROOT_SEARCHABLE) => layout::PRIVATE,
        (0, _) => return Ok(()),
        // Anyone may search it (a volume root's left as it is: layout).
        (_, mode) if mode & 0o001 != 0 => return Ok(()),
        _ => ROOT_SEARCHABLE,
    };
    if shift > 0 && meta.gid() != shift {
        std::os::unix::fs::chown(root, None, Some(shift)).map_err(io_err(root))?;
    }
    if mode != want {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(want))
            .map_err(io_err(root))?;
    }
    Ok(())
}

/// Moves the entries of another shift out of the store's way and removes
/// them where it can; what it cannot remove is left, named, with a warning.
fn set_aside(root: &Path, was: u32, shift: u32) {
    let has_layers = std::fs::read_dir(root.join(LAYERS)).is_ok_and(|mut d| d.next().is_some());
    if !has_layers {
        return;
    }
    // A name of its own: one left from an earlier switch (not removable
    // then) must not make this rename fail and leave the layers in place.
    let aside = root.join(format!("owners-{was}.{}.{}", std::process::id(), SET_ASIDE));
    for dir in [REFS, LAYERS, ROOTFS] {
        let (from, to) = (root.join(dir), aside.join(dir));
        if let Err(err) = std::fs::create_dir_all(&aside).and_then(|()| std::fs::rename(&from, &to))
        {
            tracing::warn!(dir = %from.display(), "cannot set aside: {err}");
        }
    }
    match std::fs::remove_dir_all(&aside) {
        Ok(()) => tracing::warn!(
            cache = %root.display(),
            was, now = shift,
            "the cache's layers were extracted for another id layout (functions under xfn's own uid or not): removed; images are pulled again"
        ),
        Err(err) => tracing::warn!(
            cache = %root.display(),
            left = %aside.display(),
            was, now = shift,
            "the cache's layers were extracted for another id layout: set aside, images are pulled again; cannot remove them from here ({err}): remove {} as root",
            aside.display()
        ),
    }
    // The store's dirs again, empty.
    if let Err(err) = layout::create_private_dirs(root) {
        tracing::warn!(cache = %root.display(), "{err}");
    }
}

/// How the names of set-aside entries end.
const SET_ASIDE: &str = "set-aside";

/// Removes what earlier switches set aside and could not remove then
/// (owned by ids that namespace did not map, which this one may): a cache
/// switched back and forth would otherwise keep a copy of its layers per
/// switch. What still cannot be removed stays, with a warning.
fn collect_set_aside(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("owners-") && name.ends_with(SET_ASIDE)) {
            continue;
        }
        // Never through a symlink: only a directory of the cache's own.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Err(err) = std::fs::remove_dir_all(entry.path()) {
            tracing::warn!(left = %entry.path().display(), "cannot remove layers set aside earlier ({err}): remove them as root");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_records_its_shift_and_sets_aside_layers_of_another() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        settle(&root, 0).unwrap();
        assert_eq!(shift_of(&root), 0);
        std::fs::create_dir_all(root.join("layers/abc")).unwrap();
        std::fs::write(root.join("refs/r"), "{}").unwrap();
        std::fs::write(root.join("blobs/sha256/b"), "kept").unwrap();
        settle(&root, 0).unwrap();
        assert!(root.join("layers/abc").exists(), "same shift: kept");
        settle(&root, 1).unwrap();
        assert_eq!(shift_of(&root), 1);
        assert!(!root.join("layers/abc").exists() && !root.join("refs/r").exists());
        assert!(root.join("layers").is_dir() && root.join("refs").is_dir());
        assert!(root.join("blobs/sha256/b").exists(), "blobs are not owned");
        assert!(!root.join("owners-0.set-aside").exists());
        settle(&root, 0).unwrap();
        assert_eq!(shift_of(&root), 0);
        assert!(!root.join("owners").exists());
    }

    #[test]
    fn layers_set_aside_and_left_by_earlier_switches_are_collected() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        settle(&root, 0).unwrap();
        // Left by switches whose namespaces could not remove them, the
        // second under the name an older xfn gave every set-aside of shift 0.
        for left in ["owners-1.set-aside", "owners-0.set-aside"] {
            std::fs::create_dir_all(root.join(left).join("layers/old")).unwrap();
            std::fs::write(root.join(left).join("layers/old/f"), "x").unwrap();
        }
        std::fs::create_dir_all(root.join("layers/abc")).unwrap();
        settle(&root, 1).unwrap();
        let left: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("owners-"))
            .collect();
        assert_eq!(left, Vec::<String>::new());
        assert!(
            !root.join("layers/abc").exists(),
            "set aside for the new shift"
        );
        // Collected at a start with no switch too; a symlink is not followed.
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("owners-9.set-aside")).unwrap();
        std::fs::create_dir_all(root.join("owners-2.set-aside/refs")).unwrap();
        settle(&root, 1).unwrap();
        assert!(!root.join("owners-2.set-aside").exists());
        assert!(outside.is_dir());
    }

    #[test]
    fn an_unreadable_record_reads_as_no_shift() {
        assert_eq!(parse("image-ids-from 1\n"), Some(1));
        assert_eq!(parse("garbage"), None);
    }
}
