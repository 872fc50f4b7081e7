//! xfn's test kit, the part that knows nothing of xfn: deterministic layer
//! tarballs ([`layer::Layer`]) in OCI or Docker media types
//! ([`format::Format`]), directory-tree snapshots to compare ([`tree`]),
//! and re-running one test as an unprivileged user or in a namespace of its
//! own ([`reexec`]).
//!
//! Why a crate: both xfn's unit tests (`src/`) and its integration tests
//! (`tests/support`, which re-exports these modules) build layers and
//! snapshot trees. A dev-dependency gives both the same code without the
//! library pulling test files in by path; nothing of it reaches the `xfn`
//! binary.
pub mod format;
pub mod layer;
pub mod reexec;
pub mod tree;

pub use layer::Layer;
