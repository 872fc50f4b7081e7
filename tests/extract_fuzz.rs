//! Property tests of the layer extractor (proptest, stable Rust): layers
//! of arbitrary entries (files, dirs, symlinks, hardlinks, FIFOs, devices,
//! whiteouts, opaque markers) with paths and link targets made of `..`,
//! `.`, empty and absolute components, then the same tars with bytes
//! mutated or cut off, extracted in both whiteout modes, with and without
//! openat2, on top of a lower layer holding symlinks that point outside.
//! Whatever the layer, the extractor never panics, never changes anything
//! outside its destination, never links to a file outside it, never
//! unpacks more than its budget, and never takes more entries than its
//! bound. Each property runs unprivileged over a tmpfs of its own (see
//! [`sandboxed`]), so that a broken extractor breaks only the test. `cargo test` runs a few hundred cases;
//! `scripts/fuzz.sh` runs many more (`PROPTEST_CASES`).

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use proptest::prelude::*;
use tar::EntryType;
use xfn::image::extract::{
    extract_layer_bounded, Budget, ExtractOptions, LayerBounds, WhiteoutMode,
};
use xfn_testkit::layer::raw_entry;

/// Bytes a case may unpack: small, so the bound is hit often.
const BUDGET: u64 = 4096;
/// Entries a layer may hold: fewer than the longest layers generated, and
/// than the budget holds (it counts the tar's bytes: 8 headers of 512
/// bytes), or the budget would always refuse a layer first and a missing
/// entry bound would go unseen.
const MAX_ENTRIES: u64 = 6;

/// A path of 1–4 components, hostile ones among them, sometimes absolute.
/// `..` is one component in 16: at 2 in 9 it ended most layers (57% of
/// them, refused at their first climbing path) before anything else in
/// them was tried.
fn path() -> impl Strategy<Value = String> {
    let component = prop_oneof![
        12 => prop::sample::select(vec!["a", "b", "c", "lower", "escape", "up"]),
        1 => Just(".."),
        1 => Just("."),
        1 => Just(""),
        1 => prop::sample::select(vec![".wh.a", ".wh.b", ".wh..wh..opq", ".wh.escape", ".wh..."]),
    ];
    (any::<bool>(), prop::collection::vec(component, 1..5)).prop_map(|(absolute, parts)| {
        let joined = parts.join("/");
        let path = if absolute {
            format!("/{joined}")
        } else {
            joined
        };
        path.chars().take(100).collect()
    })
}

/// One entry's tar bytes.
fn one_entry() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop::sample::select(vec![
        EntryType::Regular,
        EntryType::Regular,
        EntryType::Directory,
        EntryType::Symlink,
        EntryType::Link,
        EntryType::Fifo,
        EntryType::Char,
        EntryType::Block,
        EntryType::Continuous,
        EntryType::new(b'Z'),
    ]);
    (
        kind,
        path(),
        path(),
        prop_oneof![Just(0o644u32), Just(0o755), Just(0o4755), any::<u32>()],
        prop_oneof![
            3 => prop::collection::vec(any::<u8>(), 0..64),
            1 => prop::collection::vec(any::<u8>(), 0..1500),
        ],
    )
        .prop_map(|(kind, name, link, mode, data)| {
            let data = if kind == EntryType::Regular || kind == EntryType::Continuous {
                data
            } else {
                Vec::new()
            };
            raw_entry(
                kind,
                &name,
                &link,
                mode & 0o7777,
                (0, 0),
                1_600_000_000,
                &data,
            )
        })
}

/// A whole layer: up to 14 entries and the end-of-archive marker.
fn layer() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(one_entry(), 0..24).prop_map(|entries| {
        let mut tar = entries.concat();
        tar.extend_from_slice(&[0; 1024]);
        tar
    })
}

/// An entry that extracts: an empty file, a dir, a symlink (to anything:
/// targets are stored as given) or a FIFO named one of 16 names at the
/// root (so no parent is ever a file), a later one replacing an earlier.
/// Empty, so that only headers count against the byte budget (8 of them
/// fill it) and the entry bound is what stops the layer.
fn plain_entry() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![
            EntryType::Regular,
            EntryType::Directory,
            EntryType::Symlink,
            EntryType::Fifo,
        ]),
        "[a-p]",
        path(),
    )
        .prop_map(|(kind, name, link)| {
            raw_entry(kind, &name, &link, 0o644, (0, 0), 1_600_000_000, &[])
        })
}

/// A layer longer than the entry bound allows: mostly entries that
/// extract, an arbitrary one now and then. Arbitrary layers rarely get
/// this far (one entry in a few is refused, and the first refusal ends a
/// layer).
fn long_layer() -> impl Strategy<Value = Vec<u8>> {
    let entry = prop_oneof![8 => plain_entry(), 1 => one_entry()];
    prop::collection::vec(entry, MAX_ENTRIES as usize + 1..16).prop_map(|entries| {
        let mut tar = entries.concat();
        tar.extend_from_slice(&[0; 1024]);
        tar
    })
}

