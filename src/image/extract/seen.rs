//! The record of what the layer being extracted has put at which path.
//!
//! Paths are keyed by a chained 128-bit hash of their components (two
//! SipHash instances with per-process random keys), not by their bytes: a
//! layer of deep paths would otherwise make the record grow with the square
//! of the depth (every prefix stored in full). Computing a prefix's key from
//! its parent's keeps marking every directory on an entry's way linear in the
//! path's length. A collision (a 2^-128 chance, not steerable by a layer
//! without the random keys) could only misclassify a path as this layer's or
//! not; every filesystem operation stays confined to the destination anyway.
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

/// What this layer has at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A directory of this layer (an entry, or a parent on an entry's way).
    Dir,
    /// A non-directory entry of this layer.
    NonDir,
    /// A whiteout of this layer: in Overlay mode a 0:0 char device is there;
    /// in Flatten mode the lower path was deleted.
    Whiteout,
}

/// The key of a normalised path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PathKey(u64, u64);

/// The layer root's key.
pub(crate) const ROOT: PathKey = PathKey(0, 0);

/// Paths this layer has put, with what is there.
pub(crate) struct Seen {
    map: HashMap<PathKey, Origin>,
    k1: RandomState,
    k2: RandomState,
}

impl Seen {
    /// An empty record.
    pub(crate) fn new() -> Self {
        Self {
            map: HashMap::new(),
            k1: RandomState::new(),
            k2: RandomState::new(),
        }
    }

    /// The key of `name` inside the directory keyed `parent`.
    pub(crate) fn child(&self, parent: PathKey, name: &[u8]) -> PathKey {
        let mut a = self.k1.build_hasher();
        parent.0.hash(&mut a);
        name.hash(&mut a);
        let mut b = self.k2.build_hasher();
        parent.1.hash(&mut b);
        name.hash(&mut b);
        PathKey(a.finish(), b.finish())
    }

    /// The key of a normalised path (`a/b/c`; empty for the root).
    pub(crate) fn key(&self, rel: &[u8]) -> PathKey {
        components(rel).fold(ROOT, |k, c| self.child(k, c))
    }

    /// What this layer has at `key`.
    pub(crate) fn get(&self, key: PathKey) -> Option<Origin> {
        self.map.get(&key).copied()
    }

    /// Records what is at `key`.
    pub(crate) fn insert(&mut self, key: PathKey, origin: Origin) {
        self.map.insert(key, origin);
    }

    /// Records every directory on the way to and including `rel` as this
    /// layer's, where nothing is recorded yet.
    pub(crate) fn mark_dirs(&mut self, rel: &[u8]) {
        let mut key = ROOT;
        for comp in components(rel) {
            key = self.child(key, comp);
            self.map.entry(key).or_insert(Origin::Dir);
        }
    }
}

/// The components of a normalised path.
pub(crate) fn components(rel: &[u8]) -> impl Iterator<Item = &[u8]> {
    rel.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_by_component() {
        let s = Seen::new();
        assert_eq!(s.key(b""), ROOT);
        let ab = s.key(b"a/b");
        assert_eq!(ab, s.child(s.key(b"a"), b"b"));
        assert_ne!(ab, s.key(b"ab"));
        assert_ne!(s.key(b"a/bc"), s.key(b"ab/c"));
        assert_ne!(s.key(b"a"), ROOT);
    }

    #[test]
    fn marks_every_directory_on_the_way() {
        let mut s = Seen::new();
        s.insert(s.key(b"a/b"), Origin::NonDir);
        s.mark_dirs(b"a/b/c");
        assert_eq!(s.get(s.key(b"a")), Some(Origin::Dir));
        assert_eq!(s.get(s.key(b"a/b")), Some(Origin::NonDir), "kept");
        assert_eq!(s.get(s.key(b"a/b/c")), Some(Origin::Dir));
        assert_eq!(s.get(s.key(b"x")), None);
    }
}
