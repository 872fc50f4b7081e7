//! What is in the store, as `xfn cache ls` shows it.
use super::entries::RefEntry;
use super::{io_err, layout, ImageError, Store};

/// An image in the cache, as `xfn cache ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedImage {
    /// The normalised reference.
    pub reference: String,
    /// The manifest digest.
    pub digest: String,
    /// Config plus compressed layer sizes, from the manifest.
    pub size: u64,
    /// Whether every layer is extracted.
    pub complete: bool,
}

impl Store {
    /// Every image with a ref in the cache, sorted by reference.
    pub fn list(&self) -> Result<Vec<CachedImage>, ImageError> {
        let refs = self.root().join(layout::REFS);
        let mut out = Vec::new();
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
            let size = manifest.config.size + manifest.layers.iter().map(|l| l.size).sum::<u64>();
            let complete = manifest
                .layers
                .iter()
                .all(|l| self.layer_dir(&l.digest).is_ok_and(|d| d.is_dir()));
            out.push(CachedImage {
                reference: r.reference,
                digest: r.digest,
                size,
                complete,
            });
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }
}
