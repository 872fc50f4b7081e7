//! gRPC servers: the alpha runner service Crossplane's sidecar protocol
//! speaks (`xfn start`), with its admission control, caller checks, health,
//! reflection and Prometheus metrics.
//!
//! The pieces, in the order a call meets them:
//!
//! ```text
//! listen (unix abstract/path or tcp, bound before the user namespace)
//!   ─► gate (a process outside the namespace: accept, SO_PEERCRED uid policy, hand over)
//!   ─► service (validate ─► admission queue ─► FunctionRunner ─► status_of)
//! ```
pub mod admission;
pub mod deadline;
pub mod function_runner;
pub mod gate;
pub mod listen;
pub mod metrics;
pub mod peer;
pub mod serve;
pub mod service;
pub mod status;
pub mod validate;

pub use function_runner::FunctionRunner;
pub use service::{RunnerService, ServiceOptions};
pub use status::status_of;
