//! What is in the store, as `xfn cache ls` shows it. Disk is measured as
//! a collection measures it (`gc`: the allocated blocks of each entry an
//! image needs — manifest, config, unpacked layer dirs, kept blobs,
//! flattened rootfs), so what `ls` says an image holds alone is what `xfn
//! cache rm` of it frees, and the listing's total is what `gc` says the
//! cache takes once no garbage is left.
use std::collections::{HashMap, HashSet};

use super::entries::RefEntry;
use super::gc::{needed, size_of, Entry};
use super::{io_err, layout, ContentStore, ImageError};

/// An image in the cache, as `xfn cache ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedImage {
    /// The normalised reference.
    pub reference: String,
    /// The manifest digest.
    pub digest: String,
    /// Config plus compressed layer sizes, from the manifest: what a pull
    /// downloads.
    pub compressed_size: u64,
    /// Bytes on disk of every entry the image needs, those it shares with
    /// other images included.
    pub disk: u64,
    /// Bytes on disk of the entries no other reference needs: what
    /// removing this reference alone frees (two tags of one image share
    /// everything).
    pub unique_disk: u64,
    /// Whether every layer is extracted.
    pub complete: bool,
}

/// The images with a ref in the cache and the disk they take together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheListing {
    /// The images, sorted by reference.
    pub images: Vec<CachedImage>,
    /// Bytes on disk of every entry any of them needs, each once.
    pub disk: u64,
}

impl ContentStore {
    /// Every image with a ref in the cache, with what it holds on disk.
    pub fn list(&self) -> Result<CacheListing, ImageError> {
        let refs = self.root().join(layout::REFS);
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&refs).map_err(io_err(&refs))? {
            let entry = entry.map_err(io_err(&refs))?;
            let Ok(data) = std::fs::read(entry.path()) else {
                continue;
            };
            let Ok(r) = serde_json::from_slice::<RefEntry>(&data) else {
                continue;
            };
            let Some(manifest) = self.read_manifest(&r.digest)? else {
                continue;
            };
            let entries = needed(std::iter::once((&r.digest, Some(&manifest))));
            found.push((r, manifest, entries));
        }
        let sizes = self.entry_sizes();
        // How many references need each entry: one means it is theirs alone.
        let mut users: HashMap<&Entry, usize> = HashMap::new();
        for (_, _, entries) in &found {
            for entry in entries {
                *users.entry(entry).or_default() += 1;
            }
        }
        let all: HashSet<Entry> = users.keys().map(|e| (*e).clone()).collect();
        let disk = size_of(&all, &sizes);
        let mut images: Vec<CachedImage> = found
            .iter()
            .map(|(r, manifest, entries)| {
                let unique: HashSet<Entry> = entries
                    .iter()
                    .filter(|e| users.get(e) == Some(&1))
                    .cloned()
                    .collect();
                CachedImage {
                    reference: r.reference.clone(),
                    digest: r.digest.clone(),
                    compressed_size: manifest.config.size
                        + manifest.layers.iter().map(|l| l.size).sum::<u64>(),
                    disk: size_of(entries, &sizes),
                    unique_disk: size_of(&unique, &sizes),
                    complete: manifest
                        .layers
                        .iter()
                        .all(|l| self.layer_dir(&l.digest).is_ok_and(|d| d.is_dir())),
                }
            })
            .collect();
        images.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(CacheListing { images, disk })
    }
}
