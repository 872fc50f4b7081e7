//! `xfn start`'s front end: the alpha runner service Crossplane's sidecar
//! protocol speaks, and who may call it. Admission, deadlines and metrics
//! are layers of the call seam ([`crate::call`]); draining and status
//! mapping the gRPC layer's ([`crate::grpc`]).
//!
//! The pieces, in the order a call meets them:
//!
//! ```text
//! listen (grpc: unix abstract/path or tcp, bound before the user namespace)
//!   ─► gate (a process outside the namespace: accept, SO_PEERCRED uid policy, hand over)
//!   ─► service (validate ─► its stack, crate::call: recorded ─► admitted ─► within the deadline ─► the engine)
//! ```
pub(crate) mod gate;
pub(crate) mod peer;
pub(crate) mod service;
pub(crate) mod validate;

pub(crate) use service::{ServiceOptions, SidecarService};
