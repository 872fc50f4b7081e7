//! Garbage collection: removing images (`xfn cache rm`), and evicting the
//! least recently used ones until the cache fits a budget (`xfn cache gc
//! --max-size`, the daemon's `--cache-max-size`).
//!
//! Rules:
//! - An *image* is a manifest digest and the refs naming it; its last use
//!   is the newest mtime of those refs (touched by each cached use, at
//!   most once a minute per process, and by each pull).
//! - What is kept: every entry an image with a ref or a pin needs (its
//!   manifest, config, layer dirs, kept blobs, flattened rootfs). Anything
//!   else is garbage, removed by every collection: a blob or layer goes only
//!   once no image left uses it.
//! - Eviction removes the refs of the least recently used image that no
//!   one pins, until what is kept fits the budget; a pinned image (a run, a
//!   pull, a warm container; see `pin`) is never evicted, so a budget
//!   below what is in use leaves the cache above it and says so.
//! - One collection at a time (`locks/gc.run`). Sizes are measured before
//!   the gate closes (published entries never change); under the exclusive
//!   gate the collection reads refs and pins, decides, and renames its
//!   victims into `tmp/` (named with its instance id, so a crash leaves
//!   them to the next sweep); it deletes them after the gate opens again.
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::fcntl::FlockArg;

use super::entries::RefEntry;
use super::layout::{self, COLLECTOR};
use super::{ContentStore, ImageError};
use crate::image::descriptor::Manifest;

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// References removed by name (`xfn cache rm`).
    pub removed: Vec<String>,
    /// Names given to remove that have no ref in the cache.
    pub missing: Vec<String>,
    /// References evicted for the budget, least recently used first.
    pub evicted: Vec<String>,
    /// Images in use (pinned by a run, a pull or a warm container), kept
    /// whatever the budget.
    pub kept_in_use: usize,
    /// When images in use keep the cache over the budget: those of them
    /// whose release would let it fit, least recently used first (manifest
    /// digests). A daemon drops its idle warm containers of these, so that
    /// only runs and pulls in flight hold the cache over its budget.
    pub over_budget_in_use: Vec<String>,
    /// Bytes on disk before and after (the store's entries; not `tmp/`, `run/`).
    pub bytes_before: u64,
    /// After.
    pub bytes_after: u64,
    /// Layer directories removed.
    pub layers_removed: usize,
}

impl GcReport {
    /// Bytes freed.
    pub fn freed(&self) -> u64 {
        self.bytes_before.saturating_sub(self.bytes_after)
    }
}

/// A kind of content-addressed entry, by its directory.
const KINDS: &[&str] = &[
    layout::MANIFESTS,
    layout::CONFIGS,
    layout::BLOBS,
    layout::LAYERS,
    layout::ROOTFS,
];

