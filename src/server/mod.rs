//! gRPC servers: the alpha runner service Crossplane's sidecar protocol
//! speaks (`xfn start`), with its admission control, caller checks, health,
//! reflection and Prometheus metrics.
//!
//! The pieces, in the order a call meets them:
//!
//! ```text
//! listen (unix abstract/path or tcp) ─► peer (SO_PEERCRED uid policy, at accept)
//!   ─► service (validate ─► admission queue ─► FunctionRunner ─► status_of)
//! ```
pub mod admission;
pub mod deadline;
pub mod function_runner;
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
