//! xfn: a rootless OCI container function runner for Crossplane Composition
//! Functions.
//!
//! [`runner::Runner`] is the one entry point every front end (`xfn run`,
//! `xfn start`, `xfn render`, `xfn adapt`) calls. The front ends, and the
//! command line over them, are the crate's own; so are `rootfs`, `sandbox`
//! and the gRPC layer the two gRPC daemons share.
//!
//! The public API is what an embedding program or xfn's integration tests
//! need, and no more:
//! - [`runner`]: enter the namespace ([`runner::enter_namespace`], before
//!   any thread starts), build a [`runner::Runner`], run a function once,
//!   keep a warm pool, or serve a long-lived function container;
//! - [`image`]: the image store (pull under a policy, list, collect) and
//!   layer extraction;
//! - [`Daemon`]: `xfn start`'s daemon (metrics, calls, the cache budget,
//!   drain) over a runner;
//! - [`chain`]: an error and its causes as one message (the library's errors
//!   say their own step only and hold the cause beneath as a source);
//! - [`pidns`], [`quantity`], [`proto`]: the PID namespace entry, Kubernetes
//!   quantities, the generated protocol types;
//! - [`cli_main`]: the whole `xfn` command line (the binary is one call).
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/lib.rs`.
#![deny(missing_docs)]
#![deny(unreachable_pub)]

// The public surface: what an embedding program and xfn's integration tests
// use. Everything else is the crate's own (`mod`, not `pub mod`): an item in
// it is `pub(crate)` or narrower unless the public API reaches it (a
// re-export in `runner`, a type in a public signature), so `pub` says
// public, and the compiler tells us when nothing uses an item.
pub mod chain;
pub mod image;
pub mod pidns;
pub mod proto;
pub mod quantity;
pub mod runner;
pub use grpc::daemon::{Daemon, DaemonError, DaemonOptions};

mod adaptor;
mod calendar;
mod call;
mod cli;
mod compose;
mod duration;
mod echo;
mod fork_lock;
mod function_server;
mod grpc;
mod host;
mod instance;
mod lifecycle;
mod nesting;
mod pem;
mod pid1;
mod proto_json;
mod resident;
mod rootfs;
mod sandbox;
mod schema;
mod sidecar;
mod suite;
mod value;

/// The `xfn` command line, the binary's whole `main`: as PID 1, fork an
/// init; parse flags; enter the user namespace while still single-threaded;
/// start the async runtime and dispatch the subcommand.
pub fn cli_main() -> std::process::ExitCode {
    cli::main()
}

/// The test kit the unit tests share with the integration tests.
#[cfg(test)]
use xfn_testkit as support;
