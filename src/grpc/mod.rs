//! The gRPC layer under the three daemons: `xfn start` ([`crate::sidecar`],
//! Crossplane's alpha `ContainerizedFunctionRunnerService` on an abstract
//! socket behind the gatekeeper), `xfn adapt` ([`crate::adaptor`], the
//! v1/v1beta1 `FunctionRunnerService` on TCP) and `xfn host` (`src/host/`,
//! many v1 Functions on one port, routed by SNI). A front end brings its
//! service and its listener; everything between the socket and the
//! service is here, and what the call seam's layers (`src/call/`)
//! stand on between the service and the engine (admission, metrics,
//! status mapping).
//!
//! Why one layer: the three front ends face the same caller (Crossplane,
//! calling from many reconcilers at once, with deadlines, retrying every
//! error with backoff) in the same place (a pod that is SIGTERMed on every
//! rollout). A second copy of admission, draining or status mapping is a
//! second set of defaults to get wrong — the adaptor's own copy had an
//! unbounded queue and no drain.
//!
//! Invariants: a call waits for a run slot in arrival order, and is refused
//! (`RESOURCE_EXHAUSTED`) only at a queue cap or when its deadline cannot be
//! met; time queued counts against its deadline. Every admitted run ends
//! with the drain's grace period. Gauges are held by guards, so a dropped
//! call leaves them right. Errors become statuses in one place ([`status`]).
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/grpc/mod.rs`.
pub(crate) mod admission;
pub(crate) mod calls;
pub(crate) mod connections;
pub(crate) mod daemon;
pub(crate) mod deadline;
pub(crate) mod frame;
pub(crate) mod hpack;
pub(crate) mod http2;
pub(crate) mod listen;
pub(crate) mod metrics;
pub(crate) mod raw;
pub(crate) mod refusals;
pub(crate) mod route;
pub(crate) mod serve;
pub(crate) mod sni;
pub(crate) mod status;
pub(crate) mod threads;
pub(crate) mod wait;

pub(crate) use calls::{Calls, Subject};
pub(crate) use status::status_of;
