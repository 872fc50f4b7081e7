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
//! `xfn start`, `xfn render`, `xfn adapt`) calls: `sandbox` is private to
//! the crate, and what front ends need of it and of `rootfs` (the namespace
//! entry, defaults, usage and version types) the runner re-exports. The two
//! gRPC front ends, [`server`] (`xfn start`) and [`adaptor`] (`xfn adapt`),
//! are thin services over one [`serving`] layer (listen, admission,
//! deadlines, drain, metrics, status mapping).
pub mod adaptor;
pub mod compose;
pub mod duration;
pub mod fork_lock;
pub mod image;
pub mod instance;
pub mod pid1;
pub mod pidns;
pub mod proto;
pub mod quantity;
pub mod resident;
pub mod rootfs;
pub mod runner;
pub(crate) mod sandbox;
pub mod server;
pub mod serving;