/// One entry on disk: its directory (one of [`KINDS`]) and hex name.
pub(super) type Entry = (&'static str, String);

/// A ref file, read.
struct Ref {
    path: PathBuf,
    key: String,
    digest: String,
    used: SystemTime,
}

impl ContentStore {
    /// Removes the refs named by the normalised references `keys`, then
    /// collects garbage (see the module's rules).
    pub fn remove_images(&self, keys: &[String]) -> Result<GcReport, ImageError> {
        self.collect_with(keys, None)
    }

    /// Collects garbage and, with `max_size`, evicts the least recently
    /// used images until the rest fits in it.
    pub fn collect(&self, max_size: Option<u64>) -> Result<GcReport, ImageError> {
        self.collect_with(&[], max_size)
    }

    fn collect_with(
        &self,
        remove: &[String],
        max_size: Option<u64>,
    ) -> Result<GcReport, ImageError> {
        let collector = self.root().join(COLLECTOR);
        let _one_at_a_time = super::pin::lock_file(&collector, FlockArg::LockExclusive)?;
        let sizes = self.entry_sizes();
        let mut report = GcReport {
            bytes_before: sizes.values().sum(),
            ..Default::default()
        };
        let mut victims = Vec::new();
        {
            let gate = self.gate(true)?;
            let mut refs = self.read_refs();
            for key in remove {
                let before = refs.len();
                refs.retain(|r| {
                    let named = &r.key == key;
                    if named {
                        let _ = std::fs::remove_file(&r.path);
                    }
                    !named
                });
                if refs.len() == before {
                    report.missing.push(key.clone());
                } else {
                    report.removed.push(key.clone());
                }
            }
            // Pinned images, with the manifest each pin recorded or the
            // store holds (a pull in progress publishes its manifest last).
            let pinned: HashMap<String, Option<Manifest>> = self
                .present(layout::PINS)
                .into_iter()
                .filter(|hex| self.is_pinned(hex, &gate))
                .map(|hex| {
                    let manifest = self.pinned_manifest(&hex);
                    (format!("sha256:{hex}"), manifest)
                })
                .collect();
            let mut kept: HashMap<String, Vec<Ref>> = HashMap::new();
            for r in refs {
                kept.entry(r.digest.clone()).or_default().push(r);
            }
            let mut manifests: HashMap<String, Option<Manifest>> = kept
                .keys()
                .map(|digest| (digest.clone(), self.read_manifest(digest).ok().flatten()))
                .collect();
            manifests.extend(pinned.iter().map(|(d, m)| (d.clone(), m.clone())));
            let live_of = |kept: &HashMap<String, Vec<Ref>>| {
                needed(
                    kept.keys()
                        .chain(pinned.keys())
                        .map(|digest| (digest, manifests.get(digest).and_then(Option::as_ref))),
                )
            };
            if let Some(max) = max_size {
                loop {
                    if size_of(&live_of(&kept), &sizes) <= max {
                        break;
                    }
                    let last_used = |refs: &Vec<Ref>| refs.iter().map(|r| r.used).max();
                    let oldest = kept
                        .iter()
                        .filter(|(digest, _)| !pinned.contains_key(*digest))
                        .min_by_key(|(_, refs)| last_used(refs))
                        .map(|(digest, _)| digest.clone());
                    let Some(oldest) = oldest else {
                        break;
                    };
                    for r in kept.remove(&oldest).unwrap_or_default() {
                        let _ = std::fs::remove_file(&r.path);
                        report.evicted.push(r.key);
                    }
                }
            }
            let live = live_of(&kept);
            report.bytes_after = size_of(&live, &sizes);
            if let Some(max) = max_size.filter(|max| report.bytes_after > *max) {
                // Released in this order, each pinned image would be
                // evicted next (every image not in use is gone by now):
                // the ones without a ref first (garbage once released),
                // then the least recently used.
                let last_used = |digest: &String| {
                    kept.get(digest)
                        .and_then(|refs| refs.iter().map(|r| r.used).max())
                };
                let mut holding: Vec<&String> = pinned.keys().collect();
                holding.sort_by_key(|digest| last_used(digest));
                let mut rest: HashSet<&String> = kept.keys().chain(pinned.keys()).collect();
                for digest in holding {
                    let size = size_of(
                        &needed(
                            rest.iter()
                                .map(|d| (*d, manifests.get(*d).and_then(Option::as_ref))),
                        ),
                        &sizes,
                    );
                    if size <= max {
                        break;
                    }
                    rest.remove(digest);
                    report.over_budget_in_use.push(digest.clone());
                }
            }
            report.kept_in_use = pinned.values().filter(|m| m.is_some()).count();
            for dir in KINDS {
                for hex in self.present(dir) {
                    let entry = (*dir, hex);
                    if live.contains(&entry) {
                        continue;
                    }
                    let path = self.root().join(entry.0).join(&entry.1);
                    // Named by kind too: a blob and its layer share a hex.
                    let kind = entry.0.replace('/', "-");
                    let aside = self.tmp_root().join(format!(
                        "{}{kind}-{}",
                        self.tmp_prefix("gc"),
                        entry.1
                    ));
                    if std::fs::rename(&path, &aside).is_ok() {
                        if entry.0 == layout::LAYERS {
                            report.layers_removed += 1;
                        }
                        victims.push(aside);
                    }
                }
            }
        }
        for victim in victims {
            remove_entry(&victim);
        }
        self.forget_sizes();
        Ok(report)
    }

    /// Every readable ref, with its last use.
    fn read_refs(&self) -> Vec<Ref> {
        let dir = self.root().join(layout::REFS);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let path = entry.path();
                let parsed: RefEntry = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
                let used = entry.metadata().and_then(|m| m.modified()).ok()?;
                Some(Ref {
                    path,
                    key: parsed.reference,
                    digest: parsed.digest,
                    used,
                })
            })
            .collect()
    }

    /// The hex names present in `dir` (others are not the store's).
    fn present(&self, dir: &str) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.root().join(dir)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect()
    }

    /// Disk usage of every entry present. Published entries never change,
    /// so a directory's size is measured once per process.
    pub(super) fn entry_sizes(&self) -> HashMap<Entry, u64> {
        let mut sizes = HashMap::new();
        let mut memo = self.sizes_memo();
        for dir in KINDS {
            for hex in self.present(dir) {
                let path = self.root().join(dir).join(&hex);
                let size = match memo.get(&path) {
                    Some(size) => *size,
                    None => {
                        let size = disk_usage(&path);
                        memo.insert(path, size);
                        size
                    }
                };
                sizes.insert((*dir, hex), size);
            }
        }
        sizes
    }

    /// Drops measured sizes of entries that are gone.
    fn forget_sizes(&self) {
        self.sizes_memo().retain(|path, _| path.exists());
    }
}

/// Every entry the images need, given as their manifest digest and, where
/// known, their manifest (without one only the image's own manifest and
/// flattened rootfs are known to be its).
pub(super) fn needed<'a>(
    images: impl Iterator<Item = (&'a String, Option<&'a Manifest>)>,
) -> HashSet<Entry> {
    let mut live = HashSet::new();
    for (digest, manifest) in images {
        let Some(hex) = digest.strip_prefix("sha256:") else {
            continue;
        };
        live.insert((layout::MANIFESTS, hex.to_string()));
        live.insert((layout::ROOTFS, hex.to_string()));
        let Some(manifest) = manifest else {
            continue;
        };
        if let Some(config) = manifest.config.digest.strip_prefix("sha256:") {
            live.insert((layout::CONFIGS, config.to_string()));
        }
        for layer in &manifest.layers {
            if let Some(hex) = layer.digest.strip_prefix("sha256:") {
                live.insert((layout::BLOBS, hex.to_string()));
                live.insert((layout::LAYERS, hex.to_string()));
            }
        }
    }
    live
}

/// Bytes on disk of the entries `live`, each once.
pub(super) fn size_of(live: &HashSet<Entry>, sizes: &HashMap<Entry, u64>) -> u64 {
    live.iter().filter_map(|entry| sizes.get(entry)).sum()
}

/// Bytes `path` takes on disk (allocated blocks; hard links once).
fn disk_usage(path: &Path) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Removes a file or a whole tree moved aside.
fn remove_entry(path: &Path) {
    if let Err(err) = super::publish::remove_file_or_tree(path) {
        tracing::warn!(path = %path.display(), "cannot remove a collected cache entry: {err}");
    }
}