/// A layer with some bytes overwritten and perhaps cut short.
fn mutated_layer() -> impl Strategy<Value = Vec<u8>> {
    (
        layer(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        proptest::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(mut tar, flips, cut)| {
            for (at, byte) in flips {
                let i = at.index(tar.len());
                tar[i] = byte;
            }
            if let Some(cut) = cut {
                tar.truncate(cut.index(tar.len() + 1));
            }
            tar
        })
}

/// File type, size, content and mode of every path below `root` (the
/// root itself included), to compare before and after; a path gone
/// (the root, or a dir emptied while it was read) reads as mode 0.
fn tree(root: &Path) -> BTreeMap<String, (u32, u64, Vec<u8>, String)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            out.insert(
                path.display().to_string(),
                (0, 0, Vec::new(), String::new()),
            );
            continue;
        };
        let content = if md.is_file() {
            std::fs::read(&path).unwrap_or_default()
        } else {
            Vec::new()
        };
        let link = std::fs::read_link(&path)
            .map(|l| l.display().to_string())
            .unwrap_or_default();
        if md.is_dir() {
            for e in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        }
        out.insert(
            path.display().to_string(),
            (md.mode(), md.len(), content, link),
        );
    }
    out
}

/// Inodes of the regular files below `root` and their total size, each
/// inode once.
fn files(root: &Path) -> (HashSet<u64>, u64) {
    let mut inodes = HashSet::new();
    let mut bytes = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if md.is_dir() {
            for e in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        } else if md.is_file() && inodes.insert(md.ino()) {
            bytes += md.len();
        }
    }
    (inodes, bytes)
}

/// Extracts `tar` into `root/dest`, which (for Flatten, as a lower layer
/// would) already holds symlinks out of it, next to `root/outside`, and
/// checks the properties.
fn extract_checked(tar: &[u8], mode: WhiteoutMode, use_openat2: bool) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("dir")).unwrap();
    std::fs::write(outside.join("a"), b"precious").unwrap();
    std::fs::write(outside.join("dir/b"), b"precious").unwrap();
    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    if mode == WhiteoutMode::Flatten {
        std::os::unix::fs::symlink(&outside, dest.join("escape")).unwrap();
        std::os::unix::fs::symlink("..", dest.join("up")).unwrap();
        std::fs::create_dir(dest.join("lower")).unwrap();
        std::os::unix::fs::symlink("../../outside/a", dest.join("lower/a")).unwrap();
    }
    let before = tree(&outside);
    let (outside_inodes, _) = files(&outside);
    let budget = Budget::new(BUDGET);
    let options = ExtractOptions {
        bounds: LayerBounds {
            max_entries: MAX_ENTRIES,
            ..LayerBounds::default()
        },
        use_openat2,
        owner_shift: 0,
    };
    // Ok or a refusal: both are fine; a panic fails the case. A layer
    // taken whole held no more entries than the bound.
    if let Ok(stats) = extract_layer_bounded(tar, &dest, mode, options, &budget) {
        prop_assert!(
            stats.entries + stats.skipped <= MAX_ENTRIES,
            "{} entries taken, bound {}",
            stats.entries + stats.skipped,
            MAX_ENTRIES
        );
    }
    prop_assert_eq!(tree(&outside), before, "something outside changed");
    let (inodes, bytes) = files(&dest);
    prop_assert!(
        inodes.is_disjoint(&outside_inodes),
        "a file in the destination is linked to one outside"
    );
    prop_assert!(
        bytes <= BUDGET,
        "{} bytes unpacked, budget {}",
        bytes,
        BUDGET
    );
    Ok(())
}

fn modes() -> impl Strategy<Value = (WhiteoutMode, bool)> {
    (
        prop::sample::select(vec![WhiteoutMode::Overlay, WhiteoutMode::Flatten]),
        any::<bool>(),
    )
}

/// Runs the property `name`: every tar of `tars`, in either whiteout mode,
/// with or without openat2, passes [`extract_checked`]. Re-executed as uid
/// 65532 without capabilities in a user and mount namespace of its own
/// (`xfn_testkit::reexec`), over a fresh tmpfs on /tmp where its temp dirs go.
/// The properties hold only while the extractor is right, and a regression
/// that lets an entry climb out of its destination deletes and writes
/// outside it: as root in the host's /tmp that is every other process's
/// scratch files (a planted `..` bug, run that way, emptied the development
/// machine's /tmp). Here it reaches only the tmpfs, and beyond it only
/// what uid 65532 may change.
fn sandboxed(name: &str, tars: impl Strategy<Value = Vec<u8>>) {
    if !xfn_testkit::reexec::in_unprivileged_child() {
        return xfn_testkit::reexec::run_unprivileged(&format!("extract_fuzz::{name}"));
    }
    nix::mount::mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        None::<&str>,
    )
    .expect("a tmpfs on /tmp in the test's own mount namespace");
    let mut runner = proptest::test_runner::TestRunner::new(xfn_testkit::fuzz::config(128));
    if let Err(failure) = runner.run(&(tars, modes()), |(tar, (mode, openat2))| {
        extract_checked(&tar, mode, openat2)
    }) {
        panic!("{failure}");
    }
}

#[test]
fn arbitrary_layers_stay_inside_and_within_bounds() {
    sandboxed("arbitrary_layers_stay_inside_and_within_bounds", layer());
}

#[test]
fn long_layers_stop_at_the_entry_bound() {
    sandboxed("long_layers_stop_at_the_entry_bound", long_layer());
}

#[test]
fn mutated_layers_stay_inside_and_within_bounds() {
    sandboxed(
        "mutated_layers_stay_inside_and_within_bounds",
        mutated_layer(),
    );
}

#[test]
fn random_bytes_never_panic_the_extractor() {
    sandboxed(
        "random_bytes_never_panic_the_extractor",
        prop::collection::vec(any::<u8>(), 0..4096),
    );
}
