//! xfn: a rootless OCI container function runner for Crossplane Composition
//! Functions.
//!
//! The engine, as data flows through it:
//!
//! ```text
//! request ─► image (reference, auth, pull, content-addressed store, layer extraction)
//!         ─► rootfs (overlay of cached layer dirs, or a per-run copy)
//!         ─► sandbox (user namespace, OCI spec, crun)
//!         ─► output or a typed error
//! ```
//!
//! [`runner::Runner`] is the one entry point every front end (`xfn run`,
//! `xfn start`, `xfn render`, `xfn adapt`) calls: `rootfs` and `sandbox`
//! are private to the crate, and what front ends need of them (the
//! namespace entry, the rootfs mode, defaults, usage and version types) the
//! runner re-exports. The two
//! gRPC front ends, [`server`] (`xfn start`) and [`adaptor`] (`xfn adapt`),
//! are thin services over one [`serving`] layer (listen, admission,
//! deadlines, drain, metrics, status mapping). Every YAML or JSON input
//! they parse is first bounded in depth by [`nesting`].
pub mod adaptor;
pub mod compose;
pub mod duration;
pub mod fork_lock;
pub mod image;
pub mod instance;
pub mod nesting;
pub mod pid1;
pub mod pidns;
pub mod proto;
pub mod quantity;
pub mod resident;
pub(crate) mod rootfs;
pub mod runner;
pub(crate) mod sandbox;
pub mod server;
pub mod serving;

/// The parts of the integration tests' kit (`tests/support`) the crate's
/// own tests use too (layer tarballs, tree snapshots, re-running a test as
/// uid 65532 or in a mount namespace): the same files, included by path.
#[cfg(test)]
#[path = "../tests/support"]
#[allow(dead_code)]
mod support {
    pub mod format;
    pub mod layer;
    pub mod reexec;
    pub mod tree;

    pub use layer::Layer;
}
