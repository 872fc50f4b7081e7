//! Property tests of the layer extractor (proptest, stable Rust): layers
//! of arbitrary entries (files, dirs, symlinks, hardlinks, FIFOs, devices,
//! whiteouts, opaque markers) with paths and link targets made of `..`,
//! `.`, empty and absolute components, then the same tars with bytes
//! mutated or cut off, extracted in both whiteout modes, with and without
//! openat2, on top of a lower layer holding symlinks that point outside.
//! Whatever the layer, the extractor never panics, never changes anything
//! outside its destination, never links to a file outside it, and never
//! unpacks more than its budget. `cargo test` runs a few hundred cases;
//! `scripts/fuzz.sh` runs many more (`PROPTEST_CASES`).
mod support;

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use proptest::prelude::*;
use support::layer::raw_entry;
use tar::EntryType;
use xfn::image::extract::{
    extract_layer_bounded, Budget, ExtractOptions, LayerBounds, WhiteoutMode,
};

/// Bytes a case may unpack: small, so the bound is hit often.
const BUDGET: u64 = 4096;
/// Entries a layer may hold: fewer than the longest layers generated.
const MAX_ENTRIES: u64 = 10;

/// A path of 1–4 components, the hostile ones often, sometimes absolute.
fn path() -> impl Strategy<Value = String> {
    let component = prop_oneof![
        4 => prop::sample::select(vec!["a", "b", "c", "lower", "escape", "up"]),
        2 => Just(".."),
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
        prop::collection::vec(any::<u8>(), 0..1500),
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
    prop::collection::vec(one_entry(), 0..15).prop_map(|entries| {
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
/// root itself included), to compare before and after.
fn tree(root: &Path) -> BTreeMap<String, (u32, u64, Vec<u8>, String)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let md = std::fs::symlink_metadata(&path).unwrap();
        let content = if md.is_file() {
            std::fs::read(&path).unwrap()
        } else {
            Vec::new()
        };
        let link = std::fs::read_link(&path)
            .map(|l| l.display().to_string())
            .unwrap_or_default();
        if md.is_dir() {
            for e in std::fs::read_dir(&path).unwrap() {
                stack.push(e.unwrap().path());
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
    };
    // Ok or a refusal: both are fine; a panic fails the case.
    let _ = extract_layer_bounded(tar, &dest, mode, options, &budget);
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

proptest! {
    #![proptest_config(support::fuzz::config(128))]

    #[test]
    fn arbitrary_layers_stay_inside_and_within_bounds(tar in layer(), (mode, openat2) in modes()) {
        extract_checked(&tar, mode, openat2)?;
    }

    #[test]
    fn mutated_layers_stay_inside_and_within_bounds(tar in mutated_layer(), (mode, openat2) in modes()) {
        extract_checked(&tar, mode, openat2)?;
    }

    #[test]
    fn random_bytes_never_panic_the_extractor(bytes in prop::collection::vec(any::<u8>(), 0..4096), (mode, openat2) in modes()) {
        extract_checked(&bytes, mode, openat2)?;
    }
}
