//! `xfn start`'s front end: the alpha runner service Crossplane's sidecar
//! protocol speaks, and who may call it. Admission, deadlines, draining,
//! metrics and status mapping are the gRPC layer's ([`crate::grpc`]).
//!
//! The pieces, in the order a call meets them:
//!
//! ```text
//! listen (grpc: unix abstract/path or tcp, bound before the user namespace)
//!   ─► gate (a process outside the namespace: accept, SO_PEERCRED uid policy, hand over)
//!   ─► service (validate ─► grpc::Calls: admission ─► FunctionRunner ─► status_of)
//! ```
pub(crate) mod gate;
pub(crate) mod peer;
pub(crate) mod service;
pub(crate) mod validate;

pub(crate) use service::{ServiceOptions, SidecarService};
